#include "csrc/rope.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "rope";
constexpr float kPi = 3.14159265358979323846f;

// Where the tokens are: ggml's (..., T, H, D) or MLX's (..., H, T, D).
int token_axis(const RopeParams& p) { return p.heads_first ? -2 : -3; }
const char* layout_str(const RopeParams& p) { return p.heads_first ? "(..., H, T, D)" : "(..., T, H, D)"; }

// Builds the primitive's node; the inputs are valid and have grouped shapes that fit.
mx::array rope_node(const mx::array& x, const mx::array& positions,
                    const std::optional<mx::array>& freq_factors, const RopeParams& p, bool inverse,
                    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(x, stream), kernel_input(positions, stream)};
  if (freq_factors) inputs.push_back(kernel_input(*freq_factors, stream));
  return mx::array(x.shape(), x.dtype(), std::make_shared<RoPE>(stream, p, inverse), inputs);
}

void check_finite(float value, const char* op, const char* name, bool positive) {
  if (!std::isfinite(value) || (positive && !(value > 0.0f))) {
    throw std::invalid_argument(cat("[", op, "] ", name, positive ? " must be finite and > 0" : " must be finite",
                                    ", got ", value, "."));
  }
}

void check_x_and_params(const mx::array& x, const RopeParams& p,
                        const std::optional<mx::array>& freq_factors) {
  check_float_dtype(x, kOp, "x");
  if (x.ndim() < 3) {
    throw std::invalid_argument(cat("[", kOp, "] x must have at least 3 dimensions ", layout_str(p),
                                    p.heads_first ? " (heads_first)" : " (ggml's layout)", ", got shape ",
                                    shape_str(x.shape()), "."));
  }
  check_rope_params(p, x.shape(-1), "D = x.shape[-1]", cat("x of shape ", shape_str(x.shape())), freq_factors,
                    kOp);
}

// The primitive's inputs fit one another: positions (Gp..., T) and freq_factors
// (Gf..., n_dims/2) with Gp, Gf prefixes of x's leading axes, n_dims <= D.
void check_node_shapes(const std::vector<mx::array>& inputs, const RopeParams& p) {
  const auto& x = inputs[0];
  auto fits = [&](const mx::array& a, int last) {
    if (a.ndim() < 1 || a.ndim() > x.ndim() - 2 || a.shape(-1) != last) return false;
    for (int ax = 0; ax + 1 < a.ndim(); ++ax) {
      if (a.shape(ax) != x.shape(ax)) return false;
    }
    return true;
  };
  if (x.ndim() < 3 || x.shape(-1) % 2 != 0 || x.shape(-1) < p.n_dims) {
    throw std::invalid_argument(cat("[", kOp, "] x of shape ", shape_str(x.shape()),
                                    " does not fit n_dims = ", p.n_dims, " (", layout_str(p),
                                    " with D even and >= n_dims)."));
  }
  if (!fits(inputs[1], x.shape(token_axis(p)))) {
    throw std::invalid_argument(cat("[", kOp, "] positions of shape ", shape_str(inputs[1].shape()),
                                    " do not match x of shape ", shape_str(x.shape()), " ", layout_str(p),
                                    ": expected (T,) = (", x.shape(token_axis(p)), ",). Under mx.compile(shapeless=True), ",
                                    "positions made from an int offset keep the traced length: pass positions as an ",
                                    "array."));
  }
  if (inputs.size() > 2 && !fits(inputs[2], p.n_dims / 2)) {
    throw std::invalid_argument(cat("[", kOp, "] freq_factors of shape ", shape_str(inputs[2].shape()),
                                    " do not match n_dims/2 = ", p.n_dims / 2, "."));
  }
}

// ---------------------------------------------------------------------------
// Composed float32 math for the derivatives with respect to freq_factors. Inside the
// primitive x is (L..., T, H, D) (or (L..., H, T, D)), positions (Gp..., T) and freq_factors (Gf..., n/2).

