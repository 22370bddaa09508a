#include "csrc/attention.h"
#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/attention.h"

namespace mlx_ggml_ext {
namespace {

// Where the kernel reads one of q, k, v: the array's own memory with its batch, head and token strides when its
// rows are contiguous (a KV cache's slice of a larger buffer, mlx-lm's transposed heads), else a row-major copy
// (row_major_input: made by a task ahead of the kernel's; a rare path, as MLX hands over rows with a unit stride
// in every layout mlx-lm produces).
struct Operand {
  mx::array array;
  int64_t strides[3];
};

Operand operand(const mx::array& a, mx::cpu::CommandEncoder& enc) {
  const mx::array rows = a.strides()[3] == 1 || a.shape(3) == 1 ? a : row_major_input(a, enc);
  const auto& st = rows.strides();  // a copy's are row-major
  return {rows, {st[0], st[1], st[2]}};
}

}  // namespace

void Attention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];  // the mask and sinks (if any) are row-contiguous
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  const Operand oq = operand(q, enc), ok = operand(k, enc), ov = operand(v, enc);
  ggml_ext::cpu::AttentionArgs args{};
  args.q = oq.array.data<void>();
  args.k = ok.array.data<void>();
  args.v = ov.array.data<void>();
  for (int i = 0; i < 3; ++i) {
    args.q_strides[i] = oq.strides[i];
    args.k_strides[i] = ok.strides[i];
    args.v_strides[i] = ov.strides[i];
  }
  args.y = out.data<void>();
  describe(inputs, args);
  if (const int i = mask_index(inputs); i >= 0) args.mask = inputs[i].data<float>();
  if (const int i = sinks_index(inputs); i >= 0) args.sinks = inputs[i].data<float>();
  args.type = float_type(out.dtype());
  enc.dispatch([args, q, k, v] { ggml_ext::cpu::attention(args); });
}

}  // namespace mlx_ggml_ext
