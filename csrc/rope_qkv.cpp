#include "csrc/rope_qkv.h"
#include "csrc/rms_norm.h"

#include <algorithm>
#include <cmath>

#include "mlx/transforms.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "rope_qkv";

// int64: three int counts' sum (checked against qkv's last axis before any shape uses it).
int64_t total_heads(QkvHeads h) { return static_cast<int64_t>(h.q) + h.k + h.v; }

// qkv (..., T, F) read as (..., T, H, D); the inputs fit (checked).
mx::Shape heads_shape(const mx::array& qkv, QkvHeads heads) {
  mx::Shape shape(qkv.shape().begin(), qkv.shape().end() - 1);
  const int64_t total = total_heads(heads);
  shape.insert(shape.end(), {static_cast<int>(total), static_cast<int>(qkv.shape(-1) / total)});
  return shape;
}

// Shapes of q, k, v for qkv (..., T, F); the inputs fit (checked).
std::vector<mx::Shape> qkv_shapes(const mx::array& qkv, QkvHeads heads) {
  const int tokens = qkv.shape(-2), dim = static_cast<int>(qkv.shape(-1) / total_heads(heads));
  mx::Shape lead(qkv.shape().begin(), qkv.shape().end() - 2);
  std::vector<mx::Shape> shapes;
  for (int h : {heads.q, heads.k, heads.v}) {
    if (h == 0) break;
    mx::Shape s = lead;
    s.insert(s.end(), {h, tokens, dim});
    shapes.push_back(s);
  }
  return shapes;
}

// Everything but the dtypes, which only the op checks (the node's inputs keep them).
void check_shapes(const mx::array& qkv, const mx::array& positions, QkvHeads heads, const RopeParams& p,
                  const std::optional<mx::array>& freq_factors, const std::optional<mx::array>& q_norm,
                  const std::optional<mx::array>& k_norm) {
  if (heads.q <= 0 || heads.k <= 0 || (heads.v != 0 && heads.v != heads.k)) {
    throw std::invalid_argument(cat("[", kOp, "] heads and kv_heads must be > 0, got ", heads.q, " and ", heads.k,
                                    "."));
  }
  const char* layout = heads.v ? "(heads + 2*kv_heads)" : "(heads + kv_heads)";
  if (qkv.ndim() < 2) {
    throw std::invalid_argument(cat("[", kOp, "] qkv must be (..., T, ", layout, " * D), got shape ",
                                    shape_str(qkv.shape()), "."));
  }
  const int64_t features = qkv.shape(-1), total = total_heads(heads);
  if (features % total != 0) {
    throw std::invalid_argument(cat("[", kOp, "] qkv's last axis (", features, ") is not a multiple of ", layout,
                                    " = ", total, " (qkv of shape ", shape_str(qkv.shape()), ")."));
  }
  check_rope_params(p, features / total, heads.v ? "D = qkv.shape[-1] / (heads + 2*kv_heads)"
                                                 : "D = qkv.shape[-1] / (heads + kv_heads)",
                    cat("qkv of shape ", shape_str(qkv.shape()), " with ", total, " heads"), freq_factors, kOp);
  if (positions.ndim() != 1 || positions.shape(0) != qkv.shape(-2)) {
    throw std::invalid_argument(cat("[", kOp, "] positions must have shape (T,) = (", qkv.shape(-2),
                                    ",) for qkv of shape ", shape_str(qkv.shape()), ", got ",
                                    shape_str(positions.shape()), "."));
  }
  if (q_norm.has_value() != k_norm.has_value()) {
    throw std::invalid_argument(cat("[", kOp, "] q_norm and k_norm go together: give both or neither."));
  }
  for (const auto* w : {&q_norm, &k_norm}) {
    if (*w && ((*w)->ndim() != 1 || (*w)->shape(0) != features / total)) {
      throw std::invalid_argument(cat("[", kOp, "] ", w == &q_norm ? "q_norm" : "k_norm", " must have shape (D,) = (",
                                      features / total, ",), got ", shape_str((*w)->shape()), "."));
    }
  }
}

