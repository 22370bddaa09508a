// CUDA eval_gpu of MulMatId (kernels/cuda/mul_mat_id.cu: the pairs grouped by expert on the device, then each
// expert's rows read once per chunk of its pairs; one kernel node for a few tokens, two otherwise).
#include "csrc/mul_mat_id.h"

#include "csrc/backend/cuda/launch.h"
#include "kernels/common/ggml_blocks.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext {

void MulMatId::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];    // (T, X, Kx), row-contiguous
  const auto& w = inputs[1];    // (E, N, row_bytes) uint8
  const auto& ids = inputs[2];  // (T, n_used) int32
  output_shapes(inputs);        // throws on inputs that do not fit (shapeless compile)
  auto& enc = cuda::begin(stream(), inputs, out);
  if (out.size() == 0) return;
  const void* blocks = mx::gpu_ptr<void>(w);
  // The decoders read block fields as 16-bit words (F32 weights as 32-bit ones).
  const int alignment = type_ == GGML_EXT_TYPE_MXFP4 ? 1 : type_ == GGML_EXT_TYPE_F32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(blocks) % alignment != 0) {
    throw std::invalid_argument(cat("[mul_mat_id] on the GPU the expert blocks must start at a multiple of ",
                                    alignment, " bytes; these are at byte offset ", w.offset(),
                                    " of their buffer (copy them first)."));
  }
  // The grouped kernels take the experts (and one bucket of bad ids) in grid.y, at most 65535, and index the
  // (token, slot) pairs in 32 bits.
  if (w.shape(0) >= 65535 || ids.size() > INT32_MAX) {
    throw std::invalid_argument(cat("[mul_mat_id] the CUDA kernels take at most 65534 experts and 2^31 - 1 (token, "
                                    "slot) pairs, got ", w.shape(0), " experts and ", ids.size(),
                                    " pairs; split the call."));
  }
  const int64_t row_bytes = w.shape(2);
  ggml_ext::cuda::MulMatIdArgs args{mx::gpu_ptr<void>(x),
                                    blocks,
                                    mx::gpu_ptr<int32_t>(ids),
                                    mx::gpu_ptr<void>(out),
                                    nullptr,
                                    ids.shape(0),
                                    ids.shape(1),
                                    x.shape(1),
                                    w.shape(0),
                                    w.shape(1),
                                    row_bytes / ggml_ext_type_size(type_) * ggml_ext_block_size(type_),
                                    row_bytes};
  const auto plan = ggml_ext::cuda::mul_mat_id_plan(args, type_, float_type(x.dtype()), transpose_);
  if (!plan.steps[0].kernel) {
    throw std::invalid_argument(cat("[mul_mat_id] no CUDA kernel for ggml type ", type_, "."));
  }
  cuda::launch_plan(enc, plan, args, inputs, out);
}

}  // namespace mlx_ggml_ext
