#include "csrc/quantized_matmul.h"

#include <cstring>
#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/matmul.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void QuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto x = row_major_input(inputs[0], enc);  // (B3, B2, M, Kx)
  const auto& w = inputs[1];                        // (A3, A2, N, row_bytes), row-contiguous: the op made it so
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  if (x.size() == 0) {  // K = 0 (x is (..., 0)): every output is an empty sum
    enc.dispatch([p = out.data<uint8_t>(), n = out.nbytes()]() { std::memset(p, 0, n); });
    return;
  }

  // x: (B3, B2, M, Kx) against batched weights; against one matrix, any (..., Kx) whose leading axes are rows.
  const bool batched = x.ndim() == 4;
  const int64_t B3 = batched ? x.shape(0) : 1, B2 = batched ? x.shape(1) : 1;
  const int64_t A3 = w.shape(0), A2 = w.shape(1);
  const int64_t x_cols = x.shape(-1), out_cols = out.shape(-1), M = x.size() / (B3 * B2 * x_cols);
  const int64_t N = w.shape(2), row_bytes = w.shape(3);
  ggml_ext::cpu::MatmulArgs args{nullptr, float_type(x.dtype()), nullptr, type_, nullptr, float_type(out.dtype()),
                                 M, N, transpose_ ? out_cols : x_cols, transpose_, precise_x_};
  const auto* xp = x.data<uint8_t>();
  const auto* wp = w.data<uint8_t>();
  auto* op = out.data<uint8_t>();
  const int64_t x_batch = M * x_cols * x.itemsize(), out_batch = M * out_cols * out.itemsize();
  const int64_t w_batch = N * row_bytes;
  enc.dispatch([=]() mutable {
    // ggml's broadcasting: batch (i3, i2) of x uses the weight's batch (i3 / (B3 / A3), i2 / (B2 / A2)).
    for (int64_t i3 = 0; i3 < B3; ++i3) {
      for (int64_t i2 = 0; i2 < B2; ++i2) {
        args.x = xp + (i3 * B2 + i2) * x_batch;
        args.out = op + (i3 * B2 + i2) * out_batch;
        args.w = wp + ((i3 / (B3 / A3)) * A2 + i2 / (B2 / A2)) * w_batch;
        ggml_ext::cpu::quantized_matmul(args);
      }
    }
  });
}

}  // namespace mlx_ggml_ext
