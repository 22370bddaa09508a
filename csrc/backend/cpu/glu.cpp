#include "csrc/glu.h"
#include "csrc/backend/cpu/row_major.h"

namespace mlx_ggml_ext {

void GLU::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  // An unfused gate has out's size and may be donated (when row-major already).
  if (fused_ || !donate(inputs[0], out)) out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  const auto l = layout(out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> rows;
  for (const auto& a : inputs) rows.push_back(row_major_input(a, enc));
  for (const auto& a : rows) enc.set_input_array(a);
  enc.set_output_array(out);
  const auto& up = fused_ ? rows[0] : rows[1];
  const auto elem = static_cast<int64_t>(out.itemsize());
  ggml_ext::cpu::GluArgs args{rows[0].data<void>(),
                              static_cast<const char*>(up.data<void>()) + l.up_offset * elem,
                              out.data<void>(),
                              float_type(out.dtype()),
                              kind_,
                              l.rows,
                              l.cols,
                              l.in_stride,
                              params_.alpha,
                              params_.limit};
  enc.dispatch([args] { ggml_ext::cpu::glu(args); });
}

}  // namespace mlx_ggml_ext
