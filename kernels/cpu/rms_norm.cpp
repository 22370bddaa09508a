#include "kernels/cpu/rms_norm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

template <class Fmt>
float sum_of_squares(const typename Fmt::T* x, int64_t dim) {
  // four accumulators hide the add latency
  vf32 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 4 * kLanes <= dim; i += 4 * kLanes) {
    const vf32 v0 = Fmt::load(x + i), v1 = Fmt::load(x + i + kLanes);
    const vf32 v2 = Fmt::load(x + i + 2 * kLanes), v3 = Fmt::load(x + i + 3 * kLanes);
    a0 += v0 * v0;
    a1 += v1 * v1;
    a2 += v2 * v2;
    a3 += v3 * v3;
  }
  for (; i + kLanes <= dim; i += kLanes) {
    const vf32 v = Fmt::load(x + i);
    a0 += v * v;
  }
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; i < dim; ++i) {
    const float v = Fmt::to_f32(x[i]);
    s += v * v;
  }
  return s;
}

template <class Fmt, bool kWeighted, bool kStream>
void normalize_row(const typename Fmt::T* x, const typename Fmt::T* w, typename Fmt::T* y,
                   int64_t dim, float scale, const typename Fmt::T* next_row) {
  auto scalar = [&](int64_t i) {
    float v = Fmt::to_f32(x[i]) * scale;
    if constexpr (kWeighted) v *= Fmt::to_f32(w[i]);
    y[i] = Fmt::from_f32(v);
  };
  // Streaming stores need aligned vectors: peel the elements before the first boundary.
  const int64_t head = kStream ? elements_to_vector_alignment(y, dim) : 0;
  int64_t i = 0;
  for (; i < head; ++i) scalar(i);
  const vf32 vscale = splat(scale);
  for (; i + kLanes <= dim; i += kLanes) {
    // Keep DRAM busy with the next row's reads while this row is written.
    if (next_row) __builtin_prefetch(next_row + i);
    vf32 v = Fmt::load(x + i) * vscale;
    if constexpr (kWeighted) v *= Fmt::load(w + i);
    if constexpr (kStream) {
      Fmt::store_nt(y + i, v);
    } else {
      Fmt::store(y + i, v);
    }
  }
  for (; i < dim; ++i) scalar(i);
}

// h = x + r rounded to T (the stored sum), so that the norm below reads exactly what an add op would have written.
template <class Fmt>
void add_row(const typename Fmt::T* x, const typename Fmt::T* r, typename Fmt::T* h, int64_t dim) {
  int64_t i = 0;
  for (; i + kLanes <= dim; i += kLanes) Fmt::store(h + i, Fmt::load(x + i) + Fmt::load(r + i));
  for (; i < dim; ++i) h[i] = Fmt::from_f32(Fmt::to_f32(x[i]) + Fmt::to_f32(r[i]));
}

template <class Fmt, bool kWeighted, bool kStream>
void rms_norm_rows(const RmsNormArgs& a, int64_t begin, int64_t end) {
  using T = typename Fmt::T;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  T* y = static_cast<T*>(a.y);
  const T* residual = static_cast<const T*>(a.residual);
  T* sum = static_cast<T*>(a.sum);
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * a.dim;
    if (residual) {  // norm the rounded sum, from L1
      add_row<Fmt>(xr, residual + r * a.dim, sum + r * a.dim, a.dim);
      xr = sum + r * a.dim;
    }
    // The row is in L1/L2 after the first pass, so DRAM sees one read and one write.
    const float scale = 1.0f / std::sqrt(sum_of_squares<Fmt>(xr, a.dim) / a.dim + a.eps);
    const T* wr = kWeighted ? w + (r / a.rows_per_weight) * a.dim : nullptr;
    normalize_row<Fmt, kWeighted, kStream>(xr, wr, y + r * a.dim, a.dim, scale,
                                           r + 1 < end && !residual ? xr + a.dim : nullptr);
  }
  if constexpr (kStream) stream_fence();
}

template <class Fmt, bool kWeighted>
void rms_norm_typed(const RmsNormArgs& a, int64_t grain) {
  const bool stream = kHasStreamingStores &&
                      a.rows * a.dim * int64_t(sizeof(typename Fmt::T)) >= kStreamingStoreMinBytes;
  parallel_for(a.rows, grain, [&](int64_t b, int64_t e) {
    stream ? rms_norm_rows<Fmt, kWeighted, true>(a, b, e) : rms_norm_rows<Fmt, kWeighted, false>(a, b, e);
  });
}

}  // namespace

void rms_norm(const RmsNormArgs& a) {
  // Threads only pay off past a few tens of kilobytes per part.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, a.dim));
  GGML_EXT_FLOAT_SWITCH(a.type, Fmt,
                        a.weight ? rms_norm_typed<Fmt, true>(a, grain) : rms_norm_typed<Fmt, false>(a, grain));
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(rms_norm, RmsNormArgs)

}  // namespace ggml_ext::cpu
