#include <cstring>
#include <memory>
#include <vector>

#include "csrc/attention.h"
#include "kernels/cpu/attention.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {
namespace {

// Where the kernel reads one of q, k, v: the array's own memory with its batch, head and token strides when its
// rows are contiguous (a KV cache's slice of a larger buffer, mlx-lm's transposed heads), else a row-major copy
// made on the worker thread, when the array's data is ready.
struct Operand {
  const void* data;
  int64_t strides[3];
  std::shared_ptr<std::vector<char>> copy;  // owns the copy's bytes, if any
};

Operand operand(const mx::array& a) {
  const auto& st = a.strides();
  if (st[3] == 1 || a.shape(3) == 1) return {a.data<void>(), {st[0], st[1], st[2]}, nullptr};
  auto copy = std::make_shared<std::vector<char>>(a.size() * a.itemsize());
  return {copy->data(), {int64_t(a.shape(1)) * a.shape(2) * a.shape(3), int64_t(a.shape(2)) * a.shape(3), a.shape(3)},
          copy};
}

// The row-major copy of a 4-D strided array into `out`, element by element (a rare path: MLX hands over rows
// with a unit stride in every layout mlx-lm produces).
void gather_rows(const mx::array& a, char* out) {
  const auto& st = a.strides();
  const int64_t item = a.itemsize();
  const char* src = static_cast<const char*>(a.data<void>());
  for (int64_t i0 = 0; i0 < a.shape(0); ++i0)
    for (int64_t i1 = 0; i1 < a.shape(1); ++i1)
      for (int64_t i2 = 0; i2 < a.shape(2); ++i2)
        for (int64_t i3 = 0; i3 < a.shape(3); ++i3, out += item) {
          std::memcpy(out, src + (i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]) * item, item);
        }
}

}  // namespace

void Attention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];  // the mask (if any) is row-contiguous
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  const Operand oq = operand(q), ok = operand(k), ov = operand(v);
  ggml_ext::cpu::AttentionArgs args{};
  args.q = oq.data;
  args.k = ok.data;
  args.v = ov.data;
  for (int i = 0; i < 3; ++i) {
    args.q_strides[i] = oq.strides[i];
    args.k_strides[i] = ok.strides[i];
    args.v_strides[i] = ov.strides[i];
  }
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
  enc.dispatch([args, q, k, v, oq, ok, ov] {
    for (const auto& [a, o] : {std::pair{&q, &oq}, std::pair{&k, &ok}, std::pair{&v, &ov}}) {
      if (o->copy) gather_rows(*a, o->copy->data());
    }
    ggml_ext::cpu::attention(args);
  });
}

}  // namespace mlx_ggml_ext
