#include "csrc/rms_norm.h"
#include "kernels/cpu/rms_norm.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];  // row-contiguous: the op inserted the copies
  allocate_like_or_donate(x, out);
  if (out.size() == 0) return;
  const bool weighted = inputs.size() > 1;
  const int64_t dim = x.shape(-1);
  const int64_t rows = x.size() / dim;
  const int64_t groups = weighted ? inputs[1].size() / dim : 1;

  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(x);
  if (weighted) enc.set_input_array(inputs[1]);
  enc.set_output_array(out);
  ggml_ext::cpu::RmsNormArgs args{x.data<void>(),
                                  weighted ? inputs[1].data<void>() : nullptr,
                                  out.data<void>(),
                                  float_type(out.dtype()),
                                  rows,
                                  dim,
                                  rows / groups,
                                  eps_};
  enc.dispatch([args] { ggml_ext::cpu::rms_norm(args); });
}

}  // namespace mlx_ggml_ext
