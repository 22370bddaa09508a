#include "csrc/glu.h"

#include <cmath>

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "glu";

mx::array glu_node(const std::vector<mx::array>& inputs, GluKind kind, GluParams params, bool fused,
                   mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  mx::Shape shape = inputs[0].shape();
  if (fused) shape.back() /= 2;
  std::vector<mx::array> contiguous;
  for (const auto& a : inputs) contiguous.push_back(kernel_input(a, stream));
  return mx::array(shape, inputs[0].dtype(), std::make_shared<GLU>(stream, kind, params, fused), contiguous);
}

struct Halves {
  mx::array gate, up;
};

Halves split_fused(const mx::array& x, mx::StreamOrDevice s) {
  auto parts = mx::split(x, 2, -1, s);
  return {parts[0], parts[1]};
}

// out = act(gate) * lin(up), with its partial derivatives, in float32 from MLX's ops (for the transformations):
// act(g), slope = act'(g), lin(u) and lin_slope = lin'(u) (absent where lin(u) = u).
struct Terms {
  mx::array act, slope, lin;
  std::optional<mx::array> lin_slope;
};

std::pair<mx::array, mx::array> activation_and_slope(const mx::array& g, GluKind kind, mx::StreamOrDevice s);

Terms glu_terms(const mx::array& gate, const mx::array& up, GluKind kind, const GluParams& p, mx::StreamOrDevice s) {
  const auto g = mx::astype(gate, mx::float32, s), u = mx::astype(up, mx::float32, s);
  if (kind != GluKind::swiglu_oai) {
    auto [act, slope] = activation_and_slope(g, kind, s);
    return {act, slope, u, std::nullopt};
  }
  // x = min(g, L), y = clamp(u, -L, L), out = f(x) (y + 1) with f(x) = x sigmoid(a x),
  // f'(x) = s (1 + a x (1 - s)). The clamps pass the derivative only inside the limits (zero past them).
  const auto limit = mx::array(p.limit), one = mx::array(1.0f);
  const auto x = mx::minimum(g, limit, s);
  const auto ax = mx::multiply(mx::array(p.alpha), x, s);
  const auto sg = mx::sigmoid(ax, s);
  const auto f_slope = mx::multiply(sg, mx::add(one, mx::multiply(ax, mx::subtract(one, sg, s), s), s), s);
  const auto gate_inside = mx::less(g, limit, s);
  const auto up_inside = mx::logical_and(mx::less(u, limit, s), mx::greater(u, mx::negative(limit, s), s), s);
  return {mx::multiply(x, sg, s), mx::where(gate_inside, f_slope, mx::array(0.0f), s),
          mx::add(mx::clip(u, mx::negative(limit, s), limit, s), one, s), mx::astype(up_inside, mx::float32, s)};
}

// act(g) and act'(g) of the unclamped kinds (g float32).
std::pair<mx::array, mx::array> activation_and_slope(const mx::array& g, GluKind kind, mx::StreamOrDevice s) {
  auto f = [](double v) { return mx::array(static_cast<float>(v)); };
  switch (kind) {
    case GluKind::swiglu: {
      // silu(g) = g s, silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
      const auto sg = mx::sigmoid(g, s);
      const auto slope = mx::multiply(sg, mx::add(f(1), mx::multiply(g, mx::subtract(f(1), sg, s), s), s), s);
      return {mx::multiply(g, sg, s), slope};
    }
    case GluKind::geglu: {
      // 0.5 g (1 + tanh(v)), v = k (g + c g^3); slope 0.5 (1 + tanh v) + 0.5 g (1 - tanh^2 v) k (1 + 3 c g^2)
      const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
      const auto g2 = mx::square(g, s);
      const auto th = mx::tanh(mx::multiply(f(k), mx::multiply(g, mx::add(f(1), mx::multiply(f(c), g2, s), s), s), s), s);
      const auto half_one_plus = mx::multiply(f(0.5), mx::add(f(1), th, s), s);
      const auto dv = mx::multiply(f(k), mx::add(f(1), mx::multiply(f(3 * c), g2, s), s), s);
      const auto slope = mx::add(half_one_plus, mx::multiply(mx::multiply(f(0.5), g, s),
                                                             mx::multiply(mx::subtract(f(1), mx::square(th, s), s), dv, s), s), s);
      return {mx::multiply(g, half_one_plus, s), slope};
    }
    case GluKind::geglu_erf: {
      // g Phi(g); slope Phi(g) + g phi(g)
      const auto cdf = mx::multiply(f(0.5), mx::add(f(1), mx::erf(mx::multiply(f(M_SQRT1_2), g, s), s), s), s);
      const auto pdf = mx::multiply(f(0.5 * M_2_SQRTPI * M_SQRT1_2),
                                    mx::exp(mx::multiply(f(-0.5), mx::square(g, s), s), s), s);
      return {mx::multiply(g, cdf, s), mx::add(cdf, mx::multiply(g, pdf, s), s)};
    }
    case GluKind::swiglu_oai: break;  // glu_terms
  }
  throw std::logic_error("unknown GLU kind");
}

}  // namespace

