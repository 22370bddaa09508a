// Products with a weight stored as ggml blocks, on the blocks.
//
// Forward, quantized weight: each row of x is quantized to int8 per 32 elements (scale amax / 127, as ggml's
// Q8_0), and each weight row is decoded 64 elements at a time (four 16-element chunks, through the shared
// layouts of kernels/common/ggml_blocks.h) into int8 codes plus one float scale and offset per chunk. The
// integer dot products of 4 consecutive elements land in one int32 lane, which is then scaled by the
// activation's and the chunk's scales in float32:
//     sum_j w_j x_j = sum_lanes s_w * d_x * (sum_4 code_j q_j) + o_w * (sum_4 x_j)
// (o_w: the chunk's offset, for Q4_1, Q5_1, Q2_K, Q4_K, Q5_K; the activation sums are exact float sums).
// The per-lane integer dot is one VNNI instruction on AVX-512 (codes offset by 128 to be unsigned, with the
// 128 * sum(q) it adds taken off in advance), maddubs/madd on AVX2, sdot or widening multiplies on NEON.
// Rows of x are taken in tiles of up to 8, so each weight group is decoded once per tile: decode (M <= 8)
// streams the weight once with every thread; prefill tiles M by 8 and keeps a slice of weight rows in L2.
//
// Float weights (F32/F16/BF16) and the transposed product (x's gradient) use float32 arithmetic on the
// decoded values: the transposed product decodes each block once and adds it, scaled, into a strip of the
// output that stays in cache.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

typedef int8_t vi8x64 __attribute__((vector_size(64)));

constexpr int kGroup = 64;         // weight elements per step: four 16-element chunks
constexpr int kGroupLanes = 16;    // int32 lanes per step, 4 elements each
constexpr int kActBlock = 32;      // elements per activation scale
constexpr int kTileRows = 8;       // rows of x per weight pass
constexpr int64_t kL2WeightBytes = 192 << 10;  // weight rows kept in cache across the row tiles of x

