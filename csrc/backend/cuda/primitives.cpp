// CUDA eval_gpu of every primitive: shapes and arguments from the MLX arrays, the kernels from kernels/cuda.
#include "csrc/backend/cuda/launch.h"
#include "csrc/dequantize.h"
#include "csrc/quantize.h"
#include "csrc/rms_norm.h"
#include "csrc/rope.h"
#include "csrc/rope_qkv.h"
#include "kernels/common/ggml_blocks.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext {

namespace kc = ggml_ext::cuda;

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];  // row-contiguous: the op inserted the copies
  auto& enc = cuda::begin(stream(), inputs, out, &x);
  if (out.size() == 0) return;
  const bool weighted = inputs.size() > 1;
  const int64_t dim = x.shape(-1);
  const int64_t rows = x.size() / dim;
  const int64_t groups = weighted ? inputs[1].size() / dim : 1;
  kc::RmsNormArgs args{mx::gpu_ptr<void>(x), weighted ? mx::gpu_ptr<void>(inputs[1]) : nullptr,
                       mx::gpu_ptr<void>(out), rows, dim, rows / groups, eps_};
  cuda::launch(enc, kc::rms_norm_launch(args, float_type(out.dtype())), args);
}

void AddRMSNorm::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];  // row-contiguous, as are residual and weight: the op inserted the copies
  auto& sum = outputs[0];
  auto& out = outputs[1];
  auto& enc = cuda::begin(stream(), inputs, sum);  // never x's: two outputs (utils.h, allocate_like_or_donate)
  cuda::allocate(enc, out);
  enc.set_output_array(out);
  if (out.size() == 0) return;
  const int64_t dim = x.shape(-1);
  const int64_t rows = x.size() / dim;
  kc::RmsNormArgs args{mx::gpu_ptr<void>(x), inputs.size() > 2 ? mx::gpu_ptr<void>(inputs[2]) : nullptr,
                       mx::gpu_ptr<void>(out), rows, dim, rows, eps_, mx::gpu_ptr<void>(inputs[1]),
                       mx::gpu_ptr<void>(sum)};
  cuda::launch(enc, kc::rms_norm_launch(args, float_type(out.dtype())), args);
}

namespace {

// Launches the kernel on inputs (x, positions[, freq_factors]) laid out as `e` says, into `out` (registered,
// with its memory); the last `copied_heads` heads of every token copied unrotated.
void launch_rope(mx::cu::CommandEncoder& enc, const RopeParams& p, bool inverse, const std::vector<mx::array>& inputs,
                 const RopeExtent& e, mx::array& out, int64_t copied_heads, const RopeQKV* qkv = nullptr) {
  // rope_qkv's per-head norm weights follow rope's inputs (qkv, positions[, freq_factors]).
  const size_t norms = qkv && qkv->norm().on ? qkv->rope_inputs() : 0;
  const bool has_factors = qkv ? qkv->rope_inputs() > 2 : inputs.size() > 2;
  const auto ramp = rope_ramp(p);
  const float* ramp_data = nullptr;
  if (!ramp.empty()) ramp_data = mx::gpu_ptr<float>(cuda::device_constants(enc, ramp));
  const auto angles = rope_angles(p, inverse);
  kc::RopeArgs args{mx::gpu_ptr<void>(inputs[0]),
                    mx::gpu_ptr<void>(out),
                    mx::gpu_ptr<int32_t>(inputs[1]),
                    has_factors ? mx::gpu_ptr<float>(inputs[2]) : nullptr,
                    ramp_data,
                    e.batches,
                    e.tokens,
                    e.heads,
                    e.dim,
                    p.n_dims,
                    e.batches_per_positions,
                    e.batches_per_factors,
                    angles.theta_scale,
                    angles.freq_scale,
                    angles.mscale,
                    angles.sin_sign,
                    copied_heads,
                    norms ? mx::gpu_ptr<float>(inputs[norms]) : nullptr,
                    norms ? mx::gpu_ptr<float>(inputs[norms + 1]) : nullptr,
                    qkv ? qkv->heads().q : 0,
                    qkv ? qkv->norm().eps : 0.0f};
  cuda::launch(enc, kc::rope_launch(args, float_type(out.dtype()), p.mode == RopeMode::neox), args);
}

}  // namespace

void RoPE::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  // every input row-contiguous: the op inserted the copies
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  auto& enc = cuda::begin(stream(), inputs, out, &inputs[0]);
  if (out.size() == 0) return;
  launch_rope(enc, params_, inverse_, inputs, rope_extent(inputs, params_), out, 0);
}

void RopeQKV::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // every input row-contiguous: the op inserted the copies
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  auto buffer = rope_qkv_buffer(inputs[0], heads_);
  auto& enc = cuda::begin(stream(), inputs, buffer);  // never qkv's (rope_qkv.h, rope_qkv_buffer)
  if (buffer.size() > 0) {
    launch_rope(enc, params_, false, inputs, heads_extent(inputs, buffer), buffer, heads_.v, this);
  }
  rope_qkv_views(buffer, heads_, outputs);
}

void Dequantize::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& blocks = inputs[0];  // row-contiguous: the op inserted the copy
  auto& enc = cuda::begin(stream(), inputs, out);
  if (out.size() == 0) return;
  const void* data = mx::gpu_ptr<void>(blocks);
  // The blocks' float16 fields are read as 16-bit words (F32 as 32-bit words).
  const int alignment = type_ == GGML_EXT_TYPE_MXFP4 ? 1 : type_ == GGML_EXT_TYPE_F32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(data) % alignment != 0) {
    throw std::invalid_argument(cat("[dequantize] on the GPU the blocks must start at a multiple of ", alignment,
                                    " bytes; these are at byte offset ", blocks.offset(),
                                    " of their buffer (copy them first, e.g. mx.array(np.array(data)))."));
  }
  kc::DequantizeArgs args{data, mx::gpu_ptr<void>(out),
                          static_cast<int64_t>(blocks.nbytes() / ggml_ext_type_size(type_))};
  cuda::launch(enc, kc::dequantize_launch(args, type_, float_type(out.dtype())), args);
}

// ggml's quantizers are not ported to CUDA: quantize weights once, on the CPU.
MLX_GGML_EXT_NO_GPU_KERNEL(Quantize)

}  // namespace mlx_ggml_ext
