// Scale searches of the K-quant and IQ4 quantizers (included by quantize.cpp only, once per ISA variant).
//
// Every objective is a weighted squared error sum(w * (decoded - x)^2), w = 1 without an importance
// matrix (then every product with w is exact and the numbers are those of the plain squared error).
//
// Affine formats (Q2_K, Q4_K, Q5_K: x ~ d*sc*L - dmin*mn, L in [0, nmax]): per sub-block, a search over
// candidate level spacings, each followed by a weighted least-squares fit of scale and min to the resulting
// integer levels, then a few refit (Lloyd) rounds; the sub-block scales and mins are then quantized to the
// format's integers against the float16 super-block scales by trying the neighbouring integers, and the two
// super-block scales are refitted by least squares while that lowers the error.
//
// Symmetric formats (Q3_K, Q6_K: x ~ d*sc*L with L uniform in [-N, N-1]; IQ4_XS, IQ4_NL: x ~ d*sc*NL[q]
// on the 16-value non-linear grid): per sub-block, the extreme value mapped to candidate points around either
// end of the grid, a least-squares scale for the nearest grid values, Lloyd rounds; then the integer sub-block
// scales against the float16 scale (the largest sub-block scale maps to the integer extreme, as in ggml), and
// the float16 scale refitted by least squares while that lowers the error.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/simd.h"

// The 64-byte vectors below only cross inline helpers of quantize.cpp: no ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

constexpr float kHalfMax = 65504.0f;

inline int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
// Round to nearest even; far-out values (a tiny scale) saturate before the clamp that follows.
inline int nearest(float v) { return static_cast<int>(std::lrint(std::min(1e7f, std::max(-1e7f, v)))); }

// Sub-blocks are held as 16-lane float vectors of a fixed width on every ISA (GCC lowers them to 1, 2 or 4
// native vectors), summed in a fixed order: every variant computes the same numbers and writes the same bytes.
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + m) - m rounds |v| < 2^22 to nearest even

template <int V>
struct SubBlock {  // V * 16 values and the weights of their squared errors
  v16f x[V];
  v16f w[V];
  SubBlock() = default;
  SubBlock(const float* xp, const float* wp) {
    std::memcpy(x, xp, sizeof x);
    std::memcpy(w, wp, sizeof w);
  }
};

template <int NS, int V>
void load_sub_blocks(const float* x, const float* w, SubBlock<V> (&subs)[NS]) {
  for (int j = 0; j < NS; ++j) subs[j] = SubBlock<V>(x + 16 * V * j, w + 16 * V * j);
}

