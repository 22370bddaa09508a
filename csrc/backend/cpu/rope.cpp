#include "csrc/rope.h"
#include "kernels/cpu/rope.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void RoPE::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];  // every input row-contiguous: the op inserted the copies
  const auto& positions = inputs[1];
  const bool has_factors = inputs.size() > 2;
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  allocate_like_or_donate(x, out);
  if (out.size() == 0) return;
  const RopeExtent e = rope_extent(inputs, params_);
  // Lives until the task has run.
  auto ramp = std::make_shared<const std::vector<float>>(rope_ramp(params_));

  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  ggml_ext::cpu::RopeArgs args{x.data<void>(),
                               out.data<void>(),
                               float_type(out.dtype()),
                               positions.data<int32_t>(),
                               has_factors ? inputs[2].data<float>() : nullptr,
                               ramp->empty() ? nullptr : ramp->data(),
                               e.batches,
                               e.tokens,
                               e.heads,
                               e.dim,
                               params_.n_dims,
                               e.batches_per_positions,
                               e.batches_per_factors,
                               params_.mode == RopeMode::neox,
                               rope_angles(params_, inverse_)};
  enc.dispatch([args, ramp] { ggml_ext::cpu::rope(args); });
}

}  // namespace mlx_ggml_ext
