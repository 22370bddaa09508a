// IQ1_S and IQ1_M against one row of x on AVX2 and AVX-512 (decode), without staged blocks: each block's grid
// entries are looked up and multiplied with x's codes in registers. Staging (matmul_grid_codes.h) writes a block's
// 256 codes and reads them back for the dot; at one row of x nothing reuses them, and the round trip through memory plus
// the scalar index arithmetic (a dozen operations per 32 codes) cost more than twice the dot itself (IQ1_M on Zen 3:
// staging 23 ns per block, the staged dot 9-10). A gather of the four entries (vpgatherdq) was slower than four loads
// (kernel driver, IQ1_S 4096x14336 m=1: 4.36 against 3.68 ms).
//
// Per block: its 32 grid indices (8 low bits from qs, 3 high bits from qh) are made in two vectors and stored,
// so a sub-block's four indices come with one 64-bit load (split by shifts) instead of a dozen shifts and masks. The table holds
// 8 * grid + 8 (0, 8 or 16: GridBytes::iq1s), unsigned, so one maddubs takes the product with x's codes. With
// the delta (+-1 on the 8 * grid scale) the weight code is w = 8 grid + delta, and
//   IQ1_S (delta per 32):   sum w q = sum (8 grid + 8) q + (delta - 8) sum q
//   IQ1_M (delta per 8):    sum w q = sum (8 grid + 8 + (delta + 1)) q - 9 sum q
// where the first sum is the integer dot and sum q is the chunk's code sum (QuantizedRows::chunk_q, already
// times x's scale): one float vector per block of 16 chunk coefficients. The chunk scales (2s + 1) multiply the
// code pairs in madd as in the K-quants' integer path (IntChunkScalesBase); x's scale per 32 in float.
// The AVX2 and AVX-512 variants (256-bit code in both): on Zen 4 the AVX-512 variant's staged kernels took 1.64x
// (IQ1_S) and 1.24x (IQ1_M) this code's time at one row of 4096 x 14336. Portable / NEON keep the staged kernels.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_dot_avx2.h"
#include "kernels/cpu/matmul_grid_codes.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX2__) && defined(__BMI2__)
#define GGML_EXT_IQ1_ONE_ROW 1

// The 16 chunk coefficients (int16, chunk c in lane c) as floats times the block's 16 chunk code sums.
inline __attribute__((always_inline)) vf32x8 chunk_coefficient_sums(__m256i coef, const float* chunk_q) {
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(coef)));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(coef, 1)));
  return (vf32x8)_mm256_fmadd_ps(lo, _mm256_loadu_ps(chunk_q), _mm256_mul_ps(hi, _mm256_loadu_ps(chunk_q + 8)));
}

// The stored indices are read back from memory: kept in vectors, GCC takes each out with vpextrw (2 operations
// on Zen 3) where a load is one.
template <size_t N>
inline __attribute__((always_inline)) void from_memory(uint16_t (&idx)[N]) {
  asm("" : "+m"(idx));
}

// 8 * grid + 8 for the four groups of sub-block ib, from the stored indices.
// The four indices come in one 64-bit load and are split by shifts: the scalar units are otherwise idle, where
// four loads would add to the table's and x's loads.
inline __attribute__((always_inline)) __m256i grid32(const uint16_t* idx, int ib, const GridBytes& t) {
  uint64_t four;
  std::memcpy(&four, idx + 4 * ib, sizeof four);
  return (__m256i)entries8(t.iq1s[four & 0xFFFF], t.iq1s[(four >> 16) & 0xFFFF], t.iq1s[(four >> 32) & 0xFFFF],
                           t.iq1s[four >> 48]);
}

// What a format's block gives the one-row dot: its float scale (d / 8), its integer chunk scales, the chunk
// coefficients of the code sums, and per sub-block the unsigned codes (8 * grid + 8, plus IQ1_M's delta term).
struct Iq1sBlock {
  float d;
  alignas(32) uint16_t idx[32];

