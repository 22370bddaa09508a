// Products with a weight stored as ggml blocks, on the blocks.
//
// Forward, quantized weight: each row of x is quantized to int8 per 32 elements (scale amax / 127, as ggml's
// Q8_0), and each weight row is decoded through the shared layouts of kernels/common/ggml_blocks.h into int8
// codes plus one float scale and offset per 16-element chunk. Integer dot products of 4 consecutive elements
// land in int32 lanes, which are then scaled by the activation's and the chunk's scales in float32:
//     sum_j w_j x_j = sum_lanes s_w * d_x * (sum code_j q_j) + o_w * (sum x_j)
// (o_w: the chunk's offset, for Q4_1, Q5_1, Q2_K, Q4_K, Q5_K; the activation sums are exact float sums).
// Two layouts of the activations:
// - groups of 64 elements (QuantizedRows), for one row of x (every row below AVX-512 VNNI; Q8_0 up to 4 rows):
//   half a group per 256-bit step, the dot one instruction per 4 elements (VNNI dpbusd, AVX2 maddubs/madd, NEON
//   sdot or widening multiplies), each lane scaled on its own;
// - spans (SpanRows), for more rows on AVX-512 VNNI: the weights gathered by byte permutes into the order the
//   activations are stored in, so that a whole span (128 or 256 elements) adds into one int32 vector per row
//   of x before the float scaling, which then comes 2 or 4 times less often (see SpanRowDot).
// Rows of x are taken in tiles of up to 8, so each weight span or group is decoded once per tile: decode
// (M <= 8) streams the weight once with every thread; prefill tiles M by 8 and keeps a slice of weight rows in L2.
//
// The IQ grid types and TQ1_0 take the same kernels through staged blocks: each weight row's blocks decoded
// once into int8 codes with integer chunk scales (matmul_grid_codes.h), read as a plain signed-byte layout; on
// AVX2 and AVX-512, the IQ grid types and TQ1_0 against one row of x skip the staging (matmul_iq1_one_row.h,
// matmul_iq_signed_one_row.h).
//
// Float weights (F32/F16/BF16) and the transposed product (x's gradient) use float32 arithmetic on the
// decoded values: the transposed product decodes each block once and adds it, scaled, into a strip of the
// output that stays in cache.
//
// Files: matmul_common.h (shared sizes, code forms), matmul_activations.h (x quantized in groups),
// matmul_block_scales.h (chunk scales of 256-element blocks), the row dots matmul_dot_portable.h (below AVX2, NEON),
// matmul_dot_avx2.h (AVX2; AVX-512 for one row of x) and matmul_dot_avx512_spans.h (AVX-512 VNNI, two rows of x
// or more), matmul_grid_codes.h (the grid types' staged blocks), matmul_transposed.h (the transposed product);
// here the drivers and the entry point.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_block_scales.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/matmul_dot_avx2.h"
#include "kernels/cpu/matmul_dot_avx512_spans.h"
#include "kernels/cpu/matmul_dot_portable.h"
#include "kernels/cpu/matmul_grid_codes.h"
#include "kernels/cpu/matmul_iq1_one_row.h"
#include "kernels/cpu/matmul_iq_signed_one_row.h"
#include "kernels/cpu/matmul_packed_rows.h"
#include "kernels/cpu/matmul_transposed.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

constexpr int64_t kL2WeightBytes = 192 << 10;  // weight rows kept in cache across the row tiles of x
// A K segment's activations, kept in L2: segments cut every weight row into pieces, which DRAM streams badly,
// so they are as long as the cache allows.
constexpr int64_t kActivationBytes = 256 << 10;
constexpr int64_t kSegmentAlign = 256;           // K segments hold whole blocks and groups of every type

