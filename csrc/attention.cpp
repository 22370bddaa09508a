#include "csrc/attention.h"

#include <cmath>
#include <functional>

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "attention";
constexpr int kMaxCudaHeadDim = Attention::kMaxCudaHeadDim;
constexpr int kMaxMetalHeadDim = Attention::kMaxMetalHeadDim;

// inputs: q, k, v, then the mask and the sinks where given (has_sinks says whether the last one is the sinks).
mx::array attention_node(const std::vector<mx::array>& inputs, float scale, float softcap, bool causal,
                         bool has_sinks, mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  // q, k and v are read through their strides (a KV cache's slice needs no copy); the mask and sinks row-major.
  std::vector<mx::array> operands = {inputs[0], inputs[1], inputs[2]};
  for (size_t i = 3; i < inputs.size(); ++i) operands.push_back(row_contiguous(inputs[i], stream));
  const auto& q = inputs[0];
  mx::Shape shape = {q.shape(0), q.shape(1), q.shape(2), inputs[2].shape(3)};
  return mx::array(shape, q.dtype(), std::make_shared<Attention>(stream, scale, softcap, causal, has_sinks),
                   operands);
}

void check_4d(const mx::array& a, const char* name) {
  check_float_dtype(a, kOp, name);
  if (a.ndim() != 4) {
    throw std::invalid_argument(cat("[", kOp, "] ", name, " must be 4-D (B, H, T, D) as in mlx-lm, got shape ",
                                    shape_str(a.shape()), "."));
  }
}

// The mask as the kernel reads it: float32, 4-D, each axis 1 or the full (B, Hq, Tq, Tk) size.
mx::array kernel_mask(const mx::array& mask, const mx::Shape& full, mx::StreamOrDevice s) {
  if (mask.ndim() > 4) {
    throw std::invalid_argument(cat("[", kOp, "] mask must have at most 4 dimensions, got shape ",
                                    shape_str(mask.shape()), "."));
  }
  mx::Shape shape(4 - mask.ndim(), 1);
  shape.insert(shape.end(), mask.shape().begin(), mask.shape().end());
  for (int ax = 0; ax < 4; ++ax) {
    if (shape[ax] != 1 && shape[ax] != full[ax]) {
      throw std::invalid_argument(cat("[", kOp, "] mask of shape ", shape_str(mask.shape()),
                                      " does not broadcast to the scores' shape (B, Hq, Tq, Tk) = ", shape_str(full),
                                      "."));
    }
  }
  auto m = mx::reshape(mask, shape, s);
  if (m.dtype() == mx::bool_) {
    const float inf = std::numeric_limits<float>::infinity();
    return mx::where(m, mx::array(0.0f), mx::array(-inf), s);
  }
  if (!mx::issubdtype(m.dtype(), mx::floating)) {
    throw type_error(cat("[", kOp, "] mask must be a floating (additive) or bool array, got ", dtype_str(m.dtype()),
                         "."));
  }
  return mx::astype(m, mx::float32, s);
}

// The attention from MLX's own ops, float32 math: what the transformations differentiate. A row that sees no
// key gives zeros, as the kernel does. The sinks, (Hq,) or (B, Hq), are one more column of the scores that
// only the softmax's max and sum see.
mx::array composed_attention(const std::vector<mx::array>& in, float scale, float softcap, bool causal,
                             bool has_sinks, mx::StreamOrDevice s) {
  const auto dtype = in[0].dtype();
  auto q = mx::astype(in[0], mx::float32, s);
  auto k = mx::astype(in[1], mx::float32, s);
  auto v = mx::astype(in[2], mx::float32, s);
  const int b = q.shape(0), hq = q.shape(1), tq = q.shape(2), hk = k.shape(1), tk = k.shape(2);
  if (hq != hk) {  // each kv head serves hq / hk consecutive query heads
    auto repeat = [&](const mx::array& a) {
      auto e = mx::expand_dims(a, 2, s);
      e = mx::broadcast_to(e, {b, hk, hq / hk, tk, a.shape(3)}, s);
      return mx::reshape(e, {b, hq, tk, a.shape(3)}, s);
    };
    k = repeat(k);
    v = repeat(v);
  }
  auto scores = mx::multiply(mx::matmul(q, mx::swapaxes(k, -1, -2, s), s), mx::array(scale), s);
  if (softcap > 0.0f) {
    scores = mx::multiply(mx::array(softcap), mx::tanh(mx::divide(scores, mx::array(softcap), s), s), s);
  }
  if (static_cast<int>(in.size()) > 3 + has_sinks) scores = mx::add(scores, in[3], s);
  const float inf = std::numeric_limits<float>::infinity();
  if (causal) {
    auto i = mx::reshape(mx::arange(tq, mx::int32, s), {tq, 1}, s);
    auto j = mx::reshape(mx::arange(tk, mx::int32, s), {1, tk}, s);
    auto visible = mx::less_equal(j, mx::add(i, mx::array(tk - tq), s), s);
    scores = mx::where(visible, scores, mx::array(-inf), s);
  }
  if (has_sinks) {
    const auto& sinks = in.back();
    auto column = mx::reshape(mx::astype(sinks, mx::float32, s), {sinks.ndim() == 2 ? sinks.shape(0) : 1, hq, 1, 1}, s);
    column = mx::broadcast_to(column, {b, hq, tq, 1}, s);
    scores = mx::concatenate({scores, column}, -1, s);
  }
  auto m = mx::stop_gradient(mx::max(scores, -1, /*keepdims=*/true, s), s);
  m = mx::where(mx::isinf(m, s), mx::array(0.0f), m, s);
  auto e = mx::exp(mx::subtract(scores, m, s), s);
  auto l = mx::sum(e, -1, /*keepdims=*/true, s);
  l = mx::where(mx::equal(l, mx::array(0.0f), s), mx::array(1.0f), l, s);
  if (has_sinks) e = mx::slice(e, {0, 0, 0, 0}, {b, hq, tq, tk}, s);  // the sink has no value row
  return mx::astype(mx::matmul(mx::divide(e, l, s), v, s), dtype, s);
}

