#include "csrc/rms_norm.h"
#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/rms_norm.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  allocate_like_or_donate(inputs[0], out);  // donated only when x is row-major already
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto x = row_major_input(inputs[0], enc);
  const bool weighted = inputs.size() > 1;
  const auto weight = weighted ? row_major_input(inputs[1], enc) : x;
  const int64_t dim = x.shape(-1);
  const int64_t rows = x.size() / dim;
  const int64_t groups = weighted ? weight.size() / dim : 1;

  enc.set_input_array(x);
  if (weighted) enc.set_input_array(weight);
  enc.set_output_array(out);
  ggml_ext::cpu::RmsNormArgs args{x.data<void>(),
                                  weighted ? weight.data<void>() : nullptr,
                                  out.data<void>(),
                                  float_type(out.dtype()),
                                  rows,
                                  dim,
                                  rows / groups,
                                  eps_};
  enc.dispatch([args] { ggml_ext::cpu::rms_norm(args); });
}

void AddRMSNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& sum = outputs[0];
  auto& out = outputs[1];
  sum.set_data(mx::allocator::malloc(sum.nbytes()));  // never x's: two outputs (utils.h, allocate_like_or_donate)
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto x = row_major_input(inputs[0], enc);
  const auto residual = row_major_input(inputs[1], enc);
  const bool weighted = inputs.size() > 2;
  const auto weight = weighted ? row_major_input(inputs[2], enc) : x;
  const int64_t dim = x.shape(-1);
  const int64_t rows = x.size() / dim;
  enc.set_input_array(x);
  enc.set_input_array(residual);
  if (weighted) enc.set_input_array(weight);
  enc.set_output_array(sum);
  enc.set_output_array(out);
  ggml_ext::cpu::RmsNormArgs args{x.data<void>(), weighted ? weight.data<void>() : nullptr,
                                  out.data<void>(), float_type(out.dtype()),
                                  rows, dim,
                                  rows, eps_,
                                  residual.data<void>(), sum.data<void>()};
  enc.dispatch([args] { ggml_ext::cpu::rms_norm(args); });
}

}  // namespace mlx_ggml_ext
