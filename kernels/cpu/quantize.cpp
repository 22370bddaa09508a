// Quantize: one block at a time, threads over runs of blocks.
//
// Legacy types and MXFP4 follow gguf.quants (and ggml's *_ref C code) operation by operation in float32, so
// the bytes match: the scale from the block's extreme value, the reciprocal id = 1/d, quants from
// trunc(x*id + offset) or round-half-away(x*id), the scale stored as float16 (round to nearest even). Built
// with -ffp-contract=off (cmake/cpu_variants.cmake): x*id + 8.5f must round twice.
//
// Two rules where gguf's result is undefined behaviour (a float->uint8 cast of inf/NaN or of a negative
// value, which x86 wraps and ARM saturates):
//   - when 1/d overflows (|d| < 2^-128: every |x| < about 2^-125) the quants are the zero point (the f16 scale
//     is 0 there, so the block decodes to zeros or to its min, as gguf's would);
//   - MXFP4's exponent is clamped at 0 for max |x| < 2^-125 (gguf wraps it to 251..255).
// A block holding NaN or +-inf: see quantize.h.
//
// K-quants: per sub-block, a search over candidate scales (each followed by a least-squares fit of scale and
// min to the resulting integer levels, then a few refit rounds), then the sub-block scales are quantized to
// the format's 6/8-bit integers against the float16 super-block scale by trying the neighbouring integers
// and keeping the pair with the lowest squared error of the decoded values. Plain (unweighted) squared
// error throughout: the objective is the reconstruction RMSE.
#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

// The 64-byte vectors below only cross inline helpers of this file: no ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

constexpr uint16_t kHalfNaN = 0x7E00;
constexpr float kHalfMax = 65504.0f;
constexpr int64_t kGrainElements = 8192;

bool all_finite(const float* x, int n) {
  uint32_t non_finite = 0;
  for (int i = 0; i < n; ++i) non_finite |= (ggml_ext_f32_to_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
  return non_finite == 0;
}

inline int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
// Round to nearest even; far-out values (a tiny scale) saturate before the clamp that follows.
inline int nearest(float v) { return static_cast<int>(std::lrint(std::min(1e7f, std::max(-1e7f, v)))); }

// ------------------------------------------------------------------------------------------------ legacy

// The first value of largest magnitude, with its sign (numpy's argmax of |x|).
float signed_absmax(const float* x) {
  float best = x[0], amax = std::fabs(x[0]);
  for (int i = 1; i < GGML_EXT_QK32; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      best = x[i];
    }
  }
  return best;
}

// Q4_0/Q5_0: d = max / -2^(bits-1), q = min(2^bits - 1, trunc(x*id + 2^(bits-1) + 0.5)).
template <int kBits>
uint16_t quantize_symmetric(const float* x, int* q) {
  constexpr int kHalf = 1 << (kBits - 1);
  const float d = signed_absmax(x) / static_cast<float>(-kHalf);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float offset = static_cast<float>(kHalf) + 0.5f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    q[i] = std::isinf(id) ? kHalf : std::min(2 * kHalf - 1, static_cast<int>(x[i] * id + offset));
  }
  return ggml_ext_fp32_to_fp16(d);
}

// Q4_1/Q5_1: d = (max - min) / (2^bits - 1), q = min(2^bits - 1, trunc((x - min)*id + 0.5)).
template <int kBits>
void quantize_affine(const float* x, uint16_t* d_out, uint16_t* m_out, int* q) {
  constexpr int kMax = (1 << kBits) - 1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < GGML_EXT_QK32; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  const float d = (hi - lo) / static_cast<float>(kMax);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    q[i] = std::isinf(id) ? 0 : std::min(kMax, static_cast<int>((x[i] - lo) * id + 0.5f));
  }
  *d_out = ggml_ext_fp32_to_fp16(d);
  *m_out = ggml_ext_fp32_to_fp16(lo);
}

// Byte j holds element j (low nibble) and element j + 16 (high nibble); the 5th bits go to a u32.
void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}
void pack_fifth_bits(const int* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < GGML_EXT_QK32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(bits >> (8 * k));
}