// The composed function of the inputs named by argnums, the others held fixed.
std::function<std::vector<mx::array>(const std::vector<mx::array>&)> of_argnums(
    const std::vector<mx::array>& primals, const std::vector<int>& argnums, Attention& op) {
  return [=, scale = op.scale(), softcap = op.softcap(), causal = op.causal(), sinks = op.has_sinks(),
          s = op.stream()](const std::vector<mx::array>& args) {
    auto in = primals;
    for (size_t i = 0; i < argnums.size(); ++i) in[argnums[i]] = args[i];
    return std::vector<mx::array>{composed_attention(in, scale, softcap, causal, sinks, s)};
  };
}

std::vector<mx::array> pick(const std::vector<mx::array>& all, const std::vector<int>& argnums) {
  std::vector<mx::array> out;
  for (int a : argnums) out.push_back(all[a]);
  return out;
}

// Sinks for the merged batch (V * B, Hq) from vmapped sinks (axis `axis` of V), or from per-batch sinks (B, Hq).
mx::array per_batch_sinks(const mx::array& sinks, int axis, int vsize, int batch, mx::StreamOrDevice s) {
  auto a = axis >= 0 ? mx::moveaxis(sinks, axis, 0, s) : mx::expand_dims(sinks, 0, s);  // (V or 1, [B,] Hq)
  if (a.ndim() == 2) a = mx::expand_dims(a, 1, s);
  const int hq = a.shape(2);
  return mx::reshape(mx::broadcast_to(a, {vsize, batch, hq}, s), {vsize * batch, hq}, s);
}

}  // namespace

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                    bool causal, float scale, float softcap, const std::optional<mx::array>& sinks,
                    mx::StreamOrDevice s) {
  const bool on_gpu = mx::to_stream(s).device == mx::Device::gpu;
  const std::string backend = gpu_backend();
  if (on_gpu && backend != "cuda" && backend != "metal") {
    throw not_implemented_error(cat("[", kOp, "] has CPU, CUDA and Metal kernels but none for this GPU backend (",
                                    backend, "): use mx.fast.scaled_dot_product_attention, or run this op with "
                                    "stream=mx.cpu."));
  }
  check_4d(q, "q");
  check_4d(k, "k");
  check_4d(v, "v");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) ||
      k.shape(2) != v.shape(2) || k.shape(3) != q.shape(3) || k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0) {
    throw std::invalid_argument(cat("[", kOp, "] expected q (B, Hq, Tq, D), k (B, Hk, Tk, D), v (B, Hk, Tk, Dv) with "
                                    "Hq a multiple of Hk; got q ", shape_str(q.shape()), ", k ", shape_str(k.shape()),
                                    ", v ", shape_str(v.shape()), "."));
  }
  if (!std::isfinite(scale)) throw std::invalid_argument(cat("[", kOp, "] scale must be finite, got ", scale, "."));
  if (!(softcap >= 0.0f) || std::isinf(softcap)) {
    throw std::invalid_argument(cat("[", kOp, "] softcap must be finite and >= 0 (0: none), got ", softcap, "."));
  }
  if (mask && causal) throw std::invalid_argument(cat("[", kOp, "] give either a mask array or 'causal', not both."));
  if (on_gpu && backend == "metal" && (q.shape(3) > kMaxMetalHeadDim || v.shape(3) > kMaxMetalHeadDim)) {
    throw std::invalid_argument(cat("[", kOp, "] the Metal kernel takes head dims up to ", kMaxMetalHeadDim,
                                    ", got q ", shape_str(q.shape()), ", v ", shape_str(v.shape()),
                                    "; run this op with stream=mx.cpu."));
  }
  if (on_gpu && backend == "cuda" && (q.shape(3) > kMaxCudaHeadDim || v.shape(3) > kMaxCudaHeadDim)) {
    throw std::invalid_argument(cat("[", kOp, "] the CUDA kernel takes head dims up to ", kMaxCudaHeadDim, ", got D ",
                                    q.shape(3), ", Dv ", v.shape(3), "; run this op with stream=mx.cpu."));
  }
  if (sinks) {
    check_float_dtype(*sinks, kOp, "sinks");
    if (sinks->ndim() != 1 || sinks->shape(0) != q.shape(1)) {
      throw std::invalid_argument(cat("[", kOp, "] sinks must have shape (Hq,) = (", q.shape(1), ",), one logit per "
                                      "query head; got shape ", shape_str(sinks->shape()), "."));
    }
  }
  const auto dtype = mx::promote_types(mx::promote_types(q.dtype(), k.dtype()), v.dtype());
  std::vector<mx::array> inputs = {mx::astype(q, dtype, s), mx::astype(k, dtype, s), mx::astype(v, dtype, s)};
  if (mask) inputs.push_back(kernel_mask(*mask, {q.shape(0), q.shape(1), q.shape(2), k.shape(2)}, s));
  if (sinks) inputs.push_back(mx::astype(*sinks, mx::float32, s));
  return attention_node(inputs, scale, softcap, causal, sinks.has_value(), s);
}

