// Fused RMSNorm: y = x / sqrt(mean(x^2, -1) + eps) * weight.
#pragma once
#include <optional>

#include "csrc/utils.h"

namespace mlx_ggml_ext {

// weight: None or shape (D,). Output dtype: x's, promoted with weight's.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps,
                   mx::StreamOrDevice s = {});

// Inputs: x (G..., R..., D) and optionally weight (G..., D): rows under the
// leading group index g use weight[g]. The public op has no group axes; vmap over
// a batched weight adds them.
class RMSNorm : public mx::UnaryPrimitive {
 public:
  RMSNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  float eps() const { return eps_; }

 private:
  float eps_;
};

}  // namespace mlx_ggml_ext