template <class V>
inline V load_vec(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Activations: rows of x quantized per 32 elements, laid out in 64-element groups. Per group and row:
// q[64] int8, and per lane of 4 elements: d (the lane's activation scale), s (the exact float sum of its 4
// x values) and z (-128 * the sum of its 4 codes: what offsetting the weight codes by 128 adds).
// ---------------------------------------------------------------------------------------------------
struct QuantizedRows {
  int64_t groups = 0;
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> z;

  void resize(int64_t rows, int64_t n_groups) {
    groups = n_groups;
    q.assign(rows * groups * kGroup, 0);
    d.assign(rows * groups * kGroupLanes, 0.0f);
    s.assign(rows * groups * kGroupLanes, 0.0f);
    z.assign(rows * groups * kGroupLanes, 0);
  }
  int64_t at(int64_t row, int64_t group) const { return row * groups + group; }
};

template <class Fmt>
void quantize_activation_row(const typename Fmt::T* x, int64_t K, QuantizedRows& a, int64_t row) {
  int8_t* q = a.q.data() + a.at(row, 0) * kGroup;
  float* d = a.d.data() + a.at(row, 0) * kGroupLanes;
  float* s = a.s.data() + a.at(row, 0) * kGroupLanes;
  int32_t* z = a.z.data() + a.at(row, 0) * kGroupLanes;
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float v[kActBlock];
    float amax = 0.0f;
    for (int j = 0; j < kActBlock; ++j) {
      v[j] = k0 + j < K ? Fmt::to_f32(x[k0 + j]) : 0.0f;
      const float m = std::fabs(v[j]);
      amax = (m > amax || m != m) ? m : amax;  // a NaN stays the maximum, so the row's result is NaN
    }
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f && std::isfinite(scale) ? 1.0f / scale : 0.0f;
    int8_t* qb = q + k0;
    for (int j = 0; j < kActBlock; ++j) qb[j] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
    for (int l = 0; l < kActBlock / 4; ++l) {
      const int64_t lane = k0 / 4 + l;
      d[lane] = scale;
      s[lane] = (v[4 * l] + v[4 * l + 1]) + (v[4 * l + 2] + v[4 * l + 3]);
      z[lane] = -128 * (qb[4 * l] + qb[4 * l + 1] + qb[4 * l + 2] + qb[4 * l + 3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The integer dot of 64 weight codes with 64 activation codes, 4 elements per int32 lane.
// ---------------------------------------------------------------------------------------------------
inline __attribute__((always_inline)) vi32x16 dot_lanes(vi8x64 w, const int8_t* q, const int32_t* z) {
#if defined(__AVX512VNNI__)
  const __m512i u = (__m512i)(w ^ static_cast<int8_t>(-128));  // code + 128, unsigned
  return (vi32x16)_mm512_dpbusd_epi32(_mm512_loadu_si512(z), u, _mm512_loadu_si512(q));
#elif defined(__AVX2__)
  (void)z;
  typedef int8_t vi8x32 __attribute__((vector_size(32)));
  const __m256i ones = _mm256_set1_epi16(1);
  auto half = [&](vi8x32 wh, const int8_t* qh) {
    const __m256i wv = (__m256i)wh, qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    // |w| * (q with w's sign): products of at most 128 * 127, pairs within int16
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(qv, wv)), ones);
  };
  const vi8x32 lo = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                            19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  const vi8x32 hi = __builtin_shufflevector(w, w, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                            48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
  typedef int32_t vi32x8 __attribute__((vector_size(32)));
  const vi32x8 a = (vi32x8)half(lo, q), b = (vi32x8)half(hi, q + 32);
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#elif defined(__aarch64__) && defined(__ARM_NEON)
  (void)z;
  int32x4_t parts[4];
  for (int i = 0; i < 4; ++i) {
    const int8x16_t wv = vld1q_s8(reinterpret_cast<const int8_t*>(&w) + 16 * i), qv = vld1q_s8(q + 16 * i);
#if defined(__ARM_FEATURE_DOTPROD)
    parts[i] = vdotq_s32(vdupq_n_s32(0), wv, qv);
#else
    const int32x4_t pairs_lo = vpaddlq_s16(vmull_s8(vget_low_s8(wv), vget_low_s8(qv)));
    const int32x4_t pairs_hi = vpaddlq_s16(vmull_high_s8(wv, qv));
    parts[i] = vpaddq_s32(pairs_lo, pairs_hi);
#endif
  }
  vi32x16 r;
  std::memcpy(&r, parts, sizeof r);
  return r;
#else
  (void)z;
  vi32x16 r;
  for (int l = 0; l < kGroupLanes; ++l) {
    int sum = 0;
    for (int j = 0; j < 4; ++j) sum += static_cast<int>(w[4 * l + j]) * static_cast<int>(q[4 * l + j]);
    r[l] = sum;
  }
  return r;
#endif
}

inline vi8x64 concat_chunks(vi8x16 a, vi8x16 b, vi8x16 c, vi8x16 d) {
  typedef int8_t vi8x32 __attribute__((vector_size(32)));
  const vi8x32 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                            19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  const vi8x32 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                            19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  return __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                                 63);
}

// Four chunk values as 16 lanes, each repeated over its chunk's 4 lanes.
inline vf32x16 chunk_lanes(float a, float b, float c, float d) {
  return vf32x16{a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d};
}

// The signed offset a chunk adds per unit of x (0 for formats without one).
inline float signed_offset(const ggml_ext_scale16& s) {
  return s.offset_op == 0 ? 0.0f : s.offset_op > 0 ? s.offset : -s.offset;
}

// ---------------------------------------------------------------------------------------------------
// One weight row against a tile of MR activation rows: res[r] = sum_k W[k] x[r0 + r][k].
// ---------------------------------------------------------------------------------------------------
template <class Q, int MR, bool kOffset>
struct QuantRowDot {
  using B = typename Q::B;
  vf32x16 acc[MR] = {};
  const QuantizedRows& a;
  int64_t r0;
  vi8x16 table;

  QuantRowDot(const QuantizedRows& act, int64_t row0)
      : a(act), r0(row0), table(codebook_table(Q::layout(0).codebook)) {}

  // Formats with an offset store unsigned codes (d * q + m): centering them (d * (q - c) + (m + d * c)) makes
  // the activation's rounding errors cancel instead of adding up, about 3.6 times less error for 4 bits.
  static int center() {
    if constexpr (!kOffset) {
      return 0;
    } else {
      const ggml_ext_layout16 l = Q::layout(0);
      return (l.lo_mask + 1) * (l.hi_word ? 2 : l.hi_mask + 1) / 2;
    }
  }

  inline __attribute__((always_inline)) void step(vi8x64 codes, vf32x16 sw, vf32x16 ow, int64_t g) {
    if constexpr (kOffset) {
      codes -= static_cast<int8_t>(center());
      ow += sw * static_cast<float>(center());
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t i = a.at(r0 + r, g);
      const vi32x16 dot = dot_lanes(codes, a.q.data() + i * kGroup, a.z.data() + i * kGroupLanes);
      const vf32x16 f = __builtin_convertvector(dot, vf32x16) * load_vec<vf32x16>(a.d.data() + i * kGroupLanes);
      acc[r] += f * sw;
      if constexpr (kOffset) acc[r] += ow * load_vec<vf32x16>(a.s.data() + i * kGroupLanes);
    }
  }

  template <int C>
  inline __attribute__((always_inline)) vi8x16 codes(const uint8_t* block) const {
    return codes16(block, Q::layout(C), table);
  }

  void run(const uint8_t* row, int64_t n_blocks, float* res) {
    if constexpr (Q::kQK == 32) {
      // A group is two blocks: chunks 0, 1 of each.
      int64_t blk = 0;
      for (; blk + 2 <= n_blocks; blk += 2) {
        const uint8_t* p0 = row + blk * sizeof(B);
        const uint8_t* p1 = p0 + sizeof(B);
        const auto s0 = Q::scale(reinterpret_cast<const B*>(p0), 0);
        const auto s1 = Q::scale(reinterpret_cast<const B*>(p1), 0);
        const float o0 = signed_offset(s0), o1 = signed_offset(s1);
        step(concat_chunks(codes<0>(p0), codes<1>(p0), codes<0>(p1), codes<1>(p1)),
             chunk_lanes(s0.scale, s0.scale, s1.scale, s1.scale), chunk_lanes(o0, o0, o1, o1), blk / 2);
      }
      if (blk < n_blocks) {  // an odd block count: the last group's second half is empty
        const uint8_t* p0 = row + blk * sizeof(B);
        const auto s0 = Q::scale(reinterpret_cast<const B*>(p0), 0);
        const float o0 = signed_offset(s0);
        step(concat_chunks(codes<0>(p0), codes<1>(p0), vi8x16{}, vi8x16{}),
             chunk_lanes(s0.scale, s0.scale, 0.0f, 0.0f), chunk_lanes(o0, o0, 0.0f, 0.0f), blk / 2);
      }
    } else {
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        const auto* b = reinterpret_cast<const B*>(p);
        [&]<int... G>(std::integer_sequence<int, G...>) {
          (group<G>(p, b, blk * (Q::kQK / kGroup) + G), ...);
        }(std::make_integer_sequence<int, Q::kQK / kGroup>{});
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = hsum16(acc[r]);
  }

  template <int G>
  inline __attribute__((always_inline)) void group(const uint8_t* p, const B* b, int64_t g) {
    const auto s0 = Q::scale(b, 4 * G), s1 = Q::scale(b, 4 * G + 1);
    const auto s2 = Q::scale(b, 4 * G + 2), s3 = Q::scale(b, 4 * G + 3);
    step(concat_chunks(codes<4 * G>(p), codes<4 * G + 1>(p), codes<4 * G + 2>(p), codes<4 * G + 3>(p)),
         chunk_lanes(s0.scale, s1.scale, s2.scale, s3.scale),
         chunk_lanes(signed_offset(s0), signed_offset(s1), signed_offset(s2), signed_offset(s3)), g);
  }

  static float hsum16(vf32x16 v) {
    float t[16];
    std::memcpy(t, &v, sizeof t);
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += t[i];
    return s;
  }
};

// Float weights: rows of x in float32, padded to whole rows of the tile.
template <class WFmt, int MR>
void float_row_dot(const typename WFmt::T* w, int64_t K, const float* x, int64_t ldx, float* res) {
  vf32 acc0[MR] = {}, acc1[MR] = {};
  int64_t k = 0;
  for (; k + 2 * kLanes <= K; k += 2 * kLanes) {
    const vf32 w0 = WFmt::load(w + k), w1 = WFmt::load(w + k + kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      acc0[r] += w0 * F32::load(x + r * ldx + k);
      acc1[r] += w1 * F32::load(x + r * ldx + k + kLanes);
    }
  }
  for (; k + kLanes <= K; k += kLanes) {
    const vf32 w0 = WFmt::load(w + k);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc0[r] += w0 * F32::load(x + r * ldx + k);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float s = hsum(acc0[r] + acc1[r]);
    for (int64_t t = k; t < K; ++t) s += WFmt::to_f32(w[t]) * x[r * ldx + t];
    res[r] = s;
  }
}

// ---------------------------------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------------------------------
inline int tile_instance(int64_t rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8; }

// Calls body<MR>() with MR the tile instance for `rows` (1, 2, 4 or 8; the activations are padded with zero
// rows up to a multiple of 8, so the extra rows read zeros and their results are dropped).
template <class Body>
inline void with_tile(int64_t rows, Body&& body) {
  switch (tile_instance(rows)) {
    case 1: return body.template operator()<1>();
    case 2: return body.template operator()<2>();
    case 4: return body.template operator()<4>();
    default: return body.template operator()<8>();
  }
}

int64_t padded_rows(int64_t M) { return (M + kTileRows - 1) / kTileRows * kTileRows; }

// Walks the (row tile, weight row) pairs of the forward product over the thread pool: weight rows split
// across threads, each thread's rows taken in cache-sized slices, every row tile of x against each slice.
template <class DotTile>
void forward_tiles(const MatmulArgs& a, int64_t row_bytes, DotTile&& dot_tile) {
  const int64_t slice = std::max<int64_t>(1, kL2WeightBytes / std::max<int64_t>(1, row_bytes));
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, a.K));
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(a.N, grain, [&](int64_t n0, int64_t n1) {
      float res[kTileRows];
      for (int64_t s0 = n0; s0 < n1; s0 += slice) {
        const int64_t s1 = std::min(n1, s0 + slice);
        for (int64_t m0 = 0; m0 < a.M; m0 += kTileRows) {
          const int64_t rows = std::min<int64_t>(kTileRows, a.M - m0);
          for (int64_t n = s0; n < s1; ++n) {
            dot_tile(n, m0, rows, res);
            for (int64_t r = 0; r < rows; ++r) out[(m0 + r) * a.N + n] = Out::from_f32(res[r]);
          }
        }
      }
    });
  });
}

