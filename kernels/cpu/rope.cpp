#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

typedef double vf64 __attribute__((vector_size(kLanes * 8)));
typedef int64_t vi64 __attribute__((vector_size(kLanes * 8)));
typedef int32_t vi32 __attribute__((vector_size(kLanes * 4)));

// ---------------------------------------------------------------------------
// sin and cos of float32 angles, about one ulp. ggml computes cosf/sinf of the
// float angle, which reaches 1e5 rad and more for long contexts, so the reduction
// by multiples of pi/2 runs in double with pi/2 = kHalfPiHi + kHalfPiLo, kHalfPiHi
// having 32 significant bits: j * kHalfPiHi is exact for |j| < 2^21, with or
// without FMA. Lanes beyond that range (or not finite) take the scalar library.
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
constexpr double kHalfPiHi = 0x1.921fb544p+0;
constexpr double kHalfPiLo = 0x1.0b4611a626331p-34;
constexpr float kReducedRange = 0x1p21f;
constexpr double kRoundShifter = 0x1.8p52;  // x + 1.5*2^52 rounds x to an integer in the low bits

struct SinCos {
  vf32 sin, cos;
};

inline vf32 select(vi32 mask, vf32 if_set, vf32 if_clear) {
  return (vf32)(((vu32)if_set & (vu32)mask) | ((vu32)if_clear & ~(vu32)mask));
}

SinCos sincos(vf32 x) {
  const vf64 xd = __builtin_convertvector(x, vf64);
  const vf64 shifted = xd * kTwoOverPi + kRoundShifter;
  const vf64 j = shifted - kRoundShifter;
  const vf32 r = __builtin_convertvector((xd - j * kHalfPiHi) - j * kHalfPiLo, vf32);
  // Taylor series on |r| <= pi/4; the first omitted terms are below 2e-9.
  const vf32 r2 = r * r;
  const vf32 sin_r =
      r + r * r2 * (-1.0f / 6 + r2 * (1.0f / 120 + r2 * (-1.0f / 5040 + r2 * (1.0f / 362880))));
  const vf32 cos_r =
      1.0f - 0.5f * r2 +
      r2 * r2 * (1.0f / 24 + r2 * (-1.0f / 720 + r2 * (1.0f / 40320 + r2 * (-1.0f / 3628800))));
  // x = j*pi/2 + r: quadrant j mod 4 swaps sin/cos (odd) and sets their signs.
  const vi32 quadrant = __builtin_convertvector((vi64)shifted & 3, vi32);
  const vi32 odd = (quadrant & 1) != 0;
  const vu32 sin_sign = (vu32)(quadrant & 2) << 30;
  const vu32 cos_sign = (vu32)((quadrant + 1) & 2) << 30;
  SinCos out{(vf32)((vu32)select(odd, cos_r, sin_r) ^ sin_sign),
             (vf32)((vu32)select(odd, sin_r, cos_r) ^ cos_sign)};

  const vf32 magnitude = (vf32)((vu32)x & 0x7fffffffu);
  const vi32 outside = (magnitude <= kReducedRange) == 0;  // NaN lands here too
  const vi32 none = {};
  if (std::memcmp(&outside, &none, sizeof none) == 0) return out;  // the common case, one vector test
  for (int l = 0; l < kLanes; ++l) {
    if (outside[l]) {
      out.sin[l] = static_cast<float>(std::sin(static_cast<double>(x[l])));
      out.cos[l] = static_cast<float>(std::cos(static_cast<double>(x[l])));
    }
  }
  return out;
}

// v * w rounded once to float32. The product of two floats is exact in double, so
// going through double makes it a separate rounding that FMA contraction cannot
// fuse with the following add: the YaRN mix must round like the SPEC's formula.
inline vf32 rounded_product(vf32 v, vf32 w) {
  return __builtin_convertvector(__builtin_convertvector(v, vf64) * __builtin_convertvector(w, vf64), vf32);
}

template <size_t kFrom, size_t... I>
inline vf32 interleave_impl(vf32 a, vf32 b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I % 2 ? kLanes : 0) + kFrom + I / 2)...);
}