  inline __attribute__((always_inline)) void load(const block_iq1_s* b, IntChunkScalesBase& is, __m256i& coef) {
    d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qh));
    // index g of sub-block ib: qs byte, and bits 3 (g % 4) .. + 2 of qh[ib] at bit 8: (qh << (8 - 3 (g % 4))) & 0x700,
    // as (qh * 2^(9 - 3 (g % 4))) >> 1 (the multiplier of g % 4 = 3 is 1)
    const __m256i qh2 = _mm256_broadcastsi128_si256(qh);
    const __m256i mul = _mm256_set1_epi64x(0x0001000800400200);
    const __m256i mask = _mm256_set1_epi16(0x700);
    const __m256i rep_lo = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7,
                                            6, 7, 6, 7, 6, 7);
    const __m256i rep_hi = _mm256_add_epi8(rep_lo, _mm256_set1_epi8(8));
    for (int h = 0; h < 2; ++h) {
      const __m256i low = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * h)));
      const __m256i high = _mm256_shuffle_epi8(qh2, h ? rep_hi : rep_lo);
      const __m256i index =
          _mm256_or_si256(low, _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(high, mul), 1), mask));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), index);
    }
    from_memory(idx);
    // per sub-block: 2s + 1 (bits 12..14) for both chunks; delta - 8 = -7, or -9 with bit 15
    const __m128i odd = _mm_add_epi16(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
    is.set((vi8x16)_mm_or_si128(odd, _mm_slli_epi16(odd, 8)), d);
    const __m128i delta8 = _mm_add_epi16(_mm_set1_epi16(-7), _mm_add_epi16(_mm_srai_epi16(qh, 15), _mm_srai_epi16(qh, 15)));
    const __m128i per_sub = _mm_mullo_epi16(odd, delta8);
    coef = _mm256_set_m128i(_mm_unpackhi_epi16(per_sub, per_sub), _mm_unpacklo_epi16(per_sub, per_sub));
  }
  template <int ib>
  inline __attribute__((always_inline)) __m256i codes(const GridBytes& t) const {
    return grid32(idx, ib, t);
  }
};

struct Iq1mBlock {
  float d;
  alignas(32) uint16_t idx[32];
  __m256i plus[2];  // 2 in the lanes of groups with a positive delta (groups 0..15, 16..31), in both 128-bit halves