// a (G..., n) reshaped to (G..., 1, ..., 1, tail...) with `lead` axes before the tail.
mx::array with_group_prefix(const mx::array& a, int lead, const mx::Shape& tail, mx::StreamOrDevice s) {
  mx::Shape shape(a.shape().begin(), a.shape().end() - 1);
  shape.resize(lead, 1);
  shape.insert(shape.end(), tail.begin(), tail.end());
  return mx::reshape(a, shape, s);
}

// The two members of every rotated pair, (..., n_dims/2) each.
std::pair<mx::array, mx::array> split_pairs(const mx::array& a, const RopeParams& p, mx::StreamOrDevice s) {
  auto last_axis = [&](int start, int stop, int step) {
    mx::Shape starts(a.ndim(), 0), stops = a.shape(), strides(a.ndim(), 1);
    starts.back() = start;
    stops.back() = stop;
    strides.back() = step;
    return mx::slice(a, starts, stops, strides, s);
  };
  const int half = p.n_dims / 2;
  if (p.mode == RopeMode::neox) return {last_axis(0, half, 1), last_axis(half, p.n_dims, 1)};
  return {last_axis(0, p.n_dims, 2), last_axis(1, p.n_dims, 2)};
}

// split_pairs' inverse, with zeros in the unrotated [n_dims, dim).
mx::array join_pairs(const mx::array& first, const mx::array& second, int dim, const RopeParams& p,
                     mx::StreamOrDevice s) {
  mx::array rotated = mx::concatenate({first, second}, -1, s);
  if (p.mode == RopeMode::normal) {
    mx::Shape shape = first.shape();
    shape.back() = p.n_dims;
    rotated = mx::reshape(mx::stack({first, second}, -1, s), shape, s);
  }
  if (dim == p.n_dims) return rotated;
  mx::Shape rest = rotated.shape();
  rest.back() = dim - p.n_dims;
  return mx::concatenate({rotated, mx::zeros(rest, rotated.dtype(), s)}, -1, s);
}

// d angle / d freq_factors for every (token, pair), broadcastable against
// (L..., T, H, n_dims/2) (or (L..., H, T, n_dims/2) with heads_first). The angle is
// theta/ff * k with k = freq_scale*(1-r) + r, so its derivative is -theta*k/ff^2.
// theta = pos * theta_scale^i uses pow rather than ggml's iterated product: a
// derivative needs no bit-matching.
mx::array angle_wrt_factors(const mx::array& positions, const mx::array& freq_factors, int lead,
                            const RopeParams& p, mx::StreamOrDevice s) {
  const int half = p.n_dims / 2;
  const auto angles = rope_angles(p, false);
  const auto ramp = rope_ramp(p);
  std::vector<float> k(half);
  for (int i = 0; i < half; ++i) {
    const float r = ramp.empty() ? 0.0f : ramp[i];
    k[i] = p.freq_scale * (1.0f - r) + r;
  }
  auto per_pair = mx::multiply(mx::power(mx::array(angles.theta_scale), mx::arange(half, mx::float32, s), s),
                               mx::array(k.data(), {half}, mx::float32), s);
  const int tokens = positions.shape(-1);
  const mx::Shape pos_tail = p.heads_first ? mx::Shape{1, tokens, 1} : mx::Shape{tokens, 1, 1};
  auto pos = with_group_prefix(mx::astype(positions, mx::float32, s), lead, pos_tail, s);
  auto ff = with_group_prefix(freq_factors, lead, {1, 1, half}, s);
  return mx::negative(mx::divide(mx::multiply(pos, per_pair, s), mx::square(ff, s), s), s);
}

}  // namespace

