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

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(const std::vector<mx::array>& inputs,
                                                           const std::vector<int>& axes) override;

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
