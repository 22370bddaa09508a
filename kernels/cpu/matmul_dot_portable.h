// The group row dot of the base variant (SSE2, NEON; ChunkRowDot): 16-element chunks on 16-byte vectors. Compiled
// below AVX-512 VNNI, but AVX2 takes matmul_dot_avx2.h's (RowDot in matmul.cpp).
#pragma once
#include <cstring>
#include <utility>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_block_scales.h"
#include "kernels/cpu/matmul_common.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if !(defined(__AVX512VNNI__) && defined(__AVX512VBMI__))
// Below AVX-512 (AVX2, SSE2, NEON) the same product in 16-element chunks on 16-byte vectors, which GCC keeps
// in registers on every ISA (its lowering of 64-byte vectors without AVX-512 goes through memory).
typedef int32_t vi32x4 __attribute__((vector_size(16)));
typedef float vf32x4 __attribute__((vector_size(16)));

// Signed dot of 16 codes with 16 activation codes, 4 per int32 lane.
inline __attribute__((always_inline)) vi32x4 dot_chunk(vi8x16 w, const int8_t* q) {
#if defined(__AVX2__)
  const __m128i wv = (__m128i)w, qv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  // |w| * (q with w's sign): products of at most 128 * 127, pairs within int16
  return (vi32x4)_mm_madd_epi16(_mm_maddubs_epi16(_mm_sign_epi8(wv, wv), _mm_sign_epi8(qv, wv)), _mm_set1_epi16(1));
#elif defined(__aarch64__) && defined(__ARM_NEON)
  const int8x16_t wv = (int8x16_t)w, qv = vld1q_s8(q);
#if defined(__ARM_FEATURE_DOTPROD)
  return (vi32x4)vdotq_s32(vdupq_n_s32(0), wv, qv);
#else
  return (vi32x4)vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(wv), vget_low_s8(qv))),
                            vpaddlq_s16(vmull_high_s8(wv, qv)));
#endif
#else
  vi32x4 out;
  for (int l = 0; l < 4; ++l) {
    int sum = 0;
    for (int j = 0; j < 4; ++j) sum += static_cast<int>(w[4 * l + j]) * static_cast<int>(q[4 * l + j]);
    out[l] = sum;
  }
  return out;
#endif
}

template <class Q, int MR, bool kOffset>
struct ChunkRowDot {
  using B = typename Q::B;
  vf32x4 acc[MR] = {};
  float offsets[MR] = {};  // what the chunks' offsets add: offset * sum(x)
  TileView tile;
  ChunkSums chunk_sums;
  const ChunkCodes<Q, kOffset>& codes;

  template <class RowCodes>
  ChunkRowDot(const QuantizedRows& act, int64_t row0, const RowCodes& row_codes)
      : tile(act, row0), chunk_sums(act, row0), codes(row_codes.chunk) {}

  // Chunk c (0..3) of group g: its 16 centered codes, scale and offset.
  inline __attribute__((always_inline)) void chunk(vi8x16 w, float scale, float offset, int64_t g, int c) {
    const vf32x4 sw = vf32x4{} + scale;
    const float ow = offset + scale * static_cast<float>(code_center<Q, kOffset>());
    const ActRecord* rec = tile.records(g);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf32x4 f = __builtin_convertvector(dot_chunk(w, rec[r].q + 16 * c), vf32x4) * rec[r].d[c / 2];
      acc[r] += f * sw;
      if constexpr (kOffset) offsets[r] += ow * *chunk_sums.x_of(r, 4 * g + c);
    }
  }

  template <int G, int C>
  inline __attribute__((always_inline)) vi8x16 centered(const uint8_t* base) const {
    return codes.template chunk<G, C>(base) + ChunkCodes<Q, kOffset>::kShift;
  }

  // Blocks [begin, end) of the row.
  void run(const uint8_t* row, int64_t begin, int64_t end, float* res) {
    if constexpr (Q::kQK == 32) {
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        const auto s = Q::scale(reinterpret_cast<const B*>(p), 0);
        const int64_t g = blk / 2;
        const int c0 = 2 * static_cast<int>(blk & 1);
        chunk(centered<0, 0>(p), s.scale, signed_offset(s), g, c0);
        chunk(centered<0, 1>(p), s.scale, signed_offset(s), g, c0 + 1);
      }
    } else {
      typename ScalesOf<Q>::type sc;
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        sc.load_block(reinterpret_cast<const B*>(p));
        float scale[16], offset[16];
        std::memcpy(scale, &sc.scale, sizeof scale);
        std::memcpy(offset, &sc.offset, sizeof offset);
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          (chunk(centered<C / 4, C % 4>(p), scale[C], offset[C], blk * 4 + C / 4, C % 4), ...);
        }(std::make_integer_sequence<int, 16>{});
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) + offsets[r];
  }
};
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