void check_rope_params(const RopeParams& p, int64_t dim, const char* dim_name, const std::string& where,
                       const std::optional<mx::array>& freq_factors, const char* op) {
  if (dim % 2 != 0) {
    throw std::invalid_argument(cat("[", op, "] the head dimension ", dim_name, " must be even, got D = ", dim,
                                    " in ", where, "."));
  }
  if (p.n_dims <= 0 || p.n_dims % 2 != 0 || p.n_dims > dim) {
    throw std::invalid_argument(cat("[", op, "] n_dims must be even and in [2, D = ", dim, "] for ", where,
                                    ", got ", p.n_dims, "."));
  }
  check_finite(p.freq_base, op, "freq_base", true);
  check_finite(p.freq_scale, op, "freq_scale", true);
  check_finite(p.ext_factor, op, "ext_factor", false);
  check_finite(p.attn_factor, op, "attn_factor", false);
  check_finite(p.beta_fast, op, "beta_fast", false);
  check_finite(p.beta_slow, op, "beta_slow", false);
  if (p.n_ctx_orig < 0) {
    throw std::invalid_argument(cat("[", op, "] n_ctx_orig must be >= 0, got ", p.n_ctx_orig, "."));
  }
  if (freq_factors) {
    if (freq_factors->dtype() != mx::float32) {
      throw type_error(cat("[", op, "] freq_factors must be float32, got ", dtype_str(freq_factors->dtype()), "."));
    }
    if (freq_factors->ndim() != 1 || freq_factors->shape(0) != p.n_dims / 2) {
      throw std::invalid_argument(cat("[", op, "] freq_factors must have shape (n_dims/2,) = (", p.n_dims / 2,
                                      ",), got ", shape_str(freq_factors->shape()), "."));
    }
  }
}

RopeMode rope_mode(int ggml_mode) {
  switch (ggml_mode) {
    case 0:
      return RopeMode::normal;
    case 2:
      return RopeMode::neox;
    case 8:
    case 24:
    case 40: {
      const char* name = ggml_mode == 8 ? "MROPE" : ggml_mode == 24 ? "VISION" : "IMROPE";
      throw not_implemented_error(cat("[", kOp, "] mode ", name, " (ggml mode ", ggml_mode,
                                      ") is not implemented; supported: 'normal' (0) and 'neox' (2)."));
    }
    default:
      throw std::invalid_argument(cat("[", kOp, "] unknown mode ", ggml_mode,
                                      "; expected 'normal' (0) or 'neox' (2)."));
  }
}

RopeMode rope_mode(const std::string& name) {
  if (name == "normal") return RopeMode::normal;
  if (name == "neox") return RopeMode::neox;
  if (name == "mrope") return rope_mode(8);
  if (name == "vision") return rope_mode(24);
  if (name == "imrope") return rope_mode(40);
  throw std::invalid_argument(cat("[", kOp, "] unknown mode '", name, "'; expected 'normal' (0) or 'neox' (2)."));
}

ggml_ext::cpu::RopeAngles rope_angles(const RopeParams& p, bool inverse) {
  ggml_ext::cpu::RopeAngles a{};
  // powf(freq_base, -2.0f/n_dims), rounded once from double: the iterated product
  // multiplies any error in it by the pair index, so it must be the same everywhere.
  a.theta_scale = static_cast<float>(
      std::pow(static_cast<double>(p.freq_base), static_cast<double>(-2.0f / static_cast<float>(p.n_dims))));
  a.freq_scale = p.freq_scale;
  a.mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) a.mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  a.sin_sign = inverse ? -1.0f : 1.0f;
  return a;
}

RopeExtent rope_extent(const std::vector<mx::array>& inputs, const RopeParams& p) {
  const auto& x = inputs[0];
  // heads_first: each head is a batch of one head; the batches of one row of positions are its heads.
  const int64_t dim = x.shape(-1), heads = p.heads_first ? 1 : x.shape(-2), tokens = x.shape(token_axis(p));
  const int64_t batches = static_cast<int64_t>(x.size()) / (tokens * heads * dim);
  const int64_t positions_rows = static_cast<int64_t>(inputs[1].size()) / tokens;
  const int64_t factors_rows = inputs.size() > 2 ? static_cast<int64_t>(inputs[2].size()) / (p.n_dims / 2) : 1;
  return {dim, heads, tokens, batches, batches / positions_rows, batches / factors_rows};
}