// (a0, b0, a1, b1, ...) from the low halves of a and b, or from the high halves.
inline vf32 interleave_low(vf32 a, vf32 b) {
  return interleave_impl<0>(a, b, std::make_index_sequence<kLanes>{});
}
inline vf32 interleave_high(vf32 a, vf32 b) {
  return interleave_impl<kLanes / 2>(a, b, std::make_index_sequence<kLanes>{});
}

template <size_t kOdd, size_t... I>
inline vf32 deinterleave_impl(vf32 a, vf32 b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * I + kOdd)...);
}

// The even-indexed (or odd-indexed) elements of the concatenation a, b.
inline vf32 evens(vf32 a, vf32 b) { return deinterleave_impl<0>(a, b, std::make_index_sequence<kLanes>{}); }
inline vf32 odds(vf32 a, vf32 b) { return deinterleave_impl<1>(a, b, std::make_index_sequence<kLanes>{}); }

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Transposes kLanes vectors in place (rows[k][l] <-> rows[l][k]): log2(kLanes)
// rounds of interleaving row j with row j + kLanes/2.
inline void transpose(vf32 (&rows)[kLanes]) {
  for (int round = 1; round < kLanes; round *= 2) {
    vf32 next[kLanes];
    for (int j = 0; j < kLanes / 2; ++j) {
      next[2 * j] = interleave_low(rows[j], rows[j + kLanes / 2]);
      next[2 * j + 1] = interleave_high(rows[j], rows[j + kLanes / 2]);
    }
    for (int j = 0; j < kLanes; ++j) rows[j] = next[j];
  }
}

// Per-thread scratch. The pair axis is padded to whole vectors (padding pairs use
// factor 1 and no ramp; their values are never read back).
struct Scratch {
  int64_t pairs;         // n_dims/2 rounded up to kLanes
  std::vector<float> buf;
  float* factors;        // (pairs)
  float* ramp;           // (pairs) r
  float* keep;           // (pairs) 1 - r
  float* cos_tab;        // (kLanes, pairs): cos of each pair, one row per token
  float* sin_tab;        // (kLanes, pairs): sin times the sign of the rotation

  explicit Scratch(const RopeArgs& a) : pairs(round_up(a.n_dims / 2, kLanes)) {
    buf.assign(pairs * (2 * kLanes + 3), 0.0f);
    factors = buf.data();
    ramp = factors + pairs;
    keep = ramp + pairs;
    cos_tab = keep + pairs;
    sin_tab = cos_tab + pairs * kLanes;
    const int64_t half = a.n_dims / 2;
    std::fill(factors, factors + pairs, 1.0f);
    for (int64_t i = 0; i < half; ++i) {
      ramp[i] = a.ramp ? a.ramp[i] : 0.0f;
      keep[i] = 1.0f - ramp[i];
    }
    std::fill(keep + half, keep + pairs, 1.0f);
  }
};

// cos and sin of every pair for up to kLanes consecutive tokens (row l of
// cos_tab/sin_tab for token l), both scaled by mscale.
void fill_tables(const RopeArgs& a, const int32_t* positions, const float* factors, int64_t tokens,
                 Scratch& w) {
  const RopeAngles& g = a.angles;
  if (factors) std::memcpy(w.factors, factors, (a.n_dims / 2) * sizeof(float));
  const float sin_scale = g.mscale * g.sin_sign;
  vi32 pos = {};
  for (int64_t l = 0; l < tokens; ++l) pos[l] = positions[l];
  vf32 theta = __builtin_convertvector(pos, vf32);
  for (int64_t i = 0; i < w.pairs; i += kLanes) {
    // The SPEC's iterated float32 product runs along the pairs, so it is vectorized
    // across tokens (one per lane); a transpose turns kLanes pairs of it into one
    // vector per token, and the rest runs kLanes pairs at a time.
    vf32 rows[kLanes];
    for (int k = 0; k < kLanes; ++k) {
      rows[k] = theta;
      theta *= g.theta_scale;  // an iterated product, not a pow per pair
    }
    transpose(rows);
    const vf32 factor = factors ? F32::load(w.factors + i) : splat(1.0f);
    const vf32 keep = F32::load(w.keep + i), ramp = F32::load(w.ramp + i);
    for (int64_t l = 0; l < tokens; ++l) {
      const vf32 extrap = factors ? rows[l] / factor : rows[l];
      const vf32 interp = extrap * g.freq_scale;
      const vf32 angle =
          a.ramp ? rounded_product(interp, keep) + rounded_product(extrap, ramp) : interp;
      const SinCos sc = sincos(angle);
      F32::store(w.cos_tab + l * w.pairs + i, sc.cos * g.mscale);
      F32::store(w.sin_tab + l * w.pairs + i, sc.sin * sin_scale);
    }
  }
}