// The row dots on activations in groups (QuantizedRows), with the weight decoders they take: on AVX-512 VNNI
// only where spans do not pay (one row of x; Q8_0 up to 4), where the 256-bit kernel was measured on Zen 4
// (which executes 512-bit operations in two halves) at 1.0-1.6x the speed of a 512-bit one.
template <class Q, bool kOffset>
struct RowCodes {
#if defined(__AVX2__)
  HalfCodes<Q, kOffset> half;
#else
  ChunkCodes<Q, kOffset> chunk;
#endif
};

#if defined(__AVX2__)
template <class Q, int MR, bool kOffset>
using RowDot = HalfRowDot<Q, MR, kOffset>;
#else
template <class Q, int MR, bool kOffset>
using RowDot = ChunkRowDot<Q, MR, kOffset>;
#endif

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
// Calls body<MR>() with MR the tile instance for `rows` (1, 2, 4 or 8; the activations are padded with zero
// rows up to a multiple of 8, so the extra rows read zeros and their results are dropped).
template <class Body>
inline void with_tile(int64_t rows, Body&& body) {
  switch (tile_rows_for(rows)) {
    case 1: return body.template operator()<1>();
    case 2: return body.template operator()<2>();
    case 4: return body.template operator()<4>();
    default: return body.template operator()<8>();
  }
}

int64_t padded_rows(int64_t M) { return (M + kTileRows - 1) / kTileRows * kTileRows; }

// Walks the (row tile, weight row) pairs of the forward product over the thread pool: weight rows split
// across threads, each thread's rows taken in cache-sized slices, every row tile of x against each slice, and
// K in segments whose activations stay in L2 (`act_bytes` per element and row) while the weights stream.
// `fold` rows of activations make one row of the output (2 for x with its residual: a pair never straddles a
// tile, whose height is even). dot_tile(n, slot, m0, rows, k0, k1, res): weight row n, the slice's row `slot`.
template <class DotTile>
void forward_tiles(const MatmulArgs& a, int64_t row_bytes, int64_t act_bytes, DotTile&& dot_tile, int fold = 1) {
  const int64_t M = a.M * fold;
  const int64_t slice = std::max<int64_t>(1, kL2WeightBytes / std::max<int64_t>(1, row_bytes));
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, a.K));
  const int64_t tile_rows = std::min<int64_t>(kTileRows, M);
  const int64_t segment = std::max<int64_t>(kSegmentAlign, kActivationBytes / (tile_rows * act_bytes) /
                                                               kSegmentAlign * kSegmentAlign);
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(a.N, grain, [&](int64_t n0, int64_t n1) {
      float res[kTileRows];
      std::vector<float> sums(std::min(slice, n1 - n0) * kTileRows);
      for (int64_t s0 = n0; s0 < n1; s0 += slice) {
        const int64_t s1 = std::min(n1, s0 + slice);
        for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
          const int64_t rows = std::min<int64_t>(kTileRows, M - m0);
          std::fill(sums.begin(), sums.end(), 0.0f);
          for (int64_t k0 = 0; k0 < a.K; k0 += segment) {
            for (int64_t n = s0; n < s1; ++n) {
              dot_tile(n, n - s0, m0, rows, k0, std::min(a.K, k0 + segment), res);
              for (int64_t r = 0; r < rows; ++r) sums[(n - s0) * kTileRows + r] += res[r];
            }
          }
          for (int64_t n = s0; n < s1; ++n) {
            const float* tile_sums = sums.data() + (n - s0) * kTileRows;
            for (int64_t r = 0; r < rows; r += fold) {
              const float sum = fold == 2 ? tile_sums[r] + tile_sums[r + 1] : tile_sums[r];
              out[(fold == 2 ? (m0 + r) >> 1 : m0 + r) * a.N + n] = Out::from_f32(sum);  // no division
            }
          }
        }
      }
    });
  });
}

// Every (row tile, weight row) of the forward product through the row dot Dot<Q, MR, kOffset>, on activations
// already quantized (act_bytes: their bytes per element and row; fold: activation rows per output row).
// The format the row dots read: a grid type's staged blocks (kernels/cpu/matmul_grid_codes.h), else Q's own.
template <class Q>
struct DotFormatOf {
  using type = Q;
};
template <class Q>
  requires requires { typename Q::Staged; }