GluKind glu_kind(const std::string& name) {
  if (name == "swiglu") return GluKind::swiglu;
  if (name == "geglu") return GluKind::geglu;
  if (name == "geglu_erf") return GluKind::geglu_erf;
  if (name == "swiglu_oai") return GluKind::swiglu_oai;
  throw std::invalid_argument(
      cat("[", kOp, "] kind must be 'swiglu', 'geglu', 'geglu_erf' or 'swiglu_oai', got '", name, "'."));
}

GluParams glu_params(GluKind kind, std::optional<float> alpha, std::optional<float> limit) {
  if (kind != GluKind::swiglu_oai) {
    if (alpha || limit) {
      throw std::invalid_argument(cat("[", kOp, "] alpha and limit belong to kind 'swiglu_oai'; kind '",
                                      glu_kind_name(kind), "' takes neither."));
    }
    return {};
  }
  GluParams p;
  if (alpha) p.alpha = *alpha;
  if (limit) p.limit = *limit;
  if (!std::isfinite(p.alpha) || !std::isfinite(p.limit) || !(p.limit > 0.0f)) {
    throw std::invalid_argument(cat("[", kOp, "] swiglu_oai needs a finite alpha and a finite limit > 0, got "
                                    "alpha = ", p.alpha, ", limit = ", p.limit, "."));
  }
  return p;
}

const char* glu_kind_name(GluKind kind) {
  switch (kind) {
    case GluKind::swiglu: return "swiglu";
    case GluKind::geglu: return "geglu";
    case GluKind::geglu_erf: return "geglu_erf";
    case GluKind::swiglu_oai: return "swiglu_oai";
  }
  return "?";
}

mx::array glu(const mx::array& gate, const std::optional<mx::array>& up, GluKind kind, GluParams params,
              mx::StreamOrDevice s) {
  check_float_dtype(gate, kOp, up ? "gate" : "x");
  if (!up) {
    if (gate.ndim() == 0 || gate.shape(-1) % 2 != 0) {
      throw std::invalid_argument(cat("[", kOp, "] a single input holds gate and up as the two halves of its last "
                                      "axis, which must be even; got shape ", shape_str(gate.shape()), "."));
    }
    return glu_node({gate}, kind, params, /*fused=*/true, s);
  }
  check_float_dtype(*up, kOp, "up");
  if (gate.shape() != up->shape()) {
    throw std::invalid_argument(cat("[", kOp, "] gate and up must have the same shape (as in ggml; no "
                                    "broadcasting), got ", shape_str(gate.shape()), " and ", shape_str(up->shape()),
                                    "."));
  }
  const auto dtype = mx::promote_types(gate.dtype(), up->dtype());
  return glu_node({mx::astype(gate, dtype, s), mx::astype(*up, dtype, s)}, kind, params, /*fused=*/false, s);
}

bool GLU::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const GLU&>(other);
  return kind_ == o.kind_ && fused_ == o.fused_ && params_.alpha == o.params_.alpha &&
         params_.limit == o.params_.limit;
}