void quantize_block(const float* x, block_q4_0* y) {
  int q[GGML_EXT_QK32];
  y->d = quantize_symmetric<4>(x, q);
  pack_nibbles(q, y->qs);
}
void quantize_block(const float* x, block_q5_0* y) {
  int q[GGML_EXT_QK32];
  y->d = quantize_symmetric<5>(x, q);
  pack_nibbles(q, y->qs);
  pack_fifth_bits(q, y->qh);
}
void quantize_block(const float* x, block_q4_1* y) {
  int q[GGML_EXT_QK32];
  quantize_affine<4>(x, &y->d, &y->m, q);
  pack_nibbles(q, y->qs);
}
void quantize_block(const float* x, block_q5_1* y) {
  int q[GGML_EXT_QK32];
  quantize_affine<5>(x, &y->d, &y->m, q);
  pack_nibbles(q, y->qs);
  pack_fifth_bits(q, y->qh);
}

// Q8_0: d = max|x| / 127, q = round-half-away(x*id).
void quantize_block(const float* x, block_q8_0* y) {
  float amax = 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    y->qs[i] = std::isinf(id) ? 0 : static_cast<int8_t>(std::round(x[i] * id));
  }
  y->d = ggml_ext_fp32_to_fp16(d);
}

// MXFP4: e = floor(log2(max|x|)) - 2 + 127 with float32's log2 (correctly rounded: double, then rounded to
// float), then per element the first code of least |d*value - x|.
void quantize_block(const float* x, block_mxfp4* y) {
  float amax = 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) amax = std::max(amax, std::fabs(x[i]));
  int e = 0;
  if (amax > 0.0f) {
    const float log2_amax = static_cast<float>(std::log2(static_cast<double>(amax)));
    e = std::max(0, static_cast<int>(std::floor(log2_amax) - 2.0f + 127.0f));
  }
  const float d = ggml_ext_e8m0_half_to_float(static_cast<uint32_t>(e));
  int q[GGML_EXT_QK32];
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    int best = 0;
    float best_err = std::fabs(d * static_cast<float>(ggml_ext_mxfp4_value(0)) - x[i]);
    for (int k = 1; k < 16; ++k) {
      const float err = std::fabs(d * static_cast<float>(ggml_ext_mxfp4_value(k)) - x[i]);
      if (err < best_err) {
        best_err = err;
        best = k;
      }
    }
    q[i] = best;
  }
  y->e = static_cast<uint8_t>(e);
  pack_nibbles(q, y->qs);
}

// ------------------------------------------------------------------------------------------------ K-quants

// Sub-blocks are held as 16-lane float vectors of a fixed width on every ISA (GCC lowers them to 1, 2 or 4
// native vectors), summed in a fixed order: every variant computes the same numbers and writes the same bytes.
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + m) - m rounds |v| < 2^22 to nearest even

template <int V>
struct SubBlock {  // V * 16 values
  v16f x[V];
  explicit SubBlock(const float* p) { std::memcpy(x, p, sizeof x); }
};

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

template <int V>
void store_levels(const v16f (&L)[V], int* out) {
  for (int v = 0; v < V; ++v) {
    const v16i q = __builtin_convertvector(L[v], v16i);
    std::memcpy(out + 16 * v, &q, sizeof q);
  }
}

// Sub-block fit x ~ scale * L - min with L in [0, nmax], min >= 0 (Q4_K/Q5_K store a min to subtract).
struct AffineFit {
  float scale = 0.0f;
  float min = 0.0f;
  float err = 0.0f;
};

// Least squares of scale and min for fixed levels L, min clamped at >= 0; err = the squared error.
template <int V>
AffineFit fit_levels(const SubBlock<V>& s, const v16f (&L)[V]) {
  v16f al = {}, al2 = {}, alx = {}, ax = {};
  for (int v = 0; v < V; ++v) {
    al += L[v];
    al2 += L[v] * L[v];
    alx += L[v] * s.x[v];
    ax += s.x[v];
  }
  const double n = 16 * V, sl = sum16(al), sl2 = sum16(al2), slx = sum16(alx), sx = sum16(ax);
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
    e += r * r;
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
  for (int fewer = 2; fewer <= 4; ++fewer) try_spacing(fmax - static_cast<float>(fewer));
  for (int round = 0; round < 4 && best.scale > 0.0f; ++round) {  // Lloyd: levels <-> fit
    affine_levels(s, 1.0f / best.scale, -best.min, fmax, L);
    const AffineFit f = fit_levels(s, L);
    if (!(f.err < best.err)) break;
    best = f;
  }
  return best;
}