  inline __attribute__((always_inline)) void load(const block_iq1_m* b, IntChunkScalesBase& is, __m256i& coef) {
    uint64_t sc;
    std::memcpy(&sc, b->scales, sizeof sc);
    // 4 little-endian words: 3-bit scales of chunks 4k .. 4k + 3 in bits 0..11 of word k, d's nibbles on top
    d = GGML_EXT_HALF_TO_FLOAT(static_cast<uint16_t>(_pext_u64(sc, 0xF000F000F000F000ull))) * 0.125f;
    const uint64_t fields = _pext_u64(sc, 0x0FFF0FFF0FFF0FFFull);  // 16 3-bit scales
    const uint64_t ones = 0x0101010101010101ull;
    const uint64_t s0 = 2 * _pdep_u64(fields, 0x0707070707070707ull) + ones;  // 2s + 1, no carries (s <= 7)
    const uint64_t s1 = 2 * _pdep_u64(fields >> 24, 0x0707070707070707ull) + ones;
    const __m128i odd = _mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0));
    is.set((vi8x16)odd, d);
    coef = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(odd), _mm256_set1_epi16(-9));
    // index g: qs byte, and the low (g even) or high (g odd) nibble's 3 bits of qh[g / 2] at bit 8
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qh));
    const __m256i qh2 = _mm256_broadcastsi128_si256(qh);
    const __m256i mul = _mm256_set1_epi32(0x00100100);  // 256 (g even), 16 (g odd)
    const __m256i mask = _mm256_set1_epi16(0x700);
    const char z = static_cast<char>(0x80);
    const __m256i rep_lo = _mm256_setr_epi8(0, z, 0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3, z, 4, z, 4, z, 5, z, 5, z, 6, z,
                                            6, z, 7, z, 7, z);
    const __m256i rep_hi = _mm256_setr_epi8(8, z, 8, z, 9, z, 9, z, 10, z, 10, z, 11, z, 11, z, 12, z, 12, z, 13, z, 13,
                                            z, 14, z, 14, z, 15, z, 15, z);
    for (int h = 0; h < 2; ++h) {
      const __m256i low = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * h)));
      const __m256i high = _mm256_shuffle_epi8(qh2, h ? rep_hi : rep_lo);
      const __m256i index = _mm256_or_si256(low, _mm256_and_si256(_mm256_mullo_epi16(high, mul), mask));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), index);
    }
    from_memory(idx);
    // the delta's sign of group g: bit 3 (g even) or 7 (g odd) of qh[g / 2]; 2 where it is clear (delta + 1)
    const __m128i bit = _mm_set1_epi16(static_cast<short>(0x8008));
    const __m128i two = _mm_set1_epi8(2);
    const __m128i lo = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(_mm_unpacklo_epi8(qh, qh), bit), _mm_setzero_si128()), two);
    const __m128i hi = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(_mm_unpackhi_epi8(qh, qh), bit), _mm_setzero_si128()), two);
    plus[0] = _mm256_broadcastsi128_si256(lo);
    plus[1] = _mm256_broadcastsi128_si256(hi);
  }
  template <int ib>
  inline __attribute__((always_inline)) __m256i codes(const GridBytes& t) const {
    // lanes 8j .. 8j + 7 take group 4 ib + j; the 128-bit halves hold the same 16 groups
    constexpr char g = static_cast<char>(4 * ib % 16);
    const __m256i spread = _mm256_setr_epi8(g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1,
                                            g + 1, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 3, g + 3,
                                            g + 3, g + 3, g + 3, g + 3, g + 3, g + 3);
    return _mm256_add_epi8(grid32(idx, ib, t), _mm256_shuffle_epi8(plus[ib / 4], spread));
  }
};

template <class B>
struct Iq1BlockOf;
template <>
struct Iq1BlockOf<block_iq1_s> {
  using type = Iq1sBlock;
};
template <>
struct Iq1BlockOf<block_iq1_m> {
  using type = Iq1mBlock;
};

template <class B>
concept HasIq1OneRow = std::is_same_v<B, block_iq1_s> || std::is_same_v<B, block_iq1_m>;

// Blocks [begin, end) of one weight row against one row of x.
template <class B>
struct Iq1OneRowDot {
  TileView tile;
  ChunkSums chunk_sums;

  explicit Iq1OneRowDot(const QuantizedRows& act) : tile(act, 0), chunk_sums(act, 0) {}

  void run(const B* row, int64_t begin, int64_t end, float* res) const {
    const GridBytes& t = grid_bytes();
    typename Iq1BlockOf<B>::type blk_codes;
    IntChunkScalesBase is;
    vf32x8 acc = {};
    for (int64_t blk = begin; blk < end; ++blk) {
      prefetch_ahead<1>(reinterpret_cast<const uint8_t*>(row + blk));
      __m256i coef;
      blk_codes.load(row + blk, is, coef);
      const ActRecord* rec = tile.records(4 * blk);  // one row: stride 1
      vf32x8 block_acc[2] = {chunk_coefficient_sums(coef, chunk_sums.q_of(0, 16 * blk)), vf32x8{}};
      [&]<int... ib>(std::integer_sequence<int, ib...>) __attribute__((always_inline)) {
        ((block_acc[ib % 2] += __builtin_convertvector(
              (vi32x8)_mm256_madd_epi16(
                  _mm256_maddubs_epi16(blk_codes.template codes<ib>(t),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec[ib / 2].q + 32 * (ib % 2)))),
                  is.template half<ib>()),
              vf32x8) *
              rec[ib / 2].d[ib % 2]),
         ...);
      }(std::make_integer_sequence<int, 8>{});
      acc += (block_acc[0] + block_acc[1]) * is.d;
    }
    *res = pairwise_sum(acc);
  }
};
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