std::vector<mx::Shape> GLU::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  if (fused_) shape.back() /= 2;
  return {shape};
}

GLU::Layout GLU::layout(const mx::array& out) const {
  if (fused_) {
    const int64_t cols = out.shape(-1);
    return {static_cast<int64_t>(out.size()) / cols, cols, 2 * cols, cols};
  }
  // Two same-shaped arrays: one long row.
  const int64_t n = static_cast<int64_t>(out.size());
  return {1, n, n, 0};
}

std::vector<mx::array> GLU::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                const std::vector<int>& argnums, const std::vector<mx::array>&) {
  const auto s = stream();
  const auto [gate, up] = fused_ ? split_fused(primals[0], s) : Halves{primals[0], primals[1]};
  const auto terms = glu_terms(gate, up, kind_, params_, s);
  const auto c = mx::astype(cotangents[0], mx::float32, s);
  const auto dtype = primals[0].dtype();
  const auto d_gate = mx::astype(mx::multiply(mx::multiply(c, terms.slope, s), terms.lin, s), dtype, s);
  auto c_act = mx::multiply(c, terms.act, s);
  if (terms.lin_slope) c_act = mx::multiply(c_act, *terms.lin_slope, s);
  const auto d_up = mx::astype(c_act, dtype, s);
  if (fused_) return {mx::concatenate({d_gate, d_up}, -1, s)};
  std::vector<mx::array> grads;
  for (int arg : argnums) grads.push_back(arg == 0 ? d_gate : d_up);
  return grads;
}

std::vector<mx::array> GLU::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                const std::vector<int>& argnums) {
  const auto s = stream();
  const auto [gate, up] = fused_ ? split_fused(primals[0], s) : Halves{primals[0], primals[1]};
  const auto terms = glu_terms(gate, up, kind_, params_, s);
  std::optional<mx::array> t_gate, t_up;
  if (fused_) {
    auto halves = split_fused(tangents[0], s);
    t_gate = halves.gate;
    t_up = halves.up;
  } else {
    for (size_t i = 0; i < argnums.size(); ++i) (argnums[i] == 0 ? t_gate : t_up) = tangents[i];
  }
  mx::array out = mx::zeros(terms.act.shape(), mx::float32, s);
  if (t_gate) {
    const auto d_gate = mx::multiply(terms.slope, mx::astype(*t_gate, mx::float32, s), s);
    out = mx::add(out, mx::multiply(d_gate, terms.lin, s), s);
  }
  if (t_up) {
    auto d_up = mx::multiply(terms.act, mx::astype(*t_up, mx::float32, s), s);
    out = mx::add(out, terms.lin_slope ? mx::multiply(d_up, *terms.lin_slope, s) : d_up, s);
  }
  return {mx::astype(out, primals[0].dtype(), s)};
}

std::pair<std::vector<mx::array>, std::vector<int>> GLU::vmap(const std::vector<mx::array>& inputs,
                                                              const std::vector<int>& axes) {
  const auto s = stream();
  if (fused_) {
    // Any axis but the split one maps straight through.
    auto x = inputs[0];
    int ax = axes[0];
    if (ax == x.ndim() - 1) {
      x = mx::moveaxis(x, ax, 0, s);
      ax = 0;
    }
    return {{glu_node({x}, kind_, params_, true, s)}, {ax}};
  }
  // Both operands batched along a leading axis; an unbatched one is broadcast to it.
  const int batch = axes[0] >= 0 ? inputs[0].shape(axes[0]) : inputs[1].shape(axes[1]);
  std::vector<mx::array> moved;
  for (int i = 0; i < 2; ++i) {
    if (axes[i] >= 0) {
      moved.push_back(mx::moveaxis(inputs[i], axes[i], 0, s));
    } else {
      mx::Shape shape = inputs[i].shape();
      shape.insert(shape.begin(), batch);
      moved.push_back(mx::broadcast_to(inputs[i], shape, s));
    }
  }
  return {{glu_node(moved, kind_, params_, false, s)}, {0}};
}

}  // namespace mlx_ggml_ext