struct DotFormatOf<Q> {
  using type = typename Q::Staged;
};

// A thread's staged weight rows: the rows of its current slice, each decoded once for all tiles of x.
inline std::vector<StagedBlock>& staged_rows() {
  thread_local std::vector<StagedBlock> rows;
  return rows;
}

template <template <class, int, bool> class Dot, class Q, bool kOffset, class Act, class Codes>
void forward_on_codes(const MatmulArgs& a, const Act& act, const Codes& codes, int64_t act_bytes, int fold) {
  using R = typename DotFormatOf<Q>::type;
  const int64_t blocks = a.K / Q::kQK, row_bytes = blocks * sizeof(typename Q::B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  auto dot = [&](const uint8_t* row, int64_t m0, int64_t rows, int64_t k0, int64_t k1, float* res) {
    with_tile(rows, [&]<int MR>() { Dot<R, MR, kOffset>(act, m0, codes).run(row, k0 / R::kQK, k1 / R::kQK, res); });
  };
  if constexpr (std::is_same_v<R, Q>) {
    forward_tiles(
        a, row_bytes, act_bytes,
        [&](int64_t n, int64_t, int64_t m0, int64_t rows, int64_t k0, int64_t k1, float* res) {
          dot(w + n * row_bytes, m0, rows, k0, k1, res);
        },
        fold);
  } else {
#if defined(GGML_EXT_IQ_ONE_ROW)
    // The IQ grid types against one row of x: straight from the blocks (matmul_iq1_one_row.h for IQ1_S and IQ1_M,
    // matmul_iq_signed_one_row.h for IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and TQ1_0).
    if constexpr (HasOneRowDot<typename Q::B> && std::is_same_v<Act, QuantizedRows>) {
      if (a.M == 1 && fold == 1) {
        const OneRowDotOf<typename Q::B> dot_one(act);
        return forward_tiles(a, row_bytes, act_bytes,
                             [&](int64_t n, int64_t, int64_t, int64_t, int64_t k0, int64_t k1, float* res) {
                               dot_one.run(reinterpret_cast<const typename Q::B*>(w + n * row_bytes), k0 / Q::kQK,
                                           k1 / Q::kQK, res);
                             });
      }
    }
#endif
    // Grid types: the first tile of x stages the row's segment into the slice's slot (slices are sized by the
    // staged bytes, so they stay in L2), every tile reads it there.
    forward_tiles(
        a, blocks * static_cast<int64_t>(sizeof(StagedBlock)), act_bytes,
        [&](int64_t n, int64_t slot, int64_t m0, int64_t rows, int64_t k0, int64_t k1, float* res) {
          std::vector<StagedBlock>& staged = staged_rows();
          if (staged.size() < static_cast<size_t>((slot + 1) * blocks)) staged.resize((slot + 1) * blocks);
          StagedBlock* row = staged.data() + slot * blocks;
          if (m0 == 0) {
            Q::stage(reinterpret_cast<const typename Q::B*>(w + n * row_bytes) + k0 / Q::kQK, (k1 - k0) / Q::kQK,
                     row + k0 / Q::kQK);
          }
          dot(reinterpret_cast<const uint8_t*>(row), m0, rows, k0, k1, res);
        },
        fold);
  }
}

// The forward product on quantized activations: x's rows quantized into `act` (quantize_row, rows over the
// threads), then every (row tile, weight row) through the row dot Dot<Q, MR, kOffset> (act_bytes: the
// activations' bytes per element and row).
template <class Act>
void quantize_x(const MatmulArgs& a, Act& act) {
  act.resize(a.M, a.K);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    parallel_for(a.M, std::max<int64_t>(1, 16384 / a.K), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize_row<In>(x + m * a.K, a.K, act, m);
    });
  });
}