bool Attention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Attention&>(other);
  return scale_ == o.scale_ && softcap_ == o.softcap_ && causal_ == o.causal_ && has_sinks_ == o.has_sinks_;
}

// The backward pass differentiates the composed MLX ops (standard softmax-attention formulas, materializing the
// Tq x Tk scores): correct rather than fast.
std::vector<mx::array> Attention::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums, const std::vector<mx::array>&) {
  auto f = of_argnums(primals, argnums, *this);
  auto [outs, grads] = mx::vjp(f, pick(primals, argnums), cotangents);
  return grads;
}

std::vector<mx::array> Attention::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                      const std::vector<int>& argnums) {
  auto f = of_argnums(primals, argnums, *this);
  auto [outs, jvps] = mx::jvp(f, pick(primals, argnums), tangents);
  return jvps;
}

// The vmapped axis becomes part of the batch axis: (V, B, ...) -> (V * B, ...); an input without it is broadcast.
// Vmapped sinks (V, Hq) become per-batch sinks (V * B, Hq), which the kernels read with a batch stride.
std::pair<std::vector<mx::array>, std::vector<int>> Attention::vmap(const std::vector<mx::array>& inputs,
                                                                    const std::vector<int>& axes) {
  const auto s = stream();
  int vsize = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (axes[i] >= 0) vsize = inputs[i].shape(axes[i]);
  }
  const int batch = inputs[0].shape(axes[0] == 0 ? 1 : 0);
  std::vector<mx::array> merged;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool is_mask = static_cast<int>(i) == mask_index(inputs);
    const bool is_sinks = static_cast<int>(i) == sinks_index(inputs);
    const bool shared = axes[i] < 0 && ((is_mask && inputs[i].shape(0) == 1) || (is_sinks && inputs[i].ndim() == 1));
    if (shared) {  // a mask or sinks that every batch shares stay shared
      merged.push_back(inputs[i]);
      continue;
    }
    if (is_sinks) {
      merged.push_back(per_batch_sinks(inputs[i], axes[i], vsize, batch, s));
      continue;
    }
    auto a = axes[i] >= 0 ? mx::moveaxis(inputs[i], axes[i], 0, s) : mx::expand_dims(inputs[i], 0, s);
    mx::Shape shape = a.shape();
    shape[0] = vsize;
    if (is_mask) shape[1] = batch;
    a = mx::broadcast_to(a, shape, s);
    shape.erase(shape.begin());
    shape[0] *= vsize;
    merged.push_back(mx::reshape(a, shape, s));
  }
  auto out = attention_node(merged, scale_, softcap_, causal_, has_sinks_, s);
  mx::Shape shape = out.shape();
  shape[0] = vsize;
  shape.insert(shape.begin() + 1, batch);
  return {{mx::reshape(out, shape, s)}, {0}};
}

}  // namespace mlx_ggml_ext