// Where a head's rotated elements go: straight into y, or pushed through an
// AlignedRowStream, which takes whole vectors in increasing element order only.
// `later` is for outputs that come before their turn (NEOX's second half): the
// stream holds them until `flush`, when the head's earlier elements have gone.
template <class Fmt>
struct DirectOut {
  typename Fmt::T* y;
  void vector(int64_t k, vf32 v) { Fmt::store(y + k, v); }
  void later(int64_t k, vf32 v) { vector(k, v); }
  void flush() {}
  void element(int64_t k, float v) { y[k] = Fmt::from_f32(v); }
};

#if defined(__AVX512F__) || defined(__AVX2__)
struct StreamOut {  // float32 rows only (see rope())
  AlignedRowStream& row;
  float* held;  // room for half a head
  int64_t n_held = 0;
  void vector(int64_t, vf32 v) { row.push(v); }
  void later(int64_t, vf32 v) { F32::store(held + kLanes * n_held++, v); }
  void flush() {
    for (int64_t i = 0; i < n_held; ++i) row.push(F32::load(held + kLanes * i));
    n_held = 0;
  }
  void element(int64_t, float) { __builtin_unreachable(); }  // rows_are_whole_vectors
};
#endif

// NORMAL: pairs (2i, 2i+1). Two vectors at a time are split into their even and
// odd elements, rotated like NEOX's halves and interleaved back: half the table
// loads of a duplicated-table layout, which measured faster.
template <class Fmt, class Out>
void rotate_normal(const typename Fmt::T* x, Out& out, const float* ct, const float* st, int64_t n_dims) {
  int64_t k = 0;
  for (; k + 2 * kLanes <= n_dims; k += 2 * kLanes) {
    const vf32 va = Fmt::load(x + k), vb = Fmt::load(x + k + kLanes);
    const vf32 x0 = evens(va, vb), x1 = odds(va, vb);
    const vf32 c = F32::load(ct + k / 2), s = F32::load(st + k / 2);
    const vf32 y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    out.vector(k, interleave_low(y0, y1));
    out.vector(k + kLanes, interleave_high(y0, y1));
  }
  for (; k < n_dims; k += 2) {
    const float x0 = Fmt::to_f32(x[k]), x1 = Fmt::to_f32(x[k + 1]);
    out.element(k, x0 * ct[k / 2] - x1 * st[k / 2]);
    out.element(k + 1, x0 * st[k / 2] + x1 * ct[k / 2]);
  }
}

// NEOX: pairs (i, i + n_dims/2), two contiguous halves. One pass (x may be y).
template <class Fmt, class Out>
void rotate_neox(const typename Fmt::T* x, Out& out, const float* ct, const float* st, int64_t n_dims) {
  const int64_t half = n_dims / 2;
  int64_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {
    const vf32 x0 = Fmt::load(x + i), x1 = Fmt::load(x + half + i);
    const vf32 c = F32::load(ct + i), s = F32::load(st + i);
    out.vector(i, x0 * c - x1 * s);
    out.later(half + i, x0 * s + x1 * c);
  }
  for (; i < half; ++i) {
    const float x0 = Fmt::to_f32(x[i]), x1 = Fmt::to_f32(x[half + i]);
    out.element(i, x0 * ct[i] - x1 * st[i]);
    out.element(half + i, x0 * st[i] + x1 * ct[i]);
  }
  out.flush();
}

template <class Fmt, class Out>
void rotate_head(const RopeArgs& a, const typename Fmt::T* x, Out& out, const float* ct, const float* st) {
  if (a.neox) {
    rotate_neox<Fmt>(x, out, ct, st, a.n_dims);
  } else {
    rotate_normal<Fmt>(x, out, ct, st, a.n_dims);
  }
}