template <class Q, bool kOffset>
void forward_quantized(const MatmulArgs& a, const QuantizedRows& act) {
  const int64_t n_blocks = a.K / Q::kQK;
  const int64_t row_bytes = n_blocks * sizeof(typename Q::B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  forward_tiles(a, row_bytes, [&](int64_t n, int64_t m0, int64_t rows, float* res) {
    with_tile(rows, [&]<int MR>() { QuantRowDot<Q, MR, kOffset>(act, m0).run(w + n * row_bytes, n_blocks, res); });
  });
}

template <class Q>
void forward_quantized(const MatmulArgs& a) {
  QuantizedRows act;
  act.resize(padded_rows(a.M), (a.K + kGroup - 1) / kGroup);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    parallel_for(a.M, std::max<int64_t>(1, 16384 / a.K),
                 [&](int64_t m0, int64_t m1) {
                   for (int64_t m = m0; m < m1; ++m) quantize_activation_row<In>(x + m * a.K, a.K, act, m);
                 });
  });
  // Whether the format has per-chunk offsets is a property of the type: ask its scale function.
  typename Q::B probe{};
  if (Q::scale(&probe, 0).offset_op != 0) {
    forward_quantized<Q, true>(a, act);
  } else {
    forward_quantized<Q, false>(a, act);
  }
}