// Squared error of the sub-block decoded as dl*L - ml (the decoder's float32 math) with the best levels.
template <int V>
float affine_error(const SubBlock<V>& s, int nmax, float dl, float ml, int* levels) {
  v16f L[V], e = {};
  for (int v = 0; v < V; ++v) {
    L[v] = dl > 0.0f ? clamp_round((s.x[v] + ml) / dl, 0.0f, static_cast<float>(nmax)) : v16f{};
    const v16f r = dl * L[v] - ml - s.x[v];
    e += r * r;
  }
  store_levels(L, levels);
  return sum16(e);
}

// Integer candidates around v / unit in [lo, hi]: the nearest and its neighbours.
int candidates(float v, float unit, int lo, int hi, int spread, int* out) {
  if (!(unit != 0.0f)) {
    out[0] = 0;
    return 1;
  }
  const int c = clamp_int(nearest(v / unit), lo, hi);
  int k = 0;
  for (int t = std::max(lo, c - spread); t <= std::min(hi, c + spread); ++t) out[k++] = t;
  return k;
}

float half_scale(float v) { return std::min(v, kHalfMax); }

// Q4_K/Q5_K, given the float16 super-block scales: per sub-block the 6-bit scale and min (near the fitted
// ones) and levels of least squared error of the decoded values. Returns the block's squared error.
template <int kNmax>
float assign_k_affine(const SubBlock<2>* subs, const AffineFit* fits, float d, float dmin, int* sc, int* mc,
                      int* L) {
  float total = 0.0f;
  for (int j = 0; j < 8; ++j) {
    int cs[5], cm[5], trial[32];
    const int ns = candidates(fits[j].scale, d, 0, 63, 1, cs);
    const int nm = candidates(fits[j].min, dmin, 0, 63, 1, cm);
    float best = FLT_MAX;
    for (int a = 0; a < ns; ++a) {
      for (int b = 0; b < nm; ++b) {
        const float err = affine_error(subs[j], kNmax, d * static_cast<float>(cs[a]),
                                       dmin * static_cast<float>(cm[b]), trial);
        if (err < best) {
          best = err;
          sc[j] = cs[a];
          mc[j] = cm[b];
          std::memcpy(L + 32 * j, trial, sizeof trial);
        }
      }
    }
    total += best;
  }
  return total;
}

