#include "csrc/rope.h"
#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/rope.h"

namespace mlx_ggml_ext {

void RoPE::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const bool has_factors = inputs.size() > 2;
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  allocate_like_or_donate(inputs[0], out);  // donated only when x is row-major already
  if (out.size() == 0) return;
  const RopeExtent e = rope_extent(inputs, params_);
  // Lives until the task has run.
  auto ramp = std::make_shared<const std::vector<float>>(rope_ramp(params_));

  auto& enc = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> rows;
  for (const auto& in : inputs) rows.push_back(row_major_input(in, enc));
  const auto& x = rows[0];
  const auto& positions = rows[1];
  for (const auto& in : rows) enc.set_input_array(in);
  enc.set_output_array(out);
  ggml_ext::cpu::RopeArgs args{x.data<void>(),
                               out.data<void>(),
                               float_type(out.dtype()),
                               positions.data<int32_t>(),
                               has_factors ? rows[2].data<float>() : nullptr,
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
