// rms_norm: y = x / sqrt(mean(x^2) + eps) * weight, float32 math, one rounding to T (csrc/rms_norm.h); with
// args.residual (add_rms_norm) the row is first x + residual, rounded to T and written to `sum`.
#include "kernels/metal/common.h"

// One threadgroup per row: each thread sums the squares of a strided slice (coalesced reads: 4-element
// vectors when args.vec4, single elements otherwise), simd_sum reduces each simdgroup, and after one
// barrier every simdgroup adds the per-simdgroup partials itself (no second barrier). The row is then read
// again and scaled: it is in cache after the first pass. With a residual, each thread reads back in the second
// pass the sums it wrote itself in the first (the same elements: both passes stride alike).
#define GGML_EXT_RMS_NORM_PARAMS(T)                                                            \
  device const T *x [[buffer(0)]], device const T *weight [[buffer(1)]], device T *y [[buffer(2)]], \
      constant RmsNormArgs &args [[buffer(3)]], device const T *residual [[buffer(4)]],              \
      device T *sum [[buffer(5)]], threadgroup float *partials [[threadgroup(0)]],                  \
      uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],      \
      uint threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],           \
      uint simdgroup [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]]

// The sum of squares of a row: 4-element loads (vec4) or single ones. With `add`, of x + r rounded to T, which is
// stored to h.
template <typename T>
inline float sum_of_squares(device const T* x, device const T* r, device T* h, bool add, uint dim, bool vec4,
                            uint tid, uint threads) {
  float sum = 0.0f;
  if (vec4) {
    typedef typename Vec4<T>::type V;
    device const V* x4 = (device const V*)x;
    for (uint i = tid; i < dim / 4; i += threads) {
      V v = x4[i];
      if (add) {
        const V rv = ((device const V*)r)[i];
        for (int j = 0; j < 4; ++j) v[j] = FloatIO<T>::store(FloatIO<T>::load(v[j]) + FloatIO<T>::load(rv[j]));
        ((device V*)h)[i] = v;
      }
      for (int j = 0; j < 4; ++j) {
        const float f = FloatIO<T>::load(v[j]);
        sum += f * f;
      }
    }
  } else {
    for (uint i = tid; i < dim; i += threads) {
      float v = FloatIO<T>::load(x[i]);
      if (add) {
        const T s = FloatIO<T>::store(v + FloatIO<T>::load(r[i]));
        h[i] = s;
        v = FloatIO<T>::load(s);
      }
      sum += v * v;
    }
  }
  return sum;
}

template <typename T>
[[kernel]] void rms_norm(GGML_EXT_RMS_NORM_PARAMS(T)) {
  const size_t base = size_t(row) * args.dim;
  const bool add = args.residual != 0;
  const float squares = simd_sum(sum_of_squares(x + base, residual + base, sum + base, add, args.dim,
                                                args.vec4 != 0, tid, threads));
  if (lane == 0) partials[simdgroup] = squares;
  device const T* src = add ? sum : x;  // what the second pass scales
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float total = simd_sum(lane < simdgroups ? partials[lane] : 0.0f);
  const float scale = 1.0f / precise::sqrt(total / float(args.dim) + args.eps);
  device const T* w = weight + size_t(row / args.rows_per_weight) * args.dim;
  if (args.vec4) {
    typedef typename Vec4<T>::type V;
    device const V* x4 = (device const V*)(src + base);
    device const V* w4 = (device const V*)w;
    device V* y4 = (device V*)(y + base);
    for (uint i = tid; i < args.dim / 4; i += threads) {
      const V v = x4[i];
      V o;
      if (args.weighted) {
        const V g = w4[i];
        for (int j = 0; j < 4; ++j) o[j] = FloatIO<T>::store(FloatIO<T>::load(v[j]) * scale * FloatIO<T>::load(g[j]));
      } else {
        for (int j = 0; j < 4; ++j) o[j] = FloatIO<T>::store(FloatIO<T>::load(v[j]) * scale);
      }
      y4[i] = o;
    }
    return;
  }
  for (uint i = tid; i < args.dim; i += threads) {
    float v = FloatIO<T>::load(src[base + i]) * scale;
    if (args.weighted) v *= FloatIO<T>::load(w[i]);
    y[base + i] = FloatIO<T>::store(v);
  }
}

#define GGML_EXT_INSTANTIATE_RMS_NORM(suffix, T, unused) \
  template [[host_name("rms_norm_" #suffix)]] [[kernel]] void rms_norm<T>(GGML_EXT_RMS_NORM_PARAMS(T));
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_RMS_NORM, 0)