// Q4_K/Q5_K: 8 sub-blocks of 32; returns the levels, 6-bit scales and mins, and the float16 scales.
template <int kNmax>
void quantize_k_affine(const float* x, uint16_t* d_out, uint16_t* dmin_out, int* sc, int* mc, int* L) {
  const SubBlock<2> subs[8] = {SubBlock<2>(x), SubBlock<2>(x + 32), SubBlock<2>(x + 64), SubBlock<2>(x + 96),
                                SubBlock<2>(x + 128), SubBlock<2>(x + 160), SubBlock<2>(x + 192), SubBlock<2>(x + 224)};
  AffineFit fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fits[j] = search_affine(subs[j], kNmax);
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  uint16_t dh = ggml_ext_fp32_to_fp16(half_scale(max_scale / 63.0f));
  uint16_t mh = ggml_ext_fp32_to_fp16(half_scale(max_min / 63.0f));
  float err = assign_k_affine<kNmax>(subs, fits, ggml_ext_fp16_to_fp32(dh), ggml_ext_fp16_to_fp32(mh), sc, mc, L);
  // The decoded values are linear in (d, dmin) for fixed integers: refit both by least squares and keep
  // the result (re-assigned around it) while it lowers the error.
  for (int round = 0; round < 2; ++round) {
    double aa = 0, ab = 0, bb = 0, ax = 0, bx = 0;  // a = sc*L, b = -mc
    for (int i = 0; i < 256; ++i) {
      const double a = static_cast<double>(sc[i / 32]) * L[i], b = -static_cast<double>(mc[i / 32]);
      aa += a * a;
      ab += a * b;
      bb += b * b;
      ax += a * x[i];
      bx += b * x[i];
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
    int sc2[8], mc2[8], L2[256];
    const float err2 = assign_k_affine<kNmax>(subs, fits, ggml_ext_fp16_to_fp32(dh2), ggml_ext_fp16_to_fp32(mh2),
                                              sc2, mc2, L2);
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

// The 12 scale bytes of Q4_K/Q5_K (inverse of ggml_ext_k4_scale / ggml_ext_k4_min).
void pack_k4_scales(const int* sc, const int* mc, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(mc[j] | ((mc[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mc[j + 4] & 0xF) << 4));
  }
}

void quantize_block(const float* x, block_q4_k* y) {
  int sc[8], mc[8], L[256];
  quantize_k_affine<15>(x, &y->d, &y->dmin, sc, mc, L);
  pack_k4_scales(sc, mc, y->scales);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_block(const float* x, block_q5_k* y) {
  int sc[8], mc[8], L[256];
  quantize_k_affine<31>(x, &y->d, &y->dmin, sc, mc, L);
  pack_k4_scales(sc, mc, y->scales);
  std::memset(y->qh, 0, sizeof y->qh);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      y->qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      y->qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

// Q6_K sub-block fit x ~ scale * L, L in [-32, 31] (scale of either sign: the extreme may use the -32 side).
struct SymmetricFit {
  float scale = 0.0f;
  float err = 0.0f;
};

SymmetricFit fit_symmetric(const SubBlock<1>& s, const v16f& L) {
  const float slx = sum16(L * s.x[0]), sl2 = sum16(L * L);
  SymmetricFit f;
  f.scale = sl2 > 0 ? slx / sl2 : 0.0f;
  const v16f r = f.scale * L - s.x[0];
  f.err = sum16(r * r);
  return f;
}

SymmetricFit search_symmetric(const SubBlock<1>& s) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    if (std::fabs(s.x[0][i]) > amax) {
      amax = std::fabs(s.x[0][i]);
      vmax = s.x[0][i];
    }
  }
  SymmetricFit best;
  if (amax == 0.0f) return best;
  best.err = sum16(s.x[0] * s.x[0]);
  // The extreme mapped to levels around -32 or +31 (a little past them clips it).
  for (int step = -12; step <= 6; ++step) {
    for (float target : {-32.0f - 0.5f * static_cast<float>(step), 31.0f + 0.5f * static_cast<float>(step)}) {
      const SymmetricFit f = fit_symmetric(s, clamp_round((target / vmax) * s.x[0], -32.0f, 31.0f));
      if (f.err < best.err) best = f;
    }
  }
  for (int round = 0; round < 4 && best.scale != 0.0f; ++round) {
    const SymmetricFit f = fit_symmetric(s, clamp_round((1.0f / best.scale) * s.x[0], -32.0f, 31.0f));
    if (!(f.err < best.err)) break;
    best = f;
  }
  return best;
}

float symmetric_error(const SubBlock<1>& s, float dl, int* levels) {
  const v16f L = dl != 0.0f ? clamp_round(s.x[0] / dl, -32.0f, 31.0f) : v16f{};
  const v16f r = dl * L - s.x[0];
  const v16f Ls[1] = {L};
  store_levels(Ls, levels);
  return sum16(r * r);
}

void quantize_block(const float* x, block_q6_k* y) {
  SymmetricFit fits[16];
  float max_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    fits[j] = search_symmetric(SubBlock<1>(x + 16 * j));
    if (std::fabs(fits[j].scale) > std::fabs(max_scale)) max_scale = fits[j].scale;
  }
  // The largest scale maps to -128, the int8 extreme (one step finer than 127).
  const float d_raw = -max_scale / 128.0f;
  y->d = ggml_ext_fp32_to_fp16(std::copysign(half_scale(std::fabs(d_raw)), d_raw));
  const float d = ggml_ext_fp16_to_fp32(y->d);
  int L[256];
  for (int j = 0; j < 16; ++j) {
    int cs[5], trial[16];
    const int ns = candidates(fits[j].scale, d, -128, 127, 2, cs);
    float best = FLT_MAX;
    for (int a = 0; a < ns; ++a) {
      const float err = symmetric_error(SubBlock<1>(x + 16 * j), d * static_cast<float>(cs[a]), trial);
      if (err < best) {
        best = err;
        y->scales[j] = static_cast<int8_t>(cs[a]);
        std::memcpy(L + 16 * j, trial, sizeof trial);
      }
    }
  }
  // Per 128-element half h, element 32*s + l: low nibble in ql[64h + l + 32*(s&1)] (high nibble for s >= 2),
  // two high bits at 2*s of qh[32h + l].
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      int q[4];
      for (int s = 0; s < 4; ++s) q[s] = L[128 * h + 32 * s + l] + 32;
      y->ql[64 * h + l] = static_cast<uint8_t>((q[0] & 0xF) | ((q[2] & 0xF) << 4));
      y->ql[64 * h + 32 + l] = static_cast<uint8_t>((q[1] & 0xF) | ((q[3] & 0xF) << 4));
      y->qh[32 * h + l] = static_cast<uint8_t>((q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6));
    }
  }
}

