#include "csrc/rope.h"
#include "csrc/rope_qkv.h"
#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/rope.h"

namespace mlx_ggml_ext {
namespace {

// rope_qkv's per-head norms: the weights (float32) after rope's inputs, the q heads' count and the epsilon.
struct HeadNorms {
  size_t first_input = 0;  // 0: none
  int64_t q_heads = 0;
  float eps = 0.0f;
};

// Queues the kernel on the stream: inputs (x, positions[, freq_factors][, q_norm, k_norm]) laid out as `e` says,
// into `out` (which has its memory, x's own when donated); the last `copied_heads` heads of every token copied
// unrotated.
void run_rope(const RopeParams& p, bool inverse, const std::vector<mx::array>& inputs, const RopeExtent& e,
              mx::array& out, int64_t copied_heads, mx::Stream stream, HeadNorms norms = {}) {
  // Lives until the task has run.
  auto ramp = std::make_shared<const std::vector<float>>(rope_ramp(p));
  auto& enc = mx::cpu::get_command_encoder(stream);
  std::vector<mx::array> rows;
  for (const auto& in : inputs) rows.push_back(row_major_input(in, enc));
  for (const auto& in : rows) enc.set_input_array(in);
  enc.set_output_array(out);
  const bool has_factors = (norms.first_input ? norms.first_input : rows.size()) > 2;
  ggml_ext::cpu::RopeArgs args{rows[0].data<void>(),
                               out.data<void>(),
                               float_type(out.dtype()),
                               rows[1].data<int32_t>(),
                               has_factors ? rows[2].data<float>() : nullptr,
                               ramp->empty() ? nullptr : ramp->data(),
                               e.batches,
                               e.tokens,
                               e.heads,
                               e.dim,
                               p.n_dims,
                               e.batches_per_positions,
                               e.batches_per_factors,
                               p.mode == RopeMode::neox,
                               rope_angles(p, inverse),
                               copied_heads,
                               norms.first_input ? rows[norms.first_input].data<float>() : nullptr,
                               norms.first_input ? rows[norms.first_input + 1].data<float>() : nullptr,
                               norms.q_heads,
                               norms.eps};
  enc.dispatch([args, ramp] { ggml_ext::cpu::rope(args); });
}

}  // namespace

void RoPE::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  allocate_like_or_donate(inputs[0], out);  // donated only when x is row-major already
  if (out.size() == 0) return;
  run_rope(params_, inverse_, inputs, rope_extent(inputs, params_), out, 0, stream());
}

void RopeQKV::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  output_shapes(inputs);  // throws on inputs that do not fit (never divide by zero below)
  auto buffer = rope_qkv_buffer(inputs[0], heads_);
  buffer.set_data(mx::allocator::malloc(buffer.nbytes()));  // never qkv's (rope_qkv.h, rope_qkv_buffer)
  if (buffer.size() > 0) {
    const HeadNorms norms = norm_.on ? HeadNorms{rope_inputs(), heads_.q, norm_.eps} : HeadNorms{};
    run_rope(params_, false, inputs, heads_extent(inputs, buffer), buffer, heads_.v, stream(), norms);
  }
  rope_qkv_views(buffer, heads_, outputs);
}

}  // namespace mlx_ggml_ext