// x as float32 rows (zero rows appended up to a multiple of the tile).
std::vector<float> float_rows(const MatmulArgs& a, int64_t cols) {
  std::vector<float> xf(padded_rows(a.M) * cols, 0.0f);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    for (int64_t i = 0; i < a.M * cols; ++i) xf[i] = In::to_f32(x[i]);
  });
  return xf;
}

template <class WFmt>
void forward_float(const MatmulArgs& a) {
  const std::vector<float> xf = float_rows(a, a.K);
  const auto* w = static_cast<const typename WFmt::T*>(a.w);
  forward_tiles(a, a.K * sizeof(typename WFmt::T), [&](int64_t n, int64_t m0, int64_t rows, float* res) {
    with_tile(rows, [&]<int MR>() { float_row_dot<WFmt, MR>(w + n * a.K, a.K, xf.data() + m0 * a.K, a.K, res); });
  });
}

// The transposed product out (M, K) = x (M, N) @ W (N, K): threads own strips of whole blocks of K; each
// decodes its strip of every weight row once and adds it, times x[:, n], into an accumulator strip.
template <class DecodeStrip>
void transposed(const MatmulArgs& a, int64_t block, DecodeStrip&& decode) {
  std::vector<float> xt(a.N * a.M);  // x transposed: column n of x is contiguous
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    for (int64_t m = 0; m < a.M; ++m) {
      for (int64_t n = 0; n < a.N; ++n) xt[n * a.M + m] = In::to_f32(x[m * a.N + n]);
    }
  });
  const int64_t n_blocks = a.K / block;
  // Strips of at most ~128 KB of accumulators.
  const int64_t strip_blocks =
      std::max<int64_t>(1, std::min<int64_t>(n_blocks, (int64_t(32) << 10) / std::max<int64_t>(1, a.M * block)));
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(n_blocks, strip_blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t s0 = b0; s0 < b1; s0 += strip_blocks) {
        const int64_t s1 = std::min(b1, s0 + strip_blocks), width = (s1 - s0) * block;
        std::vector<float> acc(a.M * width, 0.0f), w(width);
        for (int64_t n = 0; n < a.N; ++n) {
          decode(n, s0, s1, w.data());
          const float* xn = xt.data() + n * a.M;
          for (int64_t m = 0; m < a.M; ++m) {
            const vf32 c = splat(xn[m]);
            float* dst = acc.data() + m * width;
            int64_t k = 0;
            for (; k + kLanes <= width; k += kLanes) F32::store(dst + k, F32::load(dst + k) + c * F32::load(w.data() + k));
            for (; k < width; ++k) dst[k] += xn[m] * w[k];
          }
        }
        for (int64_t m = 0; m < a.M; ++m) {
          for (int64_t k = 0; k < width; ++k) out[m * a.K + s0 * block + k] = Out::from_f32(acc[m * width + k]);
        }
      }
    });
  });
}