// ------------------------------------------------------------------------------------------------ non-finite

// Every float16 scale NaN: each element decodes to NaN.
template <class Block>
void poison_block(Block* y) {
  std::memset(y, 0, sizeof *y);
  y->d = kHalfNaN;
  if constexpr (requires { y->m; }) y->m = kHalfNaN;
  if constexpr (requires { y->dmin; }) y->dmin = kHalfNaN;
}
// E8M0 0xFF (OCP MX's NaN) with code 12: ggml decodes 12 * 2^127 = +inf.
template <>
void poison_block(block_mxfp4* y) {
  y->e = 0xFF;
  std::memset(y->qs, 0x77, sizeof y->qs);
}

// ------------------------------------------------------------------------------------------------ driver

template <class In, class Block, int QK>
void quantize_blocks(const QuantizeArgs& a, int64_t begin, int64_t end) {
  const auto* x = static_cast<const typename In::T*>(a.x);
  auto* y = static_cast<Block*>(a.blocks);
  float v[QK];
  for (int64_t i = begin; i < end; ++i) {
    for (int k = 0; k < QK; k += kLanes) F32::store(v + k, In::load(x + i * QK + k));
    if (all_finite(v, QK)) {
      quantize_block(v, y + i);
    } else {
      poison_block(y + i);
    }
  }
}

template <class In, class Block, int QK>
void run_blocks(const QuantizeArgs& a) {
  parallel_for(a.n_blocks, std::max<int64_t>(1, kGrainElements / QK),
               [&](int64_t b, int64_t e) { quantize_blocks<In, Block, QK>(a, b, e); });
}

template <class Out, class In>
void run_convert(const QuantizeArgs& a) {
  const auto* x = static_cast<const typename In::T*>(a.x);
  auto* y = static_cast<typename Out::T*>(a.blocks);
  parallel_for(a.n_blocks, 4 * kGrainElements, [&](int64_t b, int64_t e) { convert_floats<Out, In>(x, y, b, e); });
}

template <class In>
void quantize_from(const QuantizeArgs& a) {
  switch (a.type) {
    case GGML_EXT_TYPE_F32: return run_convert<F32, In>(a);
    case GGML_EXT_TYPE_F16: return run_convert<F16, In>(a);
    case GGML_EXT_TYPE_BF16: return run_convert<BF16, In>(a);
    case GGML_EXT_TYPE_Q4_0: return run_blocks<In, block_q4_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q4_1: return run_blocks<In, block_q4_1, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q5_0: return run_blocks<In, block_q5_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q5_1: return run_blocks<In, block_q5_1, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q8_0: return run_blocks<In, block_q8_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_MXFP4: return run_blocks<In, block_mxfp4, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q4_K: return run_blocks<In, block_q4_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q5_K: return run_blocks<In, block_q5_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q6_K: return run_blocks<In, block_q6_k, GGML_EXT_QK_K>(a);
    default: return;  // the primitive validated the type
  }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  GGML_EXT_FLOAT_SWITCH(a.in_type, In, quantize_from<In>(a));
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(quantize, QuantizeArgs)

}  // namespace ggml_ext::cpu
