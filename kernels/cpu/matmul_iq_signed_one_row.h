// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and TQ1_0 against one row of x on AVX2 and AVX-512 (decode), without
// staged blocks, as matmul_iq1_one_row.h does for IQ1: at one row of x nothing reuses a staged block, and writing
// its 256 codes and reading them back for the dot costs more than the dot.
//
// These five formats share one shape: per 32-element sub-block, grid entries of unsigned values (IQ2: {8, 25, 43},
// IQ3_XXS: {4, ..., 62}, IQ3_S: {1, ..., 15}; GridBytes' tables), a sign per element and integer scales (2s + 1)
// per 16 elements, times one float per block. The grid bytes stay unsigned, so one maddubs takes their products
// with x's codes once the signs are moved onto x's codes (sign_epi8 with +-1 per lane; x's codes are within
// +-127, so negating one never overflows). The largest pair sum, 2 * 62 * 127, fits maddubs' int16 lanes; madd
// then multiplies the pairs by the chunk scales (at most 31) as in the K-quants' integer path, and x's scale per
// 32 and the block's float scale come in float.
// Kernel only (cpu_kernel_driver, 4096 x 14336, one row of x, Zen 3, 2 threads), staged / direct medians: IQ2_XXS
// 1.26, IQ2_XS 1.31, IQ2_S 1.52, IQ3_XXS 1.22, IQ3_S 1.76 (bench/results/cpu-zen3-avx2-2026-11-28e-iq2-one-row.json).
// Tried and slower or no better: IQ3's eight entries by vpgatherdd (0.85 and 1.19 of the staged speed, against 1.14
// and 1.49 for the loads in the same runs); the ksigns bytes computed (pdep and a parity fold) instead of loaded
// from sign_masks (within noise).
// The AVX2 and AVX-512 variants (256-bit code in both): on Zen 4 the AVX-512 variant's staged kernels took 1.23-1.69x
// this code's time at one row of 4096 x 14336 (IQ3_XXS 1.23 .. IQ3_S 1.69). Portable / NEON keep the staged kernels.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_dot_avx2.h"
#include "kernels/cpu/matmul_grid_codes.h"
#include "kernels/cpu/matmul_iq1_one_row.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX2__) && defined(__BMI2__)

// What a sub-block gives the dot: 32 unsigned grid bytes, +-1 per element, the int16 multipliers of its 16 code
// pairs (chunk 2 ib's in the low 128 bits, 2 ib + 1's in the high).
struct SignedSub {
  __m256i grid, sign, scale;
};

// +-1 from ksigns fields (GridBytes::sign_masks: 0xFF where negative): the mask with its low bit set.
inline __attribute__((always_inline)) __m256i plus_minus(vi8x32 negative) {
  return _mm256_or_si256((__m256i)negative, _mm256_set1_epi8(1));
}
// +-1 from 32 explicit sign bits (bit j of byte g: element 8 g + j).
inline __attribute__((always_inline)) __m256i plus_minus_bits(uint32_t bits) { return plus_minus(lane_bits(bits)); }

// Chunk scales 2s + 1 from 8 bytes of nibbles (chunk c: nibble c % 2 of byte c / 2), as IntChunkScalesBase
// multipliers.
inline __attribute__((always_inline)) void nibble_chunk_scales(const uint8_t* scales, IntChunkScalesBase& is,
                                                               float d) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales));
  const __m128i nib = _mm_set1_epi8(15);
  const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
  is.set((vi8x16)_mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1)), d);
}

// The 32-bit word IQ2_XXS and IQ3_XXS end each sub-block with: four 7-bit ksigns fields (8 elements each) and the
// sub-block's 4-bit scale on top, as the +-1 signs and the scale 2s + 1 of a SignedSub.
inline __attribute__((always_inline)) SignedSub signs_and_scale(__m256i grid, uint32_t aux, const GridBytes& t) {
  return {grid,
          plus_minus(entries8(t.sign_masks[aux & 127], t.sign_masks[(aux >> 7) & 127],
                              t.sign_masks[(aux >> 14) & 127], t.sign_masks[(aux >> 21) & 127])),
          _mm256_set1_epi16(static_cast<short>(2 * (aux >> 28) + 1))};
}

