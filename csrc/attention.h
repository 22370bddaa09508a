// ggml's flash_attn_ext as an MLX primitive, in mlx-lm's (B, H, T, D) layout: a drop-in for
// mx.fast.scaled_dot_product_attention on the CPU (where MLX's falls back to unfused matmuls).
#pragma once
#include <optional>

#include "csrc/utils.h"

namespace mlx_ggml_ext {

// q (B, Hq, Tq, D), k (B, Hk, Tk, D), v (B, Hk, Tk, Dv), Hq a multiple of Hk; float dtypes promoted to one.
// mask: additive float (or bool: True keeps) broadcastable to (B, Hq, Tq, Tk); causal: key j visible to query i
// when j <= i + Tk - Tq. Output (B, Hq, Tq, Dv) in the common dtype.
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                    bool causal, float scale, float softcap, mx::StreamOrDevice s = {});

// Inputs: q, k, v (one dtype, any strides) and optionally the mask as float32 (4-D, each axis 1 or full,
// row-contiguous).
class Attention : public mx::UnaryPrimitive {
 public:
  Attention(mx::Stream stream, float scale, float softcap, bool causal)
      : mx::UnaryPrimitive(stream), scale_(scale), softcap_(softcap), causal_(causal) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), inputs[0].shape(1), inputs[0].shape(2), inputs[2].shape(3)}};
  }

  float scale() const { return scale_; }
  float softcap() const { return softcap_; }
  bool causal() const { return causal_; }

 private:
  float scale_, softcap_;
  bool causal_;
};

}  // namespace mlx_ggml_ext
