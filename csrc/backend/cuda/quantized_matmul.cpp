// CUDA eval_gpu of QuantizedMatmul (the forward product and the transposed one of its vjp).
#include "csrc/quantized_matmul.h"

#include "csrc/backend/cuda/launch.h"
#include "kernels/common/ggml_blocks.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext {

void QuantizedMatmul::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];  // (B3, B2, M, Kx), or (..., Kx) of rows against one matrix; row-contiguous
  const auto& w = inputs[1];  // (A3, A2, N, row_bytes) uint8, row-contiguous
  auto& enc = cuda::begin(stream(), inputs, out);
  if (out.size() == 0) return;
  const bool batched = x.ndim() == 4;
  const int64_t b3 = batched ? x.shape(0) : 1, b2 = batched ? x.shape(1) : 1;
  const int64_t m = out.size() / (b3 * b2 * out.shape(-1));
  // The grid holds the batches in z and the 64-row tiles of x in y (at most 65535 each).
  if (b3 * b2 > 65535 || (m + 63) / 64 > 65535) {
    throw std::invalid_argument(cat("[quantized_matmul] the CUDA kernels take at most 65535 batches and 4194240 "
                                    "rows of x per batch, got ", b3 * b2, " batches of ", m,
                                    " rows; split the call."));
  }
  const void* blocks = mx::gpu_ptr<void>(w);
  // Block fields are read as 16-bit words (F32 weights as 32-bit words).
  const int alignment = type_ == GGML_EXT_TYPE_MXFP4 ? 1 : type_ == GGML_EXT_TYPE_F32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(blocks) % alignment != 0) {
    throw std::invalid_argument(cat("[quantized_matmul] on the GPU the weight blocks must start at a multiple of ",
                                    alignment, " bytes; these are at byte offset ", w.offset(),
                                    " of their buffer (copy them first)."));
  }
  const int64_t row_bytes = w.shape(3);
  ggml_ext::cuda::QuantizedMatmulArgs args{mx::gpu_ptr<void>(x),
                                           blocks,
                                           mx::gpu_ptr<void>(out),
                                           nullptr,
                                           m,
                                           w.shape(2),
                                           row_bytes / ggml_ext_type_size(type_) * ggml_ext_block_size(type_),
                                           row_bytes,
                                           b3 * b2,
                                           b2,
                                           w.shape(1),
                                           b2 / w.shape(1),
                                           b3 / w.shape(0),
                                           out.dtype() == mx::float32 && x.dtype() != mx::float32};
  // precise_x: x as floats (the float decode kernel up to 8 rows, else the tiles; the decode route quantizes x to
  // int8).
  const auto plan = ggml_ext::cuda::quantized_matmul_plan(args, type_, float_type(x.dtype()), transpose_, precise_x_);
  cuda::launch_plan(enc, plan, args, inputs, out);
}

}  // namespace mlx_ggml_ext