// x's head rms-normed over its `dim` elements and multiplied by `weight`, into float32 `out`; the sum of squares in
// double (ggml's rms_norm sums in ggml_float).
template <class Fmt>
void normed_head(const typename Fmt::T* x, const float* weight, const RopeArgs& a, float* out) {
  double sum = 0.0;
  for (int64_t k = 0; k < a.dim; ++k) {
    const double v = Fmt::to_f32(x[k]);
    sum += v * v;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(a.dim)) + a.norm_eps);
  for (int64_t k = 0; k < a.dim; ++k) out[k] = Fmt::to_f32(x[k]) * scale * weight[k];
}

// Whether every head is whole vectors: its rotated part with no scalar tail and the
// copied rest (dim - n_dims) in whole vectors, so a token row can be streamed
// through an AlignedRowStream.
bool rows_are_whole_vectors(const RopeArgs& a) {
  // NORMAL rotates two vectors at a time, NEOX a vector of each half
  return a.n_dims % (2 * kLanes) == 0 && (a.dim - a.n_dims) % kLanes == 0;
}

// How the work is cut: a unit is up to `group` consecutive tokens of up to
// `batches_per_unit` of the batches that share one angle table (same positions and
// freq_factors rows). Its table is computed once and applied to all its heads.
struct Split {
  int64_t group;              // tokens per unit (<= kLanes: one per lane of the table math)
  int64_t groups;             // per token row
  int64_t batches_per_table;
  int64_t batches_per_unit;
  int64_t chunks;             // units per (table, token group)
  int64_t units;
};

Split split_work(const RopeArgs& a) {
  Split w{};
  w.batches_per_table =
      std::min(a.batches_per_positions_row, a.freq_factors ? a.batches_per_factors_row : a.batches);
  const int64_t tables = a.batches / w.batches_per_table;
  // Enough units to share among the threads: fewer tokens per table, then fewer
  // batches per unit, when the full-width split leaves too few. Results do not
  // depend on the split: every lane of the table math is computed alone.
  const int64_t wanted = 4 * static_cast<int64_t>(num_threads());
  w.group = std::clamp<int64_t>(tables * a.tokens / wanted, 1, std::min<int64_t>(kLanes, a.tokens));
  w.groups = (a.tokens + w.group - 1) / w.group;
  const int64_t chunks = std::clamp<int64_t>((wanted + tables * w.groups - 1) / (tables * w.groups), 1,
                                             w.batches_per_table);
  w.batches_per_unit = (w.batches_per_table + chunks - 1) / chunks;
  w.chunks = (w.batches_per_table + w.batches_per_unit - 1) / w.batches_per_unit;
  w.units = tables * w.groups * w.chunks;
  return w;
}

// How a token row is written: ordinary stores into y; cache-bypassing stores
// through an AlignedRowStream; or, for heads with scalar tails, rotated into a
// cached row that is then streamed out.
enum class Output { direct, streamed, staged };

