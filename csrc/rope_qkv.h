// A fused q/k/v projection's output split into attention heads, q and k rotated (ggml's rope_ext), in MLX's
// attention layout: one node where mlx-lm's attention builds eleven (a split into three, three reshapes, three
// transposes, two ropes), which on a GPU is host time of every decode token.
//
// qkv (..., T, (Hq + Hk + Hv) * D) -> q (..., Hq, T, D), k (..., Hk, T, D), v (..., Hv, T, D), or without v
// (Hv = 0: q and k stacked, v a product of its own, as where a Q4_K_M file's v weights have another block type).
// The kernel is RoPE's (kernels/*/rope), run over qkv as (..., T, Hq + Hk + Hv, D) with its last Hv heads copied;
// the outputs are strided views of that one buffer.
#pragma once
#include <optional>
#include <vector>

#include "csrc/rope.h"

namespace mlx_ggml_ext {

struct QkvHeads {
  int q = 0;  // query heads
  int k = 0;  // key heads
  int v = 0;  // value heads: k, or 0 for an input without them
  bool operator==(const QkvHeads&) const = default;
};

// Qwen 3's and Gemma 3's per-head norms: every q head rms-normed with weight q_norm (D,), every k head with k_norm,
// before the rotation.
struct QkNorm {
  bool on = false;
  float eps = 1e-6f;
  bool operator==(const QkNorm&) const = default;
};

// params.heads_first must be false (the outputs are heads-first by construction). q_norm and k_norm: both or
// neither, float (D,) each, with norm_eps.
std::vector<mx::array> rope_qkv(const mx::array& qkv, const mx::array& positions, QkvHeads heads,
                                const RopeParams& params, const std::optional<mx::array>& freq_factors,
                                const std::optional<mx::array>& q_norm, const std::optional<mx::array>& k_norm,
                                float norm_eps, mx::StreamOrDevice s = {});

// Inputs: qkv (..., T, F) row-contiguous on a GPU, positions int32 (T,), optionally freq_factors float32
// (n_dims/2,), then with norm.on the float32 q and k norm weights (D,). Its transformations are the unfused
// graph's (reshape, split, RMSNorm, RoPE, swapaxes), built from those ops' own.
class RopeQKV : public mx::Primitive {
 public:
  RopeQKV(mx::Stream stream, const RopeParams& params, QkvHeads heads, QkNorm norm, bool has_factors)
      : mx::Primitive(stream), params_(params), heads_(heads), norm_(norm), has_factors_(has_factors) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtRopeQKV"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  // Re-checks the shapes, which mx.compile(shapeless=True) may change after the op's checks.
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  const RopeParams& params() const { return params_; }
  QkvHeads heads() const { return heads_; }
  QkNorm norm() const { return norm_; }
  // How many of the inputs are rope's (qkv, positions[, freq_factors]); the norm weights follow.
  size_t rope_inputs() const { return has_factors_ ? 3 : 2; }
  // What rope's kernels take: qkv's extent read as the buffer's (..., T, Hq + Hk + Hv, D) (rope_qkv_buffer).
  RopeExtent heads_extent(const std::vector<mx::array>& inputs, const mx::array& buffer) const;

 private:
  RopeParams params_;
  QkvHeads heads_;
  QkNorm norm_;
  bool has_factors_;
};

// For every backend's eval: the buffer the kernel writes, (..., T, Hq + Hk + Hv, D) of qkv's dtype (no data yet),
// and, once it has data, the outputs made views of it. A new allocation, never qkv's: MLX gives every output of a
// primitive its own copy of the input list, so qkv is held once per output and never donatable (MLX 0.32).
mx::array rope_qkv_buffer(const mx::array& qkv, QkvHeads heads);
void rope_qkv_views(const mx::array& buffer, QkvHeads heads, std::vector<mx::array>& outputs);

}  // namespace mlx_ggml_ext