inline void store_values16(float* y, const vf32x16& v) { std::memcpy(y, &v, sizeof v); }

template <class Q>
void transposed_quantized(const MatmulArgs& a) {
  using B = typename Q::B;
  const int64_t row_bytes = a.K / Q::kQK * sizeof(B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  const vi8x16 table = codebook_table(Q::layout(0).codebook);
  transposed(a, Q::kQK, [&](int64_t n, int64_t b0, int64_t b1, float* dst) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const uint8_t* p = w + n * row_bytes + blk * sizeof(B);
      float* y = dst + (blk - b0) * Q::kQK;
      [&]<int... C>(std::integer_sequence<int, C...>) {
        (store_values16(y + 16 * C, values16(codes16(p, Q::layout(C), table), Q::scale(reinterpret_cast<const B*>(p), C))),
         ...);
      }(std::make_integer_sequence<int, Q::kQK / 16>{});
    }
  });
}

template <class WFmt>
void transposed_float(const MatmulArgs& a) {
  const auto* w = static_cast<const typename WFmt::T*>(a.w);
  transposed(a, 1, [&](int64_t n, int64_t k0, int64_t k1, float* dst) {
    const auto* src = w + n * a.K;
    for (int64_t k = k0; k < k1; ++k) dst[k - k0] = WFmt::to_f32(src[k]);
  });
}

void zero_output(const MatmulArgs& a, int64_t count) {
  std::memset(a.out, 0, count * float_type_bytes(a.out_type));
}

#define GGML_EXT_MATMUL_CASE(NAME, name, id, qk, bytes)                             \
  case GGML_EXT_TYPE_##NAME:                                                        \
    return a.transpose ? transposed_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a)   \
                       : forward_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a);

}  // namespace

void quantized_matmul(const MatmulArgs& a) {
  if (a.M == 0) return;
  // An empty sum: zeros (forward with K == 0, transposed with N == 0).
  if (!a.transpose && a.K == 0) return zero_output(a, a.M * a.N);
  if (a.transpose && a.N == 0) return zero_output(a, a.M * a.K);
  if (a.N == 0 || a.K == 0) return;
  switch (a.w_type) {
    case GGML_EXT_TYPE_F32: return a.transpose ? transposed_float<F32>(a) : forward_float<F32>(a);
    case GGML_EXT_TYPE_F16: return a.transpose ? transposed_float<F16>(a) : forward_float<F16>(a);
    case GGML_EXT_TYPE_BF16: return a.transpose ? transposed_float<BF16>(a) : forward_float<BF16>(a);
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_MATMUL_CASE)
    default: return;  // the primitive validated the type
  }
}
#undef GGML_EXT_MATMUL_CASE

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(quantized_matmul, MatmulArgs)

}  // namespace ggml_ext::cpu