std::vector<float> rope_ramp(const RopeParams& p) {
  if (p.ext_factor == 0.0f) return {};
  // YaRN's correction range in pair indices, float32 as in the SPEC.
  auto corr_dim = [&](float beta) {
    return static_cast<float>(p.n_dims) * std::log(static_cast<float>(p.n_ctx_orig) / (beta * 2.0f * kPi)) /
           (2.0f * std::log(p.freq_base));
  };
  const float start = std::floor(corr_dim(p.beta_fast));
  const float end = std::ceil(corr_dim(p.beta_slow));
  const float low = 0.0f > start ? 0.0f : start;
  const float high = static_cast<float>(p.n_dims - 1) < end ? static_cast<float>(p.n_dims - 1) : end;
  const float width = 0.001f > high - low ? 0.001f : high - low;
  std::vector<float> ramp(p.n_dims / 2);
  for (int i = 0; i < p.n_dims / 2; ++i) {
    const float y = (static_cast<float>(i) - low) / width;
    ramp[i] = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
  }
  return ramp;
}

mx::array rope(const mx::array& x, const mx::array& positions, const RopeParams& params,
               const std::optional<mx::array>& freq_factors, mx::StreamOrDevice s) {
  check_x_and_params(x, params, freq_factors);
  if (positions.dtype() != mx::int32) {
    throw type_error(cat("[", kOp, "] positions must be int32, got ", dtype_str(positions.dtype()), "."));
  }
  const int tokens = x.shape(token_axis(params));
  if (positions.ndim() != 1 || positions.shape(0) != tokens) {
    throw std::invalid_argument(cat("[", kOp, "] positions must have shape (T,) = (", tokens, ",) for x of shape ",
                                    shape_str(x.shape()), " ", layout_str(params), ", got ",
                                    shape_str(positions.shape()), "."));
  }
  return rope_node(x, positions, freq_factors, params, false, s);
}

mx::array rope(const mx::array& x, int offset, const RopeParams& params,
               const std::optional<mx::array>& freq_factors, mx::StreamOrDevice s) {
  check_x_and_params(x, params, freq_factors);
  const int tokens = x.shape(token_axis(params));
  if (static_cast<int64_t>(offset) + tokens - 1 > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(cat("[", kOp, "] offset ", offset, " + T (", tokens, ") overflows int32 positions."));
  }
  // offset + arange(T): one arange node where offset + T fits an int, else arange(T) + offset added in int32
  // (the last position may be 2^31 - 1, where offset + T overflows).
  const bool fits_int = static_cast<int64_t>(offset) + tokens <= std::numeric_limits<int32_t>::max();
  const auto positions = fits_int ? mx::arange(offset, offset + tokens, s)
                                  : mx::add(mx::arange(tokens, s), mx::array(offset, mx::int32), s);
  return rope(x, positions, params, freq_factors, s);
}

std::vector<mx::Shape> RoPE::output_shapes(const std::vector<mx::array>& inputs) {
  check_node_shapes(inputs, params_);
  return {inputs[0].shape()};
}

bool RoPE::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RoPE&>(other);
  return params_ == o.params_ && inverse_ == o.inverse_;
}

std::vector<mx::array> RoPE::vjp(const std::vector<mx::array>& primals,
                                 const std::vector<mx::array>& cotangents,
                                 const std::vector<int>& argnums,
                                 const std::vector<mx::array>& outputs) {
  const auto s = stream();
  std::optional<mx::array> factors;
  if (primals.size() > 2) factors = primals[2];
  std::vector<mx::array> grads;
  for (int arg : argnums) {
    if (arg == 0) {
      // The rotation is orthogonal up to the scale mscale: its transpose is the
      // same op with the angle negated.
      grads.push_back(rope_node(cotangents[0], primals[1], factors, params_, !inverse_, s));
    } else if (arg == 1) {
      throw std::invalid_argument(cat("[", kOp, "] positions are integers: there is no gradient with respect to them."));
    } else {
      // dL/dangle = sign * (g1*y0 - g0*y1) per pair, then the chain rule through the angle.
      auto [y0, y1] = split_pairs(mx::astype(outputs[0], mx::float32, s), params_, s);
      auto [g0, g1] = split_pairs(mx::astype(cotangents[0], mx::float32, s), params_, s);
      auto d_angle = mx::subtract(mx::multiply(g1, y0, s), mx::multiply(g0, y1, s), s);
      if (inverse_) d_angle = mx::negative(d_angle, s);
      const int lead = primals[0].ndim() - 3;
      auto terms = mx::multiply(d_angle, angle_wrt_factors(primals[1], *factors, lead, params_, s), s);
      std::vector<int> axes;
      for (int ax = factors->ndim() - 1; ax < terms.ndim() - 1; ++ax) axes.push_back(ax);
      grads.push_back(mx::astype(mx::sum(terms, axes, false, s), factors->dtype(), s));
    }
  }
  return grads;
}