// IQ2_XXS: per sub-block one 64-bit word, 4 grid indices (bytes) then 4 seven-bit sign fields and the scale on top.
// The word is loaded once and split by shifts (the scalar units are otherwise idle; four byte loads would add to
// the tables' and x's loads).
struct Iq2xxsBlock {
  const block_iq2_xxs* b;
  float d;
  inline __attribute__((always_inline)) void load(const block_iq2_xxs* block) {
    b = block;
    d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes& t) const {
    uint64_t w;
    std::memcpy(&w, b->qs + 4 * ib, sizeof w);
    const uint32_t aux = static_cast<uint32_t>(w >> 32);
    return signs_and_scale((__m256i)entries8(t.iq2xxs[w & 255], t.iq2xxs[(w >> 8) & 255],
                                             t.iq2xxs[(w >> 16) & 255], t.iq2xxs[(w >> 24) & 255]),
                           aux, t);
  }
};

// IQ2_XS: per 8 elements a 16-bit word, 9-bit grid index and 7 sign bits; a nibble scale per 16 elements.
struct Iq2xsBlock {
  const block_iq2_xs* b;
  float d;
  IntChunkScalesBase is;
  inline __attribute__((always_inline)) void load(const block_iq2_xs* block) {
    b = block;
    d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
    nibble_chunk_scales(b->scales, is, d);
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes& t) const {
    uint64_t w;
    std::memcpy(&w, b->qs + 4 * ib, sizeof w);
    const uint32_t q0 = w & 0xFFFF, q1 = (w >> 16) & 0xFFFF, q2 = (w >> 32) & 0xFFFF, q3 = w >> 48;
    return {(__m256i)entries8(t.iq2xs[q0 & 511], t.iq2xs[q1 & 511], t.iq2xs[q2 & 511], t.iq2xs[q3 & 511]),
            plus_minus(entries8(t.sign_masks[q0 >> 9], t.sign_masks[q1 >> 9], t.sign_masks[q2 >> 9],
                                t.sign_masks[q3 >> 9])),
            is.template half<ib>()};
  }
};

// IQ2_S: per 8 elements a low index byte, 2 high bits in qh[ib], 8 explicit sign bits; nibble scales.
// The block's 32 10-bit indices are made in two vectors and stored, and a sub-block's four come back in one
// 64-bit load split by shifts (matmul_iq1_one_row.h does the same for IQ1's 11-bit indices): built one by one,
// each took a shift, a mask and an or in scalar registers (staged / direct 1.44 that way, 1.62 this way, same runs).
struct Iq2sBlock {
  const block_iq2_s* b;
  float d;
  IntChunkScalesBase is;
  alignas(32) uint16_t idx[32];
  inline __attribute__((always_inline)) void load(const block_iq2_s* block) {
    b = block;
    d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
    nibble_chunk_scales(b->scales, is, d);
    // index k (sub-block k / 4): qs[k], and bits 2 (k % 4) .. + 1 of qh[k / 4] at bit 8: (qh << (8 - 2 (k % 4))) & 0x300
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qh)));
    const __m256i mul = _mm256_set1_epi64x(0x0004001000400100);
    const __m256i mask = _mm256_set1_epi16(0x300);
    const char z = static_cast<char>(0x80);
    for (int h = 0; h < 2; ++h) {
      const char q0 = static_cast<char>(4 * h), q1 = q0 + 1, q2 = q0 + 2, q3 = q0 + 3;
      const __m256i rep = _mm256_setr_epi8(q0, z, q0, z, q0, z, q0, z, q1, z, q1, z, q1, z, q1, z, q2, z, q2, z, q2, z,
                                           q2, z, q3, z, q3, z, q3, z, q3, z);
      const __m256i low = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * h)));
      const __m256i high = _mm256_and_si256(_mm256_mullo_epi16(_mm256_shuffle_epi8(qh, rep), mul), mask);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(low, high));
    }
    from_memory(idx);
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes& t) const {
    uint64_t four;
    std::memcpy(&four, idx + 4 * ib, sizeof four);
    return {(__m256i)entries8(t.iq2s[four & 0xFFFF], t.iq2s[(four >> 16) & 0xFFFF], t.iq2s[(four >> 32) & 0xFFFF],
                              t.iq2s[four >> 48]),
            plus_minus_bits(load_u32(b->signs + 4 * ib)), is.template half<ib>()};
  }
};

