// CUDA eval_gpu of every primitive: shapes and arguments from the MLX arrays, the kernels from kernels/cuda.
#include "csrc/backend/cuda/launch.h"
#include "csrc/dequantize.h"
#include "csrc/quantize.h"
#include "csrc/rms_norm.h"
#include "csrc/rope.h"
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
  auto& enc = cuda::begin(stream(), inputs, sum, &x);  // h may take x's buffer: a thread reads x before writing h
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

void RoPE::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];  // every input row-contiguous: the op inserted the copies
  const auto& positions = inputs[1];
  const bool has_factors = inputs.size() > 2;
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  auto& enc = cuda::begin(stream(), inputs, out, &x);
  if (out.size() == 0) return;
  const RopeExtent e = rope_extent(inputs, params_);
  const auto ramp = rope_ramp(params_);
  const float* ramp_data = nullptr;
  if (!ramp.empty()) ramp_data = mx::gpu_ptr<float>(cuda::device_constants(enc, ramp));
  const auto angles = rope_angles(params_, inverse_);
  kc::RopeArgs args{mx::gpu_ptr<void>(x),
                    mx::gpu_ptr<void>(out),
                    mx::gpu_ptr<int32_t>(positions),
                    has_factors ? mx::gpu_ptr<float>(inputs[2]) : nullptr,
                    ramp_data,
                    e.batches,
                    e.tokens,
                    e.heads,
                    e.dim,
                    params_.n_dims,
                    e.batches_per_positions,
                    e.batches_per_factors,
                    angles.theta_scale,
                    angles.freq_scale,
                    angles.mscale,
                    angles.sin_sign};
  cuda::launch(enc, kc::rope_launch(args, float_type(out.dtype()), params_.mode == RopeMode::neox), args);
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
