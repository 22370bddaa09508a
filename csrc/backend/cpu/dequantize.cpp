#include "csrc/dequantize.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "csrc/ggml_types.h"
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/dequantize.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void Dequantize::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& blocks = inputs[0];  // row-contiguous: the op inserted the copy
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(blocks);
  enc.set_output_array(out);
  ggml_ext::cpu::DequantizeArgs args{blocks.data<void>(), out.data<void>(), type_, float_type(out.dtype()),
                                     static_cast<int64_t>(blocks.nbytes() / ggml_ext_type_size(type_))};
  enc.dispatch([args] { ggml_ext::cpu::dequantize(args); });
}

}  // namespace mlx_ggml_ext

namespace mlx_ggml_ext {

double time_dequantize_kernel(int ggml_type, int64_t n_blocks, int repeats) {
  const auto info = ggml_type_info(ggml_type, "time_dequantize_kernel");
  if (n_blocks <= 0 || repeats <= 0) throw std::invalid_argument("n_blocks and repeats must be positive");
  // 0x3c bytes: float16 scales of about 1, E8M0 exponents of 2^-68; the kernels do not branch on values.
  std::vector<uint8_t> blocks(n_blocks * info.type_size, 0x3c);
  std::vector<float> out(n_blocks * info.block_size);
  ggml_ext::cpu::DequantizeArgs args{blocks.data(), out.data(), ggml_type, ggml_ext::cpu::FloatType::f32, n_blocks};
  double best = 1e30;
  for (int i = 0; i < repeats + 1; ++i) {  // the first run faults the output pages in
    const auto t0 = std::chrono::steady_clock::now();
    ggml_ext::cpu::dequantize(args);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, dt);
  }
  return best;
}

}  // namespace mlx_ggml_ext
