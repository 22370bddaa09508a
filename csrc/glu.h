// ggml's gated linear units: y = act(gate) * up with act SiLU (swiglu), tanh-approximated GELU (geglu) or
// erf GELU (geglu_erf), or gpt-oss's clamped SwiGLU (swiglu_oai: x = min(gate, limit), y = clamp(up, -limit,
// limit), x sigmoid(alpha x) (y + 1)), on two arrays or on one whose last axis holds gate then up (ggml's
// fused layout).
#pragma once
#include <optional>
#include <string>

#include "csrc/utils.h"
#include "kernels/cpu/glu.h"

namespace mlx_ggml_ext {

using GluKind = ggml_ext::cpu::GluKind;

// "swiglu", "geglu", "geglu_erf" or "swiglu_oai"; anything else is a ValueError naming the choices.
GluKind glu_kind(const std::string& name);
const char* glu_kind_name(GluKind kind);

// swiglu_oai's constants (the other kinds have none).
struct GluParams {
  float alpha = 1.702f, limit = 7.0f;
};

// swiglu_oai's alpha and limit as given (each defaults as in gpt-oss); a ValueError if they are not finite,
// limit <= 0, or they are given to another kind.
GluParams glu_params(GluKind kind, std::optional<float> alpha, std::optional<float> limit);

// up given: gate and up of one shape (float dtypes, promoted to a common one). up absent: gate is the fused
// (..., 2n) array and the result is (..., n).
mx::array glu(const mx::array& gate, const std::optional<mx::array>& up, GluKind kind, GluParams params = {},
              mx::StreamOrDevice s = {});

// Inputs: {gate, up} (same shape and dtype, row-contiguous), or {x} with the halves on its last axis (fused).
class GLU : public mx::UnaryPrimitive {
 public:
  GLU(mx::Stream stream, GluKind kind, GluParams params, bool fused)
      : mx::UnaryPrimitive(stream), kind_(kind), params_(params), fused_(fused) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtGLU"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  GluKind kind() const { return kind_; }
  const GluParams& params() const { return params_; }
  bool fused() const { return fused_; }
  // How the kernels walk the inputs: `rows` of `cols` outputs, gate row r at r * in_stride, up `up_offset`
  // elements after gate (in the second input when not fused).
  struct Layout {
    int64_t rows, cols, in_stride, up_offset;
  };
  Layout layout(const mx::array& out) const;

 private:
  GluKind kind_;
  GluParams params_;
  bool fused_;
};

}  // namespace mlx_ggml_ext