// x with its residual (MatmulArgs::precise_x): two rows of activations per row of x, in groups.
void quantize_x_with_residual(const MatmulArgs& a, QuantizedRows& act) {
  act.resize(2 * a.M, a.K);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    parallel_for(a.M, std::max<int64_t>(1, 8192 / a.K), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize_row_with_residual<In>(x + m * a.K, a.K, act, m);
    });
  });
}

template <template <class, int, bool> class Dot, class Q, bool kOffset, class Act, class Codes>
void forward_on_rows(const MatmulArgs& a, Act&& act, const Codes& codes, int64_t act_bytes) {
  quantize_x(a, act);
  forward_on_codes<Dot, Q, kOffset>(a, act, codes, act_bytes, 1);
}

template <class Q, bool kOffset>
void forward_with_residual(const MatmulArgs& a) {
  using R = typename DotFormatOf<Q>::type;
  QuantizedRows act;
  quantize_x_with_residual(a, act);
  forward_on_codes<RowDot, Q, kOffset>(a, act, RowCodes<R, kOffset>{}, sizeof(ActRecord) / kGroup, 2);
}

// Rows packed 8 at a time (kernels/cpu/packed_rows.h): forward on their own kernels (matmul_packed_rows.h); the
// transposed product on each row's blocks unpacked back to the plain format and decoded as float32.
template <class P, class Plain>
void matmul_packed(const MatmulArgs& a) {
  const int64_t blocks = a.K / P::kQK;
  if (a.transpose) {
    const auto* w = static_cast<const typename P::Packed*>(a.w);
    return transposed(a, P::kQK, [&](int64_t n, int64_t b0, int64_t b1, float* dst) {
      for (int64_t b = b0; b < b1; ++b) {
        typename P::Plain block;
        P::unpack(w + n / kPackedRows * blocks + b, static_cast<int>(n % kPackedRows), &block);
        for (int c = 0; c < P::kQK / 16; ++c) {
          ggml_ext_dequant16_layout(&block, Plain::layout(c), Plain::scale(&block, c), dst + (b - b0) * P::kQK + 16 * c);
        }
      }
    });
  }
  QuantizedRows act;
  if (a.precise_x) {
    quantize_x_with_residual(a, act);
    return forward_packed<P>(a, act, 2);
  }
  quantize_x(a, act);
  forward_packed<P>(a, act, 1);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
template <class Q, bool kOffset>
void forward_spans(const MatmulArgs& a) {
  constexpr int S = kSpan<Q>;
  forward_on_rows<SpanRowDot, Q, kOffset>(a, SpanRows<S>{}, SpanCodes<Q, kOffset>{},
                                          (sizeof(SpanRecord<S>) + S - 1) / S);
}
#endif

template <class Q, bool kOffset>
void forward_quantized(const MatmulArgs& a) {
  using R = typename DotFormatOf<Q>::type;
  if (a.precise_x) return forward_with_residual<Q, kOffset>(a);
#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
  // Spans pay once the per-row float work outweighs their decode: from 2 rows of x; for Q8_0, whose split gathers
  // cost more, from 5. Q8_0 in 256-element spans against the 128-element ones they replaced (this 2-core VM,
  // alternating runs, bench_matmul.py, 14336x4096 and 4096x14336): 8 rows 0.77-0.95x the time in 7 of 8 pairs
  // (1.02x in one); 2 rows 0.94-1.39x, 4 rows 1.05-1.21x, so the group kernels keep up to 4.
  // The grid types keep the group kernels: their staged blocks were not run through spans on AVX-512 hardware.
  if constexpr (std::is_same_v<R, Q>) {
    if (a.M > (kSplitSpan<Q> ? 4 : 1)) return forward_spans<Q, kOffset>(a);
  }
#endif
  forward_on_rows<RowDot, Q, kOffset>(a, QuantizedRows{}, RowCodes<R, kOffset>{}, sizeof(ActRecord) / kGroup);
}

template <class Q>
void forward_quantized(const MatmulArgs& a) {
  if (has_offset<typename DotFormatOf<Q>::type>()) {
    forward_quantized<Q, true>(a);
  } else {
    forward_quantized<Q, false>(a);
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
  forward_tiles(a, a.K * sizeof(typename WFmt::T), sizeof(float), [&](int64_t n, int64_t, int64_t m0, int64_t rows,
                                                                         int64_t k0, int64_t k1, float* res) {
    with_tile(rows, [&]<int MR>() {
      float_row_dot<WFmt, MR>(w + n * a.K + k0, k1 - k0, xf.data() + m0 * a.K + k0, a.K, res);
    });
  });
}

template <class D>
void transposed_decoded(const MatmulArgs& a) {
  using B = typename D::B;
  const int64_t row_bytes = a.K / D::kQK * sizeof(B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  transposed(a, D::kQK, [&](int64_t n, int64_t b0, int64_t b1, float* dst) {
    const auto* blocks = reinterpret_cast<const B*>(w + n * row_bytes);
    for (int64_t blk = b0; blk < b1; ++blk) {
      for (int c = 0; c < D::kQK / 16; ++c) D::chunk(blocks + blk, c, dst + (blk - b0) * D::kQK + 16 * c);
    }
  });
}

// The decoded types: forward on the integer dots through their staged blocks; the transposed product on
// float32 values from the reference decoder.
template <class D>
void matmul_decoded(const MatmulArgs& a) {
  return a.transpose ? transposed_decoded<D>(a) : forward_quantized<GridFormat<typename D::B>>(a);
}
// TQ2_0's codes do have a chunk layout (ggml_ext_layout16_tq2_0): the integer kernels take it.
template <>
void matmul_decoded<GGML_EXT_DECODED_FORMAT(tq2_0)>(const MatmulArgs& a) {
  using Q = GGML_EXT_BLOCK_FORMAT(tq2_0, GGML_EXT_QK_K);
  return a.transpose ? transposed_quantized<Q>(a) : forward_quantized<Q>(a);
}

void zero_output(const MatmulArgs& a, int64_t count) {
  std::memset(a.out, 0, count * float_type_bytes(a.out_type));
}

#define GGML_EXT_MATMUL_CASE(NAME, name, id, qk, bytes)                             \
  case GGML_EXT_TYPE_##NAME:                                                        \
    return a.transpose ? transposed_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a)   \
                       : forward_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a);
#define GGML_EXT_MATMUL_DECODED_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return matmul_decoded<GGML_EXT_DECODED_FORMAT(name)>(a);

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
    case kTypeQ4KR8: return matmul_packed<PackedQ4K, GGML_EXT_BLOCK_FORMAT(q4_k, GGML_EXT_QK_K)>(a);
    case kTypeQ6KR8: return matmul_packed<PackedQ6K, GGML_EXT_BLOCK_FORMAT(q6_k, GGML_EXT_QK_K)>(a);
    case kTypeQ40R8: return matmul_packed<PackedQ40, GGML_EXT_BLOCK_FORMAT(q4_0, GGML_EXT_QK32)>(a);
    case kTypeIQ4NLR8: return matmul_packed<PackedIQ4NL, GGML_EXT_BLOCK_FORMAT(iq4_nl, GGML_EXT_QK32)>(a);
    case kTypeQ50R8: return matmul_packed<PackedQ50, GGML_EXT_BLOCK_FORMAT(q5_0, GGML_EXT_QK32)>(a);
    case kTypeQ80R8: return matmul_packed<PackedQ80, GGML_EXT_BLOCK_FORMAT(q8_0, GGML_EXT_QK32)>(a);
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_MATMUL_CASE)
    GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_MATMUL_DECODED_CASE)
    default: return;  // the primitive validated the type
  }
}
#undef GGML_EXT_MATMUL_CASE
#undef GGML_EXT_MATMUL_DECODED_CASE

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(quantized_matmul, MatmulArgs)

}  // namespace ggml_ext::cpu