// The optional inputs of a node's input list: freq_factors, q_norm, k_norm.
struct Optionals {
  std::optional<mx::array> factors, q_norm, k_norm;
};
Optionals optionals(const std::vector<mx::array>& in, bool has_factors, bool norm) {
  Optionals o;
  size_t next = 2;
  if (has_factors) o.factors = in[next++];
  if (norm) o.q_norm = in[next], o.k_norm = in[next + 1];
  return o;
}

// The same numbers as ops: reshape, split, RMSNorm and RoPE on q and k, heads first. The primitive's
// transformations (in: the node's inputs).
GraphFn unfused(const RopeParams& p, QkvHeads heads, QkNorm norm, bool has_factors, mx::Stream s) {
  return [p, heads, norm, has_factors, s](const std::vector<mx::array>& in) {
    const auto& qkv = in[0];
    const auto heads_of = mx::reshape(qkv, heads_shape(qkv, heads), s);
    auto parts = heads.v ? mx::split(heads_of, mx::Shape{heads.q, heads.q + heads.k}, -2, s)
                         : mx::split(heads_of, mx::Shape{heads.q}, -2, s);
    const auto o = optionals(in, has_factors, norm.on);
    if (norm.on) {  // in float32, as the kernel norms (and then rounds once, after the rotation)
      parts[0] = rms_norm(mx::astype(parts[0], mx::float32, s), o.q_norm, norm.eps, s);
      parts[1] = rms_norm(mx::astype(parts[1], mx::float32, s), o.k_norm, norm.eps, s);
    }
    auto rotated = [&](const mx::array& a) {
      return mx::swapaxes(mx::astype(rope(a, in[1], p, o.factors, s), qkv.dtype(), s), -3, -2, s);
    };
    std::vector<mx::array> out = {rotated(parts[0]), rotated(parts[1])};
    if (heads.v) out.push_back(mx::swapaxes(parts[2], -3, -2, s));
    return out;
  };
}

// The unfused graph as a function of every input but the positions (integers, not differentiated).
GraphFn without_positions(GraphFn f, const mx::array& positions) {
  return [f, positions](const std::vector<mx::array>& in) {
    std::vector<mx::array> all = in;
    all.insert(all.begin() + 1, positions);
    return f(all);
  };
}

std::vector<mx::array> without_positions(const std::vector<mx::array>& primals) {
  std::vector<mx::array> rest = primals;
  rest.erase(rest.begin() + 1);
  return rest;
}

// The inputs' indices among those of without_positions (positions excluded by check_no_positions).
std::vector<int> indices_without_positions(const std::vector<int>& argnums) {
  std::vector<int> indices;
  for (int arg : argnums) indices.push_back(arg == 0 ? 0 : arg - 1);
  return indices;
}

void check_no_positions(const std::vector<int>& argnums) {
  if (std::find(argnums.begin(), argnums.end(), 1) != argnums.end()) {
    throw std::invalid_argument(
        cat("[", kOp, "] positions are integers: there is no derivative with respect to them."));
  }
}

}  // namespace

std::vector<mx::array> rope_qkv(const mx::array& qkv, const mx::array& positions, QkvHeads heads,
                                const RopeParams& params, const std::optional<mx::array>& freq_factors,
                                const std::optional<mx::array>& q_norm, const std::optional<mx::array>& k_norm,
                                float norm_eps, mx::StreamOrDevice s) {
  check_float_dtype(qkv, kOp, "qkv");
  if (positions.dtype() != mx::int32) {
    throw type_error(cat("[", kOp, "] positions must be int32, got ", dtype_str(positions.dtype()), "."));
  }
  if (q_norm) check_float_dtype(*q_norm, kOp, "q_norm");
  if (k_norm) check_float_dtype(*k_norm, kOp, "k_norm");
  if (!std::isfinite(norm_eps) || norm_eps < 0.0f) {
    throw std::invalid_argument(cat("[", kOp, "] norm_eps must be finite and >= 0, got ", norm_eps, "."));
  }
  if (params.heads_first) throw std::invalid_argument(cat("[", kOp, "] heads_first does not apply."));
  check_shapes(qkv, positions, heads, params, freq_factors, q_norm, k_norm);
  const auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(qkv, stream), kernel_input(positions, stream)};
  if (freq_factors) inputs.push_back(kernel_input(*freq_factors, stream));
  const QkNorm norm{q_norm.has_value(), norm_eps};
  if (norm.on) {  // the kernels read float32 weights
    inputs.push_back(kernel_input(mx::astype(*q_norm, mx::float32, stream), stream));
    inputs.push_back(kernel_input(mx::astype(*k_norm, mx::float32, stream), stream));
  }
  const auto shapes = qkv_shapes(qkv, heads);
  return mx::array::make_arrays(shapes, std::vector<mx::Dtype>(shapes.size(), qkv.dtype()),
                                std::make_shared<RopeQKV>(stream, params, heads, norm, freq_factors.has_value()),
                                inputs);
}

