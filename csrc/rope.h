// ggml's rope_ext: rotary position embedding in ggml's layout, x of shape (..., T, H, D), or in MLX's attention
// layout (..., H, T, D) (RopeParams::heads_first), which mlx-lm's models hand over without a reshape.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "csrc/utils.h"
#include "kernels/cpu/rope.h"

namespace mlx_ggml_ext {

// ggml's mode ids. MROPE (8), VISION (24) and IMROPE (40) are recognized and
// refused with not_implemented_error; other ids are a ValueError.
enum class RopeMode : int { normal = 0, neox = 2 };
RopeMode rope_mode(int ggml_mode);
RopeMode rope_mode(const std::string& name);

struct RopeParams {
  int n_dims = 0;
  RopeMode mode = RopeMode::normal;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;
  // x is (..., H, T, D): every head a batch of its own that shares the tokens' positions (no reshape nodes
  // around the op in mlx-lm's attention).
  bool heads_first = false;
  bool operator==(const RopeParams&) const = default;
};

// positions: int32 (T,) for x (..., T, H, D) (or (..., H, T, D) with heads_first); freq_factors: float32
// (n_dims/2,) or None.
mx::array rope(const mx::array& x, const mx::array& positions, const RopeParams& params,
               const std::optional<mx::array>& freq_factors, mx::StreamOrDevice s = {});
// positions = offset + arange(T)
mx::array rope(const mx::array& x, int offset, const RopeParams& params,
               const std::optional<mx::array>& freq_factors, mx::StreamOrDevice s = {});

// Throws a ValueError/TypeError naming `op` unless the head size `dim` (`dim_name`, of the input `where`), the
// parameters and freq_factors fit one another.
void check_rope_params(const RopeParams& p, int64_t dim, const char* dim_name, const std::string& where,
                       const std::optional<mx::array>& freq_factors, const char* op);

// The SPEC's per-op constants (theta_scale, YaRN magnitude) and the YaRN mix r of
// every pair (empty when ext_factor == 0), computed on the host for every backend.
ggml_ext::cpu::RopeAngles rope_angles(const RopeParams& p, bool inverse);
std::vector<float> rope_ramp(const RopeParams& p);

// How a non-empty, validated RoPE evaluation's inputs are laid out, for every backend's kernel arguments: x as
// batches x tokens x heads x dim, and how many consecutive batches share a row of positions / freq_factors.
struct RopeExtent {
  int64_t dim, heads, tokens, batches;
  int64_t batches_per_positions, batches_per_factors;
};
RopeExtent rope_extent(const std::vector<mx::array>& inputs, const RopeParams& p);

// Inputs: x (L..., T, H, D) (or (L..., H, T, D) with heads_first), positions (Gp..., T) int32 and optionally
// freq_factors (Gf..., n_dims/2) float32, where Gp and Gf are leading prefixes of L (the public op
// has none; vmap over positions or freq_factors adds them): batch index l uses the
// positions and freq_factors rows under its prefix. `inverse` rotates by minus the
// angle: the transpose of the rotation, which is the vjp.
class RoPE : public mx::UnaryPrimitive {
 public:
  RoPE(mx::Stream stream, const RopeParams& params, bool inverse)
      : mx::UnaryPrimitive(stream), params_(params), inverse_(inverse) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  // Re-checks the shapes, which mx.compile(shapeless=True) may change after the op's checks.
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  const RopeParams& params() const { return params_; }
  bool inverse() const { return inverse_; }

 private:
  RopeParams params_;
  bool inverse_;
};

}  // namespace mlx_ggml_ext
