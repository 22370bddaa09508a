#include "csrc/attention.h"
#include "kernels/cpu/attention.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

void Attention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];  // row-contiguous: the op inserted the copies
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  ggml_ext::cpu::AttentionArgs args{};
  args.q = q.data<void>();
  args.k = k.data<void>();
  args.v = v.data<void>();
  args.y = out.data<void>();
  if (inputs.size() > 3) {
    const auto& mask = inputs[3];
    args.mask = mask.data<float>();
    int64_t stride = 1;
    for (int ax = 3; ax >= 0; --ax) {  // a broadcast (size-1) axis steps by 0
      args.mask_strides[ax] = mask.shape(ax) == 1 ? 0 : stride;
      stride *= mask.shape(ax);
    }
  }
  args.type = float_type(out.dtype());
  args.batch = q.shape(0);
  args.q_heads = q.shape(1);
  args.kv_heads = k.shape(1);
  args.q_len = q.shape(2);
  args.kv_len = k.shape(2);
  args.head_dim = q.shape(3);
  args.v_dim = v.shape(3);
  args.scale = scale_;
  args.softcap = softcap_;
  args.causal = causal_;
  enc.dispatch([args] { ggml_ext::cpu::attention(args); });
}

}  // namespace mlx_ggml_ext
