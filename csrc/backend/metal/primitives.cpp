// Metal: eval_gpu of every primitive that has a Metal kernel (kernels/metal/*.metal), each through the
// one dispatch helper, MetalKernel, with its launch plan from launch_plans.h (which the emulator tests
// dispatch too). Not run on Apple hardware.
#include <algorithm>
#include <cstdint>

#include "csrc/backend/metal/metal_kernel.h"
#include "csrc/dequantize.h"
#include "csrc/ggml_types.h"
#include "csrc/kv_cache.h"
#include "csrc/quantize.h"
#include "csrc/quantized_matmul.h"
#include "csrc/rms_norm.h"
#include "csrc/rope.h"
#include "csrc/rope_qkv.h"
#include "kernels/common/ggml_blocks.h"

namespace mlx_ggml_ext {

namespace gm = ggml_ext_metal;

namespace {
// Whether an array's data starts on a 4-element boundary (the kernels' 4-element vectors).
bool aligned4(const mx::array& a) {
  return reinterpret_cast<uintptr_t>(a.data<uint8_t>()) % (4 * a.itemsize()) == 0;
}
}  // namespace

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "rms_norm";
  const auto& x = inputs[0];  // row-contiguous: the op inserted the copies
  allocate_like_or_donate(x, out);
  if (out.size() == 0) return;
  const bool weighted = inputs.size() > 1;
  const int64_t dim = x.shape(-1), rows = x.size() / dim;
  const int64_t groups = weighted ? inputs[1].size() / dim : 1;
  // 4-element loads where every row starts on a 4-element boundary.
  const bool vec4 = dim % 4 == 0 && aligned4(x) && aligned4(out) && (!weighted || aligned4(inputs[1]));
  const gm::RmsNormArgs args{checked_u32(dim, op, "row length"), checked_u32(rows / groups, op, "rows"),
                             weighted ? 1u : 0u, eps_, vec4 ? 1u : 0u, 0u};
  const auto plan = gm::plan_rms_norm(metal_dtype_suffix(out.dtype()), checked_u32(rows, op, "rows"), args);
  MetalKernel(stream(), plan.kernel)
      .input(x, 0)
      .input(weighted ? inputs[1] : x, 1)  // never read without a weight; any buffer will do
      .output(out, 2)
      .bytes(plan.args, 3)
      .input(x, 4)  // residual and sum: never touched without a residual
      .input(x, 5)
      .dispatch(plan.grid);
}

void AddRMSNorm::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  constexpr const char* op = "add_rms_norm";
  const auto& x = inputs[0];  // row-contiguous, as are residual and weight: the op inserted the copies
  const auto& residual = inputs[1];
  auto& sum = outputs[0];
  auto& out = outputs[1];
  sum.set_data(mx::allocator::malloc(sum.nbytes()));  // never x's: two outputs (utils.h, allocate_like_or_donate)
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  const bool weighted = inputs.size() > 2;
  const int64_t dim = x.shape(-1), rows = x.size() / dim;
  const bool vec4 = dim % 4 == 0 && aligned4(x) && aligned4(out) && aligned4(residual) && aligned4(sum) &&
                    (!weighted || aligned4(inputs[2]));
  const gm::RmsNormArgs args{checked_u32(dim, op, "row length"), checked_u32(rows, op, "rows"), weighted ? 1u : 0u,
                             eps_, vec4 ? 1u : 0u, 1u};
  const auto plan = gm::plan_rms_norm(metal_dtype_suffix(out.dtype()), checked_u32(rows, op, "rows"), args);
  MetalKernel(stream(), plan.kernel)
      .input(x, 0)
      .input(weighted ? inputs[2] : x, 1)
      .output(out, 2)
      .bytes(plan.args, 3)
      .input(residual, 4)
      .output(sum, 5)
      .dispatch(plan.grid);
}