std::vector<mx::array> RoPE::jvp(const std::vector<mx::array>& primals,
                                 const std::vector<mx::array>& tangents,
                                 const std::vector<int>& argnums) {
  const auto s = stream();
  const auto& x = primals[0];
  std::optional<mx::array> factors;
  if (primals.size() > 2) factors = primals[2];
  std::optional<mx::array> out;
  for (size_t i = 0; i < argnums.size(); ++i) {
    std::optional<mx::array> term;
    if (argnums[i] == 0) {
      term = rope_node(tangents[i], primals[1], factors, params_, inverse_, s);  // linear in x
    } else if (argnums[i] == 1) {
      throw std::invalid_argument(cat("[", kOp, "] positions are integers: there is no derivative with respect to them."));
    } else {
      auto y = mx::astype(rope_node(x, primals[1], factors, params_, inverse_, s), mx::float32, s);
      auto [y0, y1] = split_pairs(y, params_, s);
      const int lead = x.ndim() - 3;
      auto tangent = with_group_prefix(tangents[i], lead, {1, 1, params_.n_dims / 2}, s);
      auto d_angle = mx::multiply(angle_wrt_factors(primals[1], *factors, lead, params_, s), tangent, s);
      if (inverse_) d_angle = mx::negative(d_angle, s);
      // d y0/d angle = -y1, d y1/d angle = y0 (signs flipped for the inverse rotation)
      term = mx::astype(join_pairs(mx::negative(mx::multiply(y1, d_angle, s), s), mx::multiply(y0, d_angle, s),
                                   x.shape(-1), params_, s),
                        x.dtype(), s);
    }
    out = out ? mx::add(*out, *term, s) : *term;
  }
  return {*out};
}

std::pair<std::vector<mx::array>, std::vector<int>> RoPE::vmap(const std::vector<mx::array>& inputs,
                                                               const std::vector<int>& axes) {
  const auto s = stream();
  auto x = inputs[0];
  auto positions = inputs[1];
  std::optional<mx::array> factors;
  if (inputs.size() > 2) factors = inputs[2];
  const bool factors_batched = factors && axes[2] >= 0;
  if (axes[1] < 0 && !factors_batched) {
    // Only x is batched: any axis outside the groups and (T, H, D) maps straight through.
    const int group_axes = std::max<int>(positions.ndim() - 1, factors ? factors->ndim() - 1 : 0);
    int x_ax = axes[0];
    if (x_ax < group_axes || x_ax >= x.ndim() - 3) {
      x = mx::moveaxis(x, x_ax, group_axes, s);
      x_ax = group_axes;
    }
    return {{rope_node(x, positions, factors, params_, inverse_, s)}, {x_ax}};
  }
  // Batched positions or freq_factors: the vmapped axis becomes a new leading group
  // axis of every input that has groups or is batched.
  const int batch = axes[1] >= 0 ? positions.shape(axes[1]) : factors->shape(axes[2]);
  auto lead_with_batch = [&](const mx::array& a, int ax, bool grouped) {
    if (ax >= 0) return mx::moveaxis(a, ax, 0, s);
    if (!grouped) return a;
    mx::Shape shape = a.shape();
    shape.insert(shape.begin(), batch);
    return mx::broadcast_to(a, shape, s);
  };
  x = lead_with_batch(x, axes[0], true);
  positions = lead_with_batch(positions, axes[1], positions.ndim() > 1);
  if (factors) factors = lead_with_batch(*factors, axes[2], factors->ndim() > 1);
  return {{rope_node(x, positions, factors, params_, inverse_, s)}, {0}};
}

}  // namespace mlx_ggml_ext
