// rms_norm: y = x / sqrt(mean(x^2) + eps) * weight, float32 math, one rounding to T (csrc/rms_norm.h).
#include "kernels/metal/common.h"

// One threadgroup per row: each thread sums the squares of a strided slice (coalesced reads), simd_sum
// reduces each simdgroup, and after one barrier every simdgroup adds the per-simdgroup partials itself
// (no second barrier). The row is then read again and scaled: it is in cache after the first pass.
#define GGML_EXT_RMS_NORM_PARAMS(T)                                                            \
  device const T *x [[buffer(0)]], device const T *weight [[buffer(1)]], device T *y [[buffer(2)]], \
      constant RmsNormArgs &args [[buffer(3)]], threadgroup float *partials [[threadgroup(0)]],     \
      uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],      \
      uint threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],           \
      uint simdgroup [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]]

template <typename T>
[[kernel]] void rms_norm(GGML_EXT_RMS_NORM_PARAMS(T)) {
  const size_t base = size_t(row) * args.dim;
  float sum = 0.0f;
  for (uint i = tid; i < args.dim; i += threads) {
    const float v = FloatIO<T>::load(x[base + i]);
    sum += v * v;
  }
  sum = simd_sum(sum);
  if (lane == 0) partials[simdgroup] = sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float total = simd_sum(lane < simdgroups ? partials[lane] : 0.0f);
  const float scale = 1.0f / precise::sqrt(total / float(args.dim) + args.eps);
  device const T* w = weight + size_t(row / args.rows_per_weight) * args.dim;
  for (uint i = tid; i < args.dim; i += threads) {
    float v = FloatIO<T>::load(x[base + i]) * scale;
    if (args.weighted) v *= FloatIO<T>::load(w[i]);
    y[base + i] = FloatIO<T>::store(v);
  }
}

#define GGML_EXT_INSTANTIATE_RMS_NORM(suffix, T, unused) \
  template [[host_name("rms_norm_" #suffix)]] [[kernel]] void rms_norm<T>(GGML_EXT_RMS_NORM_PARAMS(T));
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_RMS_NORM, 0)