std::vector<mx::Shape> RopeQKV::output_shapes(const std::vector<mx::array>& inputs) {
  const auto o = optionals(inputs, has_factors_, norm_.on);
  check_shapes(inputs[0], inputs[1], heads_, params_, o.factors, o.q_norm, o.k_norm);
  return qkv_shapes(inputs[0], heads_);
}

bool RopeQKV::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RopeQKV&>(other);
  return params_ == o.params_ && heads_ == o.heads_ && norm_ == o.norm_ && has_factors_ == o.has_factors_;
}

std::vector<mx::array> RopeQKV::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums, const std::vector<mx::array>&) {
  check_no_positions(argnums);
  const auto f = without_positions(unfused(params_, heads_, norm_, has_factors_, stream()), primals[1]);
  return vjp_through(f, without_positions(primals), cotangents, indices_without_positions(argnums));
}

std::vector<mx::array> RopeQKV::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                    const std::vector<int>& argnums) {
  check_no_positions(argnums);
  const auto f = without_positions(unfused(params_, heads_, norm_, has_factors_, stream()), primals[1]);
  return jvp_through(f, without_positions(primals), tangents, indices_without_positions(argnums), stream());
}

std::pair<std::vector<mx::array>, std::vector<int>> RopeQKV::vmap(const std::vector<mx::array>& inputs,
                                                                  const std::vector<int>& axes) {
  const std::vector<int> out_axes(heads_.v ? 3 : 2, 0);
  return {mx::vmap(unfused(params_, heads_, norm_, has_factors_, stream()), axes, out_axes)(inputs), out_axes};
}

RopeExtent RopeQKV::heads_extent(const std::vector<mx::array>& inputs, const mx::array& buffer) const {
  std::vector<mx::array> as_heads(inputs.begin(), inputs.begin() + rope_inputs());
  as_heads[0] = buffer;
  return rope_extent(as_heads, params_);
}

mx::array rope_qkv_buffer(const mx::array& qkv, QkvHeads heads) {
  return mx::array(heads_shape(qkv, heads), qkv.dtype(), nullptr, {});
}

void rope_qkv_views(const mx::array& buffer, QkvHeads heads, std::vector<mx::array>& outputs) {
  const int nd = buffer.ndim();  // (..., T, H, D), as every output (..., Hj, T, D)
  const int64_t dim = buffer.shape(-1), row = buffer.shape(-2) * dim;
  int64_t first_head = 0;
  for (auto& out : outputs) {
    // (..., Hj, T, D): the leading axes as the buffer's, then the head, token and element strides.
    mx::Strides strides(buffer.strides().begin(), buffer.strides().begin() + (nd - 3));
    strides.insert(strides.end(), {dim, row, 1});
    // A size-1 axis takes the stride that keeps the view row-contiguous where it can be (a decode token's q is
    // (1, Hq, 1, D): contiguous, whatever the token stride).
    for (int i = nd - 1; i >= 0; --i) {
      if (out.shape(i) == 1) strides[i] = i + 1 < nd ? strides[i + 1] * out.shape(i + 1) : 1;
    }
    size_t data_size = out.size() == 0 ? 0 : 1;
    for (int i = 0; i < nd && data_size > 0; ++i) data_size += (out.shape(i) - 1) * strides[i];
    out.copy_shared_buffer(buffer, strides, view_flags(out.shape(), strides, data_size), data_size,
                           first_head * dim);
    first_head += out.shape(-3);
  }
}

}  // namespace mlx_ggml_ext
