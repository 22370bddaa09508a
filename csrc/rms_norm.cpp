#include "csrc/rms_norm.h"

#include <cmath>
#include <numeric>

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "rms_norm";

// Builds the primitive's node; x and weight already have their final dtype and a
// valid grouped shape.
mx::array rms_norm_node(const mx::array& x, const std::optional<mx::array>& weight, float eps,
                        mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(x, stream)};
  if (weight) inputs.push_back(kernel_input(*weight, stream));
  return mx::array(x.shape(), x.dtype(), std::make_shared<RMSNorm>(stream, eps), inputs);
}

// The weight's grouped shape broadcast against x: (G..., 1 for each R axis, D).
mx::array weight_for_broadcast(const mx::array& w, const mx::array& x) {
  mx::Shape shape(w.shape().begin(), w.shape().end() - 1);
  shape.resize(x.ndim() - 1, 1);
  shape.push_back(w.shape().back());
  return mx::reshape(w, shape);
}

struct Normalized {
  mx::array xf;   // x in float32
  mx::array inv;  // 1 / sqrt(mean(x^2) + eps), keepdims
};

Normalized normalize_f32(const mx::array& x, float eps, mx::StreamOrDevice s) {
  auto xf = mx::astype(x, mx::float32, s);
  auto ms = mx::mean(mx::square(xf, s), -1, /*keepdims=*/true, s);
  return {xf, mx::rsqrt(mx::add(ms, mx::array(eps, mx::float32), s), s)};
}

// Sums a full-shape (G..., R..., D) array down to the weight's (G..., D).
mx::array reduce_to_weight(const mx::array& a, const mx::array& w, mx::StreamOrDevice s) {
  std::vector<int> axes;
  for (int ax = w.ndim() - 1; ax < a.ndim() - 1; ++ax) axes.push_back(ax);
  return axes.empty() ? a : mx::sum(a, axes, /*keepdims=*/false, s);
}

}  // namespace

mx::Dtype checked_norm_dtype(const char* op, const mx::array& x, const std::optional<mx::array>& weight, float eps) {
  check_float_dtype(x, op, "x");
  if (x.ndim() == 0) {
    throw std::invalid_argument(cat("[", op, "] x must have at least one dimension, got a 0-d array."));
  }
  if (!(eps >= 0.0f) || std::isinf(eps)) {
    throw std::invalid_argument(cat("[", op, "] eps must be finite and >= 0, got ", eps, "."));
  }
  if (!weight) return x.dtype();
  check_float_dtype(*weight, op, "weight");
  if (weight->ndim() != 1 || weight->shape(0) != x.shape(-1)) {
    throw std::invalid_argument(cat("[", op, "] weight must have shape (", x.shape(-1),
                                    ",) to match the last axis of x ", shape_str(x.shape()),
                                    ", got ", shape_str(weight->shape()), "."));
  }
  return mx::promote_types(x.dtype(), weight->dtype());
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps,
                   mx::StreamOrDevice s) {
  const mx::Dtype out_dtype = checked_norm_dtype(kOp, x, weight, eps);
  std::optional<mx::array> w;
  if (weight) w = mx::astype(*weight, out_dtype, s);
  return rms_norm_node(mx::astype(x, out_dtype, s), w, eps, s);
}

bool RMSNorm::is_equivalent(const mx::Primitive& other) const {
  return eps_ == static_cast<const RMSNorm&>(other).eps_;
}

std::vector<mx::array> RMSNorm::vjp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums,
                                    const std::vector<mx::array>&) {
  const auto s = stream();
  const auto& x = primals[0];
  const bool weighted = primals.size() > 1;
  auto [xf, inv] = normalize_f32(x, eps_, s);
  auto g = mx::astype(cotangents[0], mx::float32, s);
  std::vector<mx::array> grads;
  for (int arg : argnums) {
    if (arg == 0) {
      // d/dx of x*inv: inv*gw - x*inv^3*mean(gw*x), with gw = g*weight
      auto gw = weighted ? mx::multiply(g, mx::astype(weight_for_broadcast(primals[1], x), mx::float32, s), s) : g;
      auto proj = mx::mean(mx::multiply(gw, xf, s), -1, true, s);
      auto gx = mx::subtract(mx::multiply(gw, inv, s),
                             mx::multiply(xf, mx::multiply(mx::power(inv, mx::array(3.0f), s), proj, s), s), s);
      grads.push_back(mx::astype(gx, x.dtype(), s));
    } else {
      auto gw = reduce_to_weight(mx::multiply(g, mx::multiply(xf, inv, s), s), primals[1], s);
      grads.push_back(mx::astype(gw, primals[1].dtype(), s));
    }
  }
  return grads;
}

std::vector<mx::array> RMSNorm::jvp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& tangents,
                                    const std::vector<int>& argnums) {
  const auto s = stream();
  const auto& x = primals[0];
  const bool weighted = primals.size() > 1;
  auto [xf, inv] = normalize_f32(x, eps_, s);
  std::optional<mx::array> out;
  for (size_t i = 0; i < argnums.size(); ++i) {
    auto t = mx::astype(tangents[i], mx::float32, s);
    mx::array term = mx::array(0.0f);
    if (argnums[i] == 0) {
      // inv*t - x*inv^3*mean(x*t), times the weight
      auto proj = mx::mean(mx::multiply(xf, t, s), -1, true, s);
      term = mx::subtract(mx::multiply(t, inv, s),
                          mx::multiply(xf, mx::multiply(mx::power(inv, mx::array(3.0f), s), proj, s), s), s);
      if (weighted) term = mx::multiply(term, mx::astype(weight_for_broadcast(primals[1], x), mx::float32, s), s);
    } else {
      term = mx::multiply(mx::multiply(xf, inv, s), weight_for_broadcast(t, x), s);
    }
    out = out ? mx::add(*out, term, s) : term;
  }
  return {mx::astype(*out, x.dtype(), s)};
}

std::pair<std::vector<mx::array>, std::vector<int>> RMSNorm::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  const auto s = stream();
  auto x = inputs[0];
  int x_ax = axes[0];
  const bool weight_batched = inputs.size() > 1 && axes[1] >= 0;
  if (!weight_batched) {
    // Any x axis maps straight through but the normalized one and, with a grouped
    // weight, the group axes: those move to just after the groups.
    const int group_axes = inputs.size() > 1 ? inputs[1].ndim() - 1 : 0;
    if (x_ax == x.ndim() - 1 || x_ax < group_axes) {
      x = mx::moveaxis(x, x_ax, group_axes, s);
      x_ax = group_axes;
    }
    std::optional<mx::array> w;
    if (inputs.size() > 1) w = inputs[1];
    return {{rms_norm_node(x, w, eps_, s)}, {x_ax}};
  }
  // A batched weight becomes a new leading group axis shared with x.
  auto w = mx::moveaxis(inputs[1], axes[1], 0, s);
  if (x_ax < 0) {
    mx::Shape shape = x.shape();
    shape.insert(shape.begin(), w.shape(0));
    x = mx::broadcast_to(x, shape, s);
  } else {
    x = mx::moveaxis(x, x_ax, 0, s);
  }
  return {{rms_norm_node(x, w, eps_, s)}, {0}};
}

}  // namespace mlx_ggml_ext