// Eight 4-value entries (IQ3) as 32 bytes.
inline __attribute__((always_inline)) __m256i entries4(const uint32_t* table, uint32_t e0, uint32_t e1, uint32_t e2,
                                                       uint32_t e3, uint32_t e4, uint32_t e5, uint32_t e6,
                                                       uint32_t e7) {
  return _mm256_setr_epi32(table[e0], table[e1], table[e2], table[e3], table[e4], table[e5], table[e6], table[e7]);
}

// IQ3_XXS: per 4 elements an index byte; per sub-block a 32-bit word as IQ2_XXS's high half.
struct Iq3xxsBlock {
  const block_iq3_xxs* b;
  float d;
  inline __attribute__((always_inline)) void load(const block_iq3_xxs* block) {
    b = block;
    d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.25f;
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes& t) const {
    uint64_t w;
    std::memcpy(&w, b->qs + 8 * ib, sizeof w);
    const uint32_t lo = static_cast<uint32_t>(w), hi = static_cast<uint32_t>(w >> 32);
    const uint32_t aux = b->scales_signs[2 * ib] | (static_cast<uint32_t>(b->scales_signs[2 * ib + 1]) << 16);
    return signs_and_scale(entries4(t.iq3xxs, lo & 255, (lo >> 8) & 255, (lo >> 16) & 255, lo >> 24, hi & 255,
                                    (hi >> 8) & 255, (hi >> 16) & 255, hi >> 24),
                           aux, t);
  }
};

// IQ3_S: per 4 elements an index byte, its 9th bit in qh[ib]; one sign bit per element; a nibble scale per 32.
// The 64 9-bit indices are made in vectors and stored, as IQ2_S's (8 per sub-block, each a shift, a mask and an
// or in scalar registers, were most of the sub-block's work: staged / direct 1.51 that way, 2.33 this way, same
// runs).
struct Iq3sBlock {
  const block_iq3_s* b;
  float d;
  uint32_t scales;
  alignas(32) uint16_t idx[64];
  inline __attribute__((always_inline)) void load(const block_iq3_s* block) {
    b = block;
    d = GGML_EXT_HALF_TO_FLOAT(b->d);
    scales = load_u32(b->scales);
    // index k: qs[k], and bit k % 8 of qh[k / 8] at bit 8: (qh << (8 - k % 8)) & 0x100
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qh)));
    const __m256i mul = _mm256_setr_epi16(256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2);
    const __m256i mask = _mm256_set1_epi16(0x100);
    const char z = static_cast<char>(0x80);
    for (int h = 0; h < 4; ++h) {
      const char q0 = static_cast<char>(2 * h), q1 = q0 + 1;
      const __m256i rep = _mm256_setr_epi8(q0, z, q0, z, q0, z, q0, z, q0, z, q0, z, q0, z, q0, z, q1, z, q1, z, q1, z,
                                           q1, z, q1, z, q1, z, q1, z, q1, z);
      const __m256i low = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * h)));
      const __m256i high = _mm256_and_si256(_mm256_mullo_epi16(_mm256_shuffle_epi8(qh, rep), mul), mask);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(low, high));
    }
    from_memory(idx);
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes& t) const {
    uint64_t lo, hi;
    std::memcpy(&lo, idx + 8 * ib, sizeof lo);
    std::memcpy(&hi, idx + 8 * ib + 4, sizeof hi);
    return {entries4(t.iq3s, lo & 0xFFFF, (lo >> 16) & 0xFFFF, (lo >> 32) & 0xFFFF, lo >> 48, hi & 0xFFFF,
                     (hi >> 16) & 0xFFFF, (hi >> 32) & 0xFFFF, hi >> 48),
            plus_minus_bits(load_u32(b->signs + 4 * ib)),
            _mm256_set1_epi16(static_cast<short>(2 * ((scales >> (4 * ib)) & 15) + 1))};
  }
};