inline float sum16(v16f v) {
  const v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// v clamped to [lo, hi] (integers), then rounded to the nearest integer (even on ties).
inline v16f clamp_round(v16f v, float lo, float hi) {
  const v16f vlo = v16f{} + lo, vhi = v16f{} + hi;
  v = v > vlo ? v : vlo;
  v = v < vhi ? v : vhi;
  return (v + kRoundMagic) - kRoundMagic;
}

// Integer candidates around v / unit in [lo, hi]: the nearest and its neighbours.
int candidates(float v, float unit, int lo, int hi, int spread, int* out) {
  if (!(unit != 0.0f)) {
    out[0] = clamp_int(0, lo, hi);
    return 1;
  }
  const int c = clamp_int(nearest(v / unit), lo, hi);
  int k = 0;
  for (int t = std::max(lo, c - spread); t <= std::min(hi, c + spread); ++t) out[k++] = t;
  return k;
}

float half_scale(float v) { return std::min(v, kHalfMax); }
uint16_t signed_half(float v) { return ggml_ext_fp32_to_fp16(std::copysign(half_scale(std::fabs(v)), v)); }

// ------------------------------------------------------------------------------------------------ affine

struct AffineFit {
  float scale = 0.0f;
  float min = 0.0f;
  float err = 0.0f;
};

// Weighted least squares of scale and min for fixed levels L, min clamped at >= 0; err = the error.
template <int V>
AffineFit fit_levels(const SubBlock<V>& s, const v16f (&L)[V]) {
  v16f aw = {}, al = {}, al2 = {}, alx = {}, ax = {};
  for (int v = 0; v < V; ++v) {
    const v16f wl = s.w[v] * L[v];
    aw += s.w[v];
    al += wl;
    al2 += wl * L[v];
    alx += wl * s.x[v];
    ax += s.w[v] * s.x[v];
  }
  const double n = sum16(aw), sl = sum16(al), sl2 = sum16(al2), slx = sum16(alx), sx = sum16(ax);
  const double det = n * sl2 - sl * sl;
  double scale = det > 0 ? (n * slx - sl * sx) / det : 0.0;
  double offset = det > 0 ? (sx - scale * sl) / n : sx / n;
  if (offset > 0) {  // the format cannot add: refit the scale alone
    offset = 0;
    scale = sl2 > 0 ? slx / sl2 : 0.0;
  }
  AffineFit f;
  f.scale = static_cast<float>(std::max(scale, 0.0));
  f.min = static_cast<float>(-offset);
  v16f e = {};
  for (int v = 0; v < V; ++v) {
    const v16f r = f.scale * L[v] - f.min - s.x[v];
    e += s.w[v] * r * r;
  }
  f.err = sum16(e);
  return f;
}

// Levels clamp_round(iscale * (x - lo)) in [0, nmax].
template <int V>
void affine_levels(const SubBlock<V>& s, float iscale, float lo, float nmax, v16f (&L)[V]) {
  for (int v = 0; v < V; ++v) L[v] = clamp_round(iscale * (s.x[v] - lo), 0.0f, nmax);
}

template <int V>
AffineFit search_affine(const SubBlock<V>& s, int nmax) {
  float lo = 0.0f, hi = s.x[0][0];
  for (int v = 0; v < V; ++v) {
    for (int i = 0; i < 16; ++i) {
      lo = std::min(lo, s.x[v][i]);
      hi = std::max(hi, s.x[v][i]);
    }
  }
  AffineFit best;
  if (!(hi > lo)) {  // constant non-positive sub-block
    best.min = -lo;
    return best;
  }
  const float fmax = static_cast<float>(nmax);
  v16f L[V];
  best.err = FLT_MAX;
  // Candidate level spacings around (hi - lo) / nmax (slightly wider ones clip the extremes), and the range
  // spanning a few levels less, which finds the grid of values that are already quantized.
  auto try_spacing = [&](float levels) {
    affine_levels(s, levels / (hi - lo), lo, fmax, L);
    const AffineFit f = fit_levels(s, L);
    if (f.err < best.err) best = f;
  };
  for (int step = -10; step <= 20; ++step) try_spacing(fmax + 0.1f * static_cast<float>(step));
  for (int fewer = 2; fewer <= 4 && nmax - fewer >= 4; ++fewer) try_spacing(fmax - static_cast<float>(fewer));
  for (int round = 0; round < 4 && best.scale > 0.0f; ++round) {  // Lloyd: levels <-> fit
    affine_levels(s, 1.0f / best.scale, -best.min, fmax, L);
    const AffineFit f = fit_levels(s, L);
    if (!(f.err < best.err)) break;
    best = f;
  }
  return best;
}

template <int V>
void store_levels(const v16f (&L)[V], int* out) {
  for (int v = 0; v < V; ++v) {
    const v16i q = __builtin_convertvector(L[v], v16i);
    std::memcpy(out + 16 * v, &q, sizeof q);
  }
}

// Error of the sub-block decoded as dl*L - ml (the decoder's float32 math) with the best levels.
template <int V>
float affine_error(const SubBlock<V>& s, int nmax, float dl, float ml, int* levels) {
  v16f L[V], e = {};
  for (int v = 0; v < V; ++v) {
    L[v] = dl > 0.0f ? clamp_round((s.x[v] + ml) / dl, 0.0f, static_cast<float>(nmax)) : v16f{};
    const v16f r = dl * L[v] - ml - s.x[v];
    e += s.w[v] * r * r;
  }
  store_levels(L, levels);
  return sum16(e);
}

// Given the float16 super-block scales: per sub-block the integer scale and min (near the fitted ones) and
// levels of least error. Returns the block's error.
template <int NS, int V, int kNmax, int kScaleMax>
float assign_affine(const SubBlock<V> (&subs)[NS], const AffineFit* fits, float d, float dmin, int* sc, int* mc,
                    int* L) {
  float total = 0.0f;
  for (int j = 0; j < NS; ++j) {
    int cs[3], cm[3], trial[16 * V];
    const int ns = candidates(fits[j].scale, d, 0, kScaleMax, 1, cs);
    const int nm = candidates(fits[j].min, dmin, 0, kScaleMax, 1, cm);
    float best = FLT_MAX;
    for (int a = 0; a < ns; ++a) {
      for (int b = 0; b < nm; ++b) {
        const float err = affine_error(subs[j], kNmax, d * static_cast<float>(cs[a]),
                                       dmin * static_cast<float>(cm[b]), trial);
        if (err < best) {
          best = err;
          sc[j] = cs[a];
          mc[j] = cm[b];
          std::memcpy(L + 16 * V * j, trial, sizeof trial);
        }
      }
    }
    total += best;
  }
  return total;
}

// NS sub-blocks of 16*V: the levels, integer scales and mins in [0, kScaleMax], and the float16 scales.
template <int NS, int V, int kNmax, int kScaleMax>
void quantize_affine_block(const SubBlock<V> (&subs)[NS], uint16_t* d_out, uint16_t* dmin_out, int* sc, int* mc,
                           int* L) {
  constexpr int kN = 16 * V * NS;
  AffineFit fits[NS];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < NS; ++j) {
    fits[j] = search_affine(subs[j], kNmax);
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  const float smax = static_cast<float>(kScaleMax);
  uint16_t dh = ggml_ext_fp32_to_fp16(half_scale(max_scale / smax));
  uint16_t mh = ggml_ext_fp32_to_fp16(half_scale(max_min / smax));
  float err = assign_affine<NS, V, kNmax, kScaleMax>(subs, fits, ggml_ext_fp16_to_fp32(dh), ggml_ext_fp16_to_fp32(mh),
                                                     sc, mc, L);
  // The decoded values are linear in (d, dmin) for fixed integers: refit both by least squares and keep
  // the result (re-assigned around it) while it lowers the error.
  for (int round = 0; round < 2; ++round) {
    double aa = 0, ab = 0, bb = 0, ax = 0, bx = 0;  // a = sc*L, b = -mc
    for (int i = 0; i < kN; ++i) {
      const int j = i / (16 * V), v = (i / 16) % V, l = i % 16;
      const double w = subs[j].w[v][l], x = subs[j].x[v][l];
      const double a = static_cast<double>(sc[j]) * L[i], b = -static_cast<double>(mc[j]);
      aa += w * a * a;
      ab += w * a * b;
      bb += w * b * b;
      ax += w * a * x;
      bx += w * b * x;
    }
    const double det = aa * bb - ab * ab;
    double d = aa > 0 ? ax / aa : 0.0, dmin = 0.0;
    if (det > 0) {
      d = (ax * bb - bx * ab) / det;
      dmin = (bx * aa - ax * ab) / det;
    }
    if (!(d >= 0) || !(dmin >= 0)) break;
    const uint16_t dh2 = ggml_ext_fp32_to_fp16(half_scale(static_cast<float>(d)));
    const uint16_t mh2 = ggml_ext_fp32_to_fp16(half_scale(static_cast<float>(dmin)));
    if (dh2 == dh && mh2 == mh) break;
    int sc2[NS], mc2[NS], L2[kN];
    const float err2 = assign_affine<NS, V, kNmax, kScaleMax>(subs, fits, ggml_ext_fp16_to_fp32(dh2),
                                                              ggml_ext_fp16_to_fp32(mh2), sc2, mc2, L2);
    if (!(err2 < err)) break;
    err = err2;
    dh = dh2;
    mh = mh2;
    std::memcpy(sc, sc2, sizeof sc2);
    std::memcpy(mc, mc2, sizeof mc2);
    std::memcpy(L, L2, sizeof L2);
  }
  *d_out = dh;
  *dmin_out = mh;
}

// ------------------------------------------------------------------------------------------------ symmetric

// The grids of the symmetric formats: snap(v) is the grid value nearest v, code(value) the stored index.
// kLo / kHi are the grid's ends; a sub-block's extreme is tried at kLo - kDelta*step and kHi + kDelta*step.
template <int N>
struct UniformGrid {  // integers -N .. N-1 (Q3_K: N = 4, Q6_K: N = 32)
  static constexpr float kLo = -N, kHi = N - 1, kDelta = N == 32 ? 0.5f : 0.1f;
  static constexpr int kStepLo = -12, kStepHi = N == 32 ? 6 : 8;
  static v16f snap(v16f v) { return clamp_round(v, kLo, kHi); }
  static int code(float value) { return static_cast<int>(value) + N; }
  static float value(int code) { return static_cast<float>(code - N); }
};

struct NonlinearGrid {  // IQ4_NL / IQ4_XS: the 16 values of ggml_ext_iq4nl_value, -127 .. 113
  static constexpr float kLo = -127.0f, kHi = 113.0f, kDelta = 1.0f;
  static constexpr int kStepLo = -10, kStepHi = 4;
  static v16f snap(v16f v) {  // -127 plus every gap whose midpoint v reaches (ties go up)
    // Four independent sums (not one chain of 15 selects); the terms are small integers, so exact in any order.
    v16f acc[4] = {v16f{} + kLo, v16f{}, v16f{}, v16f{}};
    for (int k = 0; k < 15; ++k) {
      const float lo = value(k), hi = value(k + 1);
      acc[k % 4] += v >= 0.5f * (lo + hi) ? v16f{} + (hi - lo) : v16f{};
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  static int code(float v) {
    int k = 0;
    while (k < 15 && value(k) != v) ++k;
    return k;
  }
  static float value(int code) { return static_cast<float>(ggml_ext_iq4nl_value(code)); }
};

struct SymmetricFit {
  float scale = 0.0f;
  float err = 0.0f;
};

template <int V>
SymmetricFit fit_symmetric(const SubBlock<V>& s, const v16f (&Q)[V]) {
  v16f aqx = {}, aq2 = {};
  for (int v = 0; v < V; ++v) {
    const v16f wq = s.w[v] * Q[v];
    aqx += wq * s.x[v];
    aq2 += wq * Q[v];
  }
  const float sqx = sum16(aqx), sq2 = sum16(aq2);
  SymmetricFit f;
  f.scale = sq2 > 0 ? sqx / sq2 : 0.0f;
  v16f e = {};
  for (int v = 0; v < V; ++v) {
    const v16f r = f.scale * Q[v] - s.x[v];
    e += s.w[v] * r * r;
  }
  f.err = sum16(e);
  return f;
}

template <class Grid, int V>
SymmetricFit search_symmetric(const SubBlock<V>& s) {
  float amax = 0.0f, vmax = 0.0f;
  v16f e = {};
  for (int v = 0; v < V; ++v) {
    e += s.w[v] * s.x[v] * s.x[v];
    for (int i = 0; i < 16; ++i) {
      if (std::fabs(s.x[v][i]) > amax) {
        amax = std::fabs(s.x[v][i]);
        vmax = s.x[v][i];
      }
    }
  }
  SymmetricFit best;
  if (amax == 0.0f) return best;
  best.err = sum16(e);
  v16f Q[V];
  auto try_scale = [&](float inverse) {
    for (int v = 0; v < V; ++v) Q[v] = Grid::snap(inverse * s.x[v]);
    const SymmetricFit f = fit_symmetric(s, Q);
    if (f.err < best.err) best = f;
  };
  // The extreme mapped near either end of the grid (a little past it clips it).
  for (int step = Grid::kStepLo; step <= Grid::kStepHi; ++step) {
    const float delta = Grid::kDelta * static_cast<float>(step);
    for (float target : {Grid::kLo - delta, Grid::kHi + delta}) try_scale(target / vmax);
  }
  for (int round = 0; round < 4 && best.scale != 0.0f; ++round) {  // Lloyd: grid values <-> fit
    const float before = best.err;
    try_scale(1.0f / best.scale);
    if (!(best.err < before)) break;
  }
  return best;
}

// Error of the sub-block decoded as dl * (grid value), each element at its nearest grid value (returned in
// `values`; the codes are looked up once, for the values kept).
template <class Grid, int V>
float symmetric_error(const SubBlock<V>& s, float dl, float* values) {
  v16f e = {};
  for (int v = 0; v < V; ++v) {
    const v16f Q = Grid::snap(dl != 0.0f ? s.x[v] / dl : v16f{});
    const v16f r = dl * Q - s.x[v];
    e += s.w[v] * r * r;
    std::memcpy(values + 16 * v, &Q, sizeof Q);
  }
  return sum16(e);
}

template <class Grid, int NS, int V, int kScaleLo, int kScaleHi>
float assign_symmetric(const SubBlock<V> (&subs)[NS], const SymmetricFit* fits, float d, int* sc, float* values) {
  float total = 0.0f;
  for (int j = 0; j < NS; ++j) {
    int cs[5];
    float trial[16 * V];
    const int ns = candidates(fits[j].scale, d, kScaleLo, kScaleHi, 2, cs);
    float best = FLT_MAX;
    for (int a = 0; a < ns; ++a) {
      const float err = symmetric_error<Grid>(subs[j], d * static_cast<float>(cs[a]), trial);
      if (err < best) {
        best = err;
        sc[j] = cs[a];
        std::memcpy(values + 16 * V * j, trial, sizeof trial);
      }
    }
    total += best;
  }
  return total;
}

// NS sub-blocks of 16*V: the grid codes, integer sub-block scales in [kScaleLo, kScaleHi] and the float16
// scale (returned). The sub-block scale of largest magnitude maps to kScaleLo (Q6_K: -128, one step finer
// than 127); with one sub-block and kScaleLo = kScaleHi = 1 (IQ4_NL) the float16 scale is the fitted one.
template <class Grid, int NS, int V, int kScaleLo, int kScaleHi>
uint16_t quantize_symmetric_block(const SubBlock<V> (&subs)[NS], int* sc, int* codes) {
  constexpr int kN = 16 * V * NS;
  SymmetricFit fits[NS];
  float max_scale = 0.0f;
  for (int j = 0; j < NS; ++j) {
    fits[j] = search_symmetric<Grid>(subs[j]);
    if (std::fabs(fits[j].scale) > std::fabs(max_scale)) max_scale = fits[j].scale;
  }
  uint16_t dh = signed_half(max_scale / static_cast<float>(kScaleLo));
  float values[kN];
  float err = assign_symmetric<Grid, NS, V, kScaleLo, kScaleHi>(subs, fits, ggml_ext_fp16_to_fp32(dh), sc, values);
  // Linear in d for fixed integers: refit it by least squares while that lowers the error.
  for (int round = 0; round < 2; ++round) {
    double aa = 0, ax = 0;
    for (int i = 0; i < kN; ++i) {
      const int j = i / (16 * V), v = (i / 16) % V, l = i % 16;
      const double w = subs[j].w[v][l], a = static_cast<double>(sc[j]) * values[i];
      aa += w * a * a;
      ax += w * a * subs[j].x[v][l];
    }
    if (!(aa > 0)) break;
    const uint16_t dh2 = signed_half(static_cast<float>(ax / aa));
    if (dh2 == dh) break;
    int sc2[NS];
    float values2[kN];
    const float err2 =
        assign_symmetric<Grid, NS, V, kScaleLo, kScaleHi>(subs, fits, ggml_ext_fp16_to_fp32(dh2), sc2, values2);
    if (!(err2 < err)) break;
    err = err2;
    dh = dh2;
    std::memcpy(sc, sc2, sizeof sc2);
    std::memcpy(values, values2, sizeof values2);
  }
  for (int i = 0; i < kN; ++i) codes[i] = Grid::code(values[i]);
  return dh;
}

}  // namespace
}  // namespace GGML_EXT_ISA
}  // namespace ggml_ext::cpu
