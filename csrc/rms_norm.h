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

// The checks rms_norm and add_rms_norm share (errors name `op`): x a float array of at least one dimension,
// eps finite and >= 0, weight None or a float (D,). Returns x's dtype promoted with weight's.
mx::Dtype checked_norm_dtype(const char* op, const mx::array& x, const std::optional<mx::array>& weight, float eps);

// A transformer layer's residual add fused with the next norm: returns {h, y} with h = x + residual (x's dtype,
// promoted with residual's and weight's) and y = rms_norm(h, weight, eps), one node and one pass over the rows
// instead of an add and an rms_norm. x and residual must have the same shape.
std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight, float eps, mx::StreamOrDevice s = {});

// Inputs: x, residual (same shape and dtype, row-contiguous) and optionally weight (D,). Outputs: h, y.
class AddRMSNorm : public mx::Primitive {
 public:
  AddRMSNorm(mx::Stream stream, float eps) : mx::Primitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtAddRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const AddRMSNorm&>(other).eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape(), inputs[0].shape()};
  }

 private:
  float eps_;
};

}  // namespace mlx_ggml_ext
