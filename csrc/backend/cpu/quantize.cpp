#include "csrc/quantize.h"
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/quantize.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void Quantize::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& w = inputs[0];  // row-contiguous: the op inserted the copy
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(w);
  const float* imatrix = nullptr;
  if (inputs.size() > 1) {  // float32 (K,), row-contiguous: the op checked and copied it
    enc.set_input_array(inputs[1]);
    imatrix = inputs[1].data<float>();
  }
  enc.set_output_array(out);
  ggml_ext::cpu::QuantizeArgs args{w.data<void>(), float_type(w.dtype()), out.data<void>(), type_,
                                   static_cast<int64_t>(out.nbytes() / ggml_ext_type_size(type_)), imatrix,
                                   w.ndim() > 0 ? static_cast<int64_t>(w.shape(-1)) : 1};
  enc.dispatch([args] { ggml_ext::cpu::quantize(args); });
}

}  // namespace mlx_ggml_ext