// TQ1_0 (not a grid type, the same shape with grid bytes of 1): its digits minus 1 (-1, 0, 1; ternary32 of
// matmul_grid_codes.h, as its staging makes them) take the place of the signs, so sign_epi8 gives x's codes times
// the weights and maddubs against 1s adds their pairs; chunk scales 1. The digits come from Tq1Codes, as the
// staging's do: the block's code vectors loaded once, each sub-block's digits made from them.
struct Tq1Block {
  float d;
  Tq1Codes codes;
  inline __attribute__((always_inline)) void load(const block_tq1_0* b) {
    d = GGML_EXT_HALF_TO_FLOAT(b->d);
    codes.load(b);
  }
  template <int ib>
  inline __attribute__((always_inline)) SignedSub sub(const GridBytes&) const {
    return {_mm256_set1_epi8(1), (__m256i)codes.template digits<ib>(), _mm256_set1_epi16(1)};
  }
};

template <class B>
struct SignedBlockOf;
template <>
struct SignedBlockOf<block_iq2_xxs> {
  using type = Iq2xxsBlock;
};
template <>
struct SignedBlockOf<block_iq2_xs> {
  using type = Iq2xsBlock;
};
template <>
struct SignedBlockOf<block_iq2_s> {
  using type = Iq2sBlock;
};
template <>
struct SignedBlockOf<block_iq3_xxs> {
  using type = Iq3xxsBlock;
};
template <>
struct SignedBlockOf<block_iq3_s> {
  using type = Iq3sBlock;
};
template <>
struct SignedBlockOf<block_tq1_0> {
  using type = Tq1Block;
};

// The formats that take this path: all measured faster than their staged blocks at one row of x (TQ1_0 on Zen 4,
// 4096 x 14336, alternated in one process: 1.17x on the AVX-512 variant, 1.11x on AVX2; IQ2_XXS 1.55 / 1.46).
template <class B>
concept HasSignedOneRow = std::is_same_v<B, block_iq2_xxs> || std::is_same_v<B, block_iq2_xs> ||
                          std::is_same_v<B, block_iq2_s> || std::is_same_v<B, block_iq3_xxs> ||
                          std::is_same_v<B, block_iq3_s> || std::is_same_v<B, block_tq1_0>;

// Blocks [begin, end) of one weight row against one row of x.
template <class B>
struct SignedOneRowDot {
  TileView tile;

  explicit SignedOneRowDot(const QuantizedRows& act) : tile(act, 0) {}

  void run(const B* row, int64_t begin, int64_t end, float* res) const {
    const GridBytes& t = grid_bytes();
    typename SignedBlockOf<B>::type blk_codes;
    vf32x8 acc = {};
    for (int64_t blk = begin; blk < end; ++blk) {
      prefetch_ahead<1>(reinterpret_cast<const uint8_t*>(row + blk));
      blk_codes.load(row + blk);
      const ActRecord* rec = tile.records(4 * blk);  // one row: stride 1
      vf32x8 block_acc[2] = {};  // even and odd sub-blocks in two chains of FMAs
      [&]<int... ib>(std::integer_sequence<int, ib...>) __attribute__((always_inline)) {
        ((block_acc[ib % 2] += [&]() __attribute__((always_inline)) {
           const SignedSub s = blk_codes.template sub<ib>(t);
           const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec[ib / 2].q + 32 * (ib % 2)));
           const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(s.grid, _mm256_sign_epi8(q, s.sign)), s.scale);
           return __builtin_convertvector((vi32x8)dot, vf32x8) * rec[ib / 2].d[ib % 2];
         }()),
         ...);
      }(std::make_integer_sequence<int, 8>{});
      acc += (block_acc[0] + block_acc[1]) * blk_codes.d;
    }
    *res = pairwise_sum(acc);
  }
};

// Every grid type with a one-row dot (this file's and matmul_iq1_one_row.h's), as matmul.cpp takes them.
#if defined(GGML_EXT_IQ1_ONE_ROW)
#define GGML_EXT_IQ_ONE_ROW 1
template <class B>
concept HasOneRowDot = HasIq1OneRow<B> || HasSignedOneRow<B>;
template <class B>
using OneRowDotOf = std::conditional_t<HasIq1OneRow<B>, Iq1OneRowDot<B>, SignedOneRowDot<B>>;
#endif
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