template <class Fmt, Output kOut>
void rope_units(const RopeArgs& a, const Split& w, int64_t begin, int64_t end) {
  using T = typename Fmt::T;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const int64_t half = a.n_dims / 2;
  const int64_t row = a.heads * a.dim;  // one token
  const bool copy_rest = (x != y || kOut == Output::staged) && a.dim > a.n_dims;
  const int64_t rotated = a.heads - a.copied_heads;
  const bool copy_heads = (x != y || kOut == Output::staged) && a.copied_heads > 0;
  Scratch scratch(a);
  std::vector<float> normed(a.q_norm ? a.dim : 0);
  std::vector<T> staged(kOut == Output::staged ? row : kOut == Output::streamed ? half : 0);
  for (int64_t u = begin; u < end; ++u) {
    const int64_t chunk = u % w.chunks;
    const int64_t t0 = (u / w.chunks % w.groups) * w.group;
    const int64_t table_batch = u / (w.chunks * w.groups) * w.batches_per_table;
    const int64_t first_batch = table_batch + chunk * w.batches_per_unit;
    const int64_t end_batch = std::min(first_batch + w.batches_per_unit, table_batch + w.batches_per_table);
    const int64_t n_tok = std::min(w.group, a.tokens - t0);
    const int32_t* pos = a.positions + (table_batch / a.batches_per_positions_row) * a.tokens + t0;
    const float* factors =
        a.freq_factors ? a.freq_factors + (table_batch / a.batches_per_factors_row) * half : nullptr;
    fill_tables(a, pos, factors, n_tok, scratch);
    for (int64_t b = first_batch; b < end_batch; ++b) {
      for (int64_t l = 0; l < n_tok; ++l) {
        const float* ct = scratch.cos_tab + l * scratch.pairs;
        const float* st = scratch.sin_tab + l * scratch.pairs;
        const int64_t token_offset = (b * a.tokens + t0 + l) * row;
        const T* xt = x + token_offset;
#if defined(__AVX512F__) || defined(__AVX2__)
        if constexpr (kOut == Output::streamed) {
          static_assert(std::is_same_v<Fmt, F32>);
          AlignedRowStream stream(y + token_offset);
          StreamOut out{stream, staged.data()};
          for (int64_t h = 0; h < a.heads; ++h) {
            const float* xr = xt + h * a.dim;
            const int64_t copied_from = h < rotated ? a.n_dims : 0;
            if (h < rotated) rotate_head<Fmt>(a, xr, out, ct, st);
            for (int64_t k = copied_from; k < a.dim; k += kLanes) stream.push(F32::load(xr + k));
          }
          stream.finish();
          continue;
        }
#endif
        T* yt = kOut == Output::staged ? staged.data() : y + token_offset;
        for (int64_t h = 0; h < rotated; ++h) {
          DirectOut<Fmt> out{yt + h * a.dim};
          if (a.q_norm) {  // the head normed into float32 first, then rotated from there
            normed_head<Fmt>(xt + h * a.dim, h < a.q_heads ? a.q_norm : a.k_norm, a, normed.data());
            rotate_head<F32>(a, normed.data(), out, ct, st);
            for (int64_t k = a.n_dims; k < a.dim; ++k) out.y[k] = Fmt::from_f32(normed[k]);
            continue;
          }
          rotate_head<Fmt>(a, xt + h * a.dim, out, ct, st);
          if (copy_rest) std::memcpy(out.y + a.n_dims, xt + h * a.dim + a.n_dims, (a.dim - a.n_dims) * sizeof(T));
        }
        if (copy_heads) std::memcpy(yt + rotated * a.dim, xt + rotated * a.dim, a.copied_heads * a.dim * sizeof(T));
        if constexpr (kOut == Output::staged) stream_copy_bytes(y + token_offset, yt, row * sizeof(T));
      }
    }
  }
  if constexpr (kOut != Output::direct) stream_fence();
}

}  // namespace

void rope(const RopeArgs& a) {
  if (a.batches == 0 || a.tokens == 0 || a.heads == 0 || a.dim == 0) return;
  const Split w = split_work(a);
  // Threads only pay off past a few tens of kilobytes per part.
  const int64_t unit_elems = w.group * w.batches_per_unit * a.heads * a.dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, unit_elems));
  const bool stream = kHasStreamingStores && a.batches * a.tokens * a.heads * a.dim *
                                                 float_type_bytes(a.type) >= kStreamingStoreMinBytes;
  GGML_EXT_FLOAT_SWITCH(a.type, Fmt, {
    // Float32 rows of whole vectors stream straight out (token rows start at
    // multiples of the element size when y does). The 16-bit formats stay staged:
    // their conversions make the kernel compute-bound, where the staging copy costs
    // nothing and the joins' permutes do (f16/bf16 NEOX 8-14% slower streamed).
    const bool whole_f32_rows = std::is_same_v<Fmt, F32> && rows_are_whole_vectors(a) &&
                                stream_row_supported(static_cast<const float*>(a.y));
    // Normed heads go through the row-at-a-time paths (their float32 copy is rotated into the output).
    const Output output = !stream ? Output::direct : whole_f32_rows && !a.q_norm ? Output::streamed : Output::staged;
    parallel_for(w.units, grain, [&](int64_t b, int64_t e) {
      switch (output) {
        case Output::direct: return rope_units<Fmt, Output::direct>(a, w, b, e);
        case Output::streamed:
          if constexpr (std::is_same_v<Fmt, F32>) return rope_units<Fmt, Output::streamed>(a, w, b, e);
          __builtin_unreachable();
        case Output::staged: return rope_units<Fmt, Output::staged>(a, w, b, e);
      }
    });
  });
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(rope, RopeArgs)

}  // namespace ggml_ext::cpu
