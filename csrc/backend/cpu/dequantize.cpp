#include "csrc/dequantize.h"
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