namespace {

// rope's dispatch: x (row-contiguous) read as `e` says, into `out` (with its memory), positions and the optional
// freq_factors from `inputs` (rope's order); rope_qkv (`qkv`): its last v heads copied, its per-head norm weights
// after rope's inputs.
void encode_rope(const mx::Stream& stream, const RopeParams& p, bool inverse, const std::vector<mx::array>& inputs,
                 const RopeExtent& e, mx::array& out, const RopeQKV* qkv = nullptr) {
  const char* op = qkv ? "rope_qkv" : "rope";
  const auto& x = inputs[0];
  const bool has_factors = qkv ? qkv->rope_inputs() > 2 : inputs.size() > 2;
  const bool has_norm = qkv && qkv->norm().on;
  if (p.n_dims * sizeof(float) + (has_norm ? e.heads * sizeof(float) : 0) > 32768) {
    throw std::invalid_argument(cat("[", op, "] n_dims = ", p.n_dims, " with ", e.heads,
                                    " heads exceeds the Metal kernel's table."));
  }
  const auto angles = rope_angles(p, inverse);
  const auto ramp = rope_ramp(p);
  // 4-element vectors where the rows and both arrays allow them (the norms take the element-wise path).
  const bool vec4 = gm::rope_vec4_shape(static_cast<uint32_t>(e.dim), static_cast<uint32_t>(p.n_dims),
                                        p.mode == RopeMode::neox) &&
                    aligned4(x) && aligned4(out) && !has_norm;
  const gm::RopeArgs args{checked_u32(e.tokens, op, "tokens"),
                          checked_u32(e.heads, op, "heads"),
                          checked_u32(e.dim, op, "head dim"),
                          static_cast<uint32_t>(p.n_dims),
                          checked_u32(e.batches_per_positions, op, "batches"),
                          checked_u32(e.batches_per_factors, op, "batches"),
                          p.mode == RopeMode::neox ? 1u : 0u,
                          has_factors ? 1u : 0u,
                          ramp.empty() ? 0u : 1u,
                          angles.theta_scale,
                          angles.freq_scale,
                          angles.mscale,
                          angles.sin_sign,
                          vec4 ? 1u : 0u,
                          qkv ? static_cast<uint32_t>(qkv->heads().v) : 0u,
                          has_norm ? 1u : 0u,
                          qkv ? static_cast<uint32_t>(qkv->heads().q) : 0u,
                          has_norm ? qkv->norm().eps : 0.0f};
  const auto plan = gm::plan_rope(metal_dtype_suffix(out.dtype()), checked_u32(e.batches, op, "batches"), args);
  MetalKernel kernel(stream, plan.kernel);
  kernel.input(x, 0).output(out, 1).input(inputs[1], 2).input(has_factors ? inputs[2] : x, 3);
  if (ramp.empty()) {
    kernel.input(x, 4);  // never read without YaRN
  } else {
    kernel.temporary_input(mx::array(ramp.begin(), {static_cast<int>(ramp.size())}, mx::float32), 4);
  }
  const size_t norms = has_norm ? qkv->rope_inputs() : 0;  // the norm weights follow rope's inputs
  kernel.bytes(plan.args, 5)
      .input(norms ? inputs[norms] : x, 6)  // never read without norms
      .input(norms ? inputs[norms + 1] : x, 7)
      .dispatch(plan.grid);
}

}  // namespace

void RoPE::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  // every input row-contiguous: the op inserted the copies
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  allocate_like_or_donate(inputs[0], out);
  if (out.size() == 0) return;
  encode_rope(stream(), params_, inverse_, inputs, rope_extent(inputs, params_), out);
}

void RopeQKV::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // every input row-contiguous: the op inserted the copies
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  auto buffer = rope_qkv_buffer(inputs[0], heads_);
  buffer.set_data(mx::allocator::malloc(buffer.nbytes()));  // never qkv's (rope_qkv.h, rope_qkv_buffer)
  if (buffer.size() > 0) encode_rope(stream(), params_, false, inputs, heads_extent(inputs, buffer), buffer, this);
  rope_qkv_views(buffer, heads_, outputs);
}

void Dequantize::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "dequantize";
  const auto& blocks = inputs[0];  // row-contiguous: the op inserted the copy
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  check_block_alignment(blocks, type_, op);
  const auto info = ggml_type_info(type_, op);
  const int64_t n_blocks = blocks.nbytes() / info.type_size;
  checked_u32(info.block_size > 1 ? n_blocks * (info.block_size / 16) : n_blocks, op, "elements / 16");
  const auto plan = gm::plan_dequantize(kernel_type_name(type_, op), info.block_size, metal_dtype_suffix(out.dtype()),
                                        n_blocks);
  MetalKernel(stream(), plan.kernel).input(blocks, 0).output(out, 1).bytes(plan.args, 2).dispatch(plan.grid);
}

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "quantized_matmul";
  const auto& x = inputs[0];  // row-contiguous: the op inserted the copies
  const auto& w = inputs[1];  // (A3, A2, N, row_bytes)
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  check_block_alignment(w, type_, op);
  // x: (B3, B2, M, Kx) against batched weights; against one matrix, any (..., Kx) whose leading axes are rows.
  const bool batched = x.ndim() == 4;
  const int64_t B3 = batched ? x.shape(0) : 1, B2 = batched ? x.shape(1) : 1;
  const int64_t A3 = w.shape(0), A2 = w.shape(1), N = w.shape(2);
  const int64_t M = out.size() / (B3 * B2 * out.shape(-1));  // from out: non-empty here, x may be (M, 0)
  const int64_t K = transpose_ ? out.shape(-1) : x.shape(-1);
  const uint32_t out_type = out.dtype() == mx::float32   ? gm::kMatmulOutF32
                            : out.dtype() == mx::float16 ? gm::kMatmulOutF16
                                                         : gm::kMatmulOutBF16;
  const gm::MatmulArgs args{checked_u32(M, op, "M"),
                            checked_u32(N, op, "N"),
                            checked_u32(K, op, "K"),
                            checked_u32(w.shape(3), op, "row bytes"),
                            checked_u32(B2, op, "B2"),
                            checked_u32(A2, op, "A2"),
                            static_cast<uint32_t>(B2 / A2),
                            static_cast<uint32_t>(B3 / A3),
                            out_type,
                            gm::line_offset(w.data<uint8_t>()),
                            gm::line_offset(x.data<uint8_t>())};
  const auto plan = gm::plan_matmul(kernel_type_name(type_, op), metal_dtype_suffix(x.dtype()), transpose_,
                                    checked_u32(B3 * B2, op, "batches"), args);
  MetalKernel(stream(), plan.kernel).input(x, 0).input(w, 1).output(out, 2).bytes(plan.args, 3).dispatch(plan.grid);
}

// quantize has no Metal kernel yet (the K-quant search is a CPU design): a clear error.
MLX_GGML_EXT_NO_GPU_KERNEL(Quantize)

}  // namespace mlx_ggml_ext
