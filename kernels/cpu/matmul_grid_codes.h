// The IQ grid types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and TQ1_0 on the integer row dots.
// No chunk layout can express a grid lookup, but every value of these formats is a small integer times a
// per-chunk integer times one float per block:
//   IQ2_*:   d (0.5 + s) 0.25 * (+-{8, 25, 43})     = (d / 8) (2s + 1) * grid value
//   IQ3_XXS: d (0.5 + s) 0.5 * (+-{4, 12, ..., 62})  = (d / 4) (2s + 1) * grid value
//   IQ3_S:   d (1 + 2s) * (+-{1, 3, ..., 15})
//   IQ1_S/M: d (2s + 1) * (grid {-1, 0, 1} +- 1/8)   = (d / 8) (2s + 1) * (8 grid +- 1)
//   TQ1_0:   d * (digit - 1)
// So each block is staged, once per weight row and K segment, as a StagedBlock: its 256 codes as int8 in element
// order, 16 chunk scales as int8 and the float d: a layout (plain signed bytes, as Q8_0's) that the AVX2, AVX-512
// and portable row dots take as they are, their activations x quantized per 32 as for the other formats. The
// staging runs in generic vectors (AVX2 or SSE on x86, NEON on Arm): table loads of whole grid entries,
// whose byte tables are made once from kernels/common/iq_grids.h through iq_decoders.h's value maps, and sign
// bits spread to byte lanes, 32 codes per step.
#pragma once
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/matmul_block_scales.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/matmul_dot_avx2.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

struct alignas(32) StagedBlock {
  int8_t qs[256];     // the codes, in element order
  int8_t scales[16];  // chunk c's integer scale (2s + 1: at most 31)
  float d;            // the block's float scale
};
static_assert(sizeof(StagedBlock) == 288, "staged block size");

constexpr ggml_ext_layout16 staged_layout(int chunk) {
  ggml_ext_layout16 l = ggml_ext_make_layout16(16 * chunk, 0, 0xFF, 0);
  l.lo_signed = 1;
  return l;
}
inline __attribute__((always_inline)) ggml_ext_scale16 staged_scale(const StagedBlock* b, int chunk) {
  return ggml_ext_make_scale16(b->d * static_cast<float>(b->scales[chunk]), 0.0f, 0);
}
using StagedFormat = BlockFormat<StagedBlock, GGML_EXT_QK_K, staged_layout, staged_scale>;

// The chunk scales as floats (the portable dots, and the 256-bit dots of AVX-512 VNNI builds: dpbusd has no int16
// step).
struct StagedScales : ChunkScales<StagedFormat> {
  inline __attribute__((always_inline)) void load_block(const StagedBlock* b) {
    scale = int8_scales_times(load_vec<vi8x16>(b->scales), b->d);
    offset = vf32x16{};
  }
};
template <>
struct ScalesOf<StagedFormat> {
  using type = StagedScales;
};
#if defined(__AVX2__) && !defined(__AVX512VNNI__)
// The integer chunk scales in AVX2's int16 step (every tile height of x).
template <>
struct IntChunkScales<StagedFormat> : IntChunkScalesBase {
  inline __attribute__((always_inline)) void load_block(const StagedBlock* b) {
    set(load_vec<vi8x16>(b->scales), b->d);
  }
};
#endif

// ---------------------------------------------------------------------------------------------------
// Byte tables of the grids: entry e's values as consecutive bytes (IQ2: 8 values {8, 25, 43}; IQ1: 8 values
// times 8, plus 8, {0, 8, 16}: unsigned for matmul_iq1_one_row.h's maddubs; IQ3: 4 values), and ggml's ksigns (7
// stored sign bits and their parity bit) for 128 codes as 8 byte masks each (0xFF where the element is negative):
// a 7-bit sign field is one table load, where spreading the ksigns byte's bits over the lanes took a dozen scalar
// and vector steps per 32 codes.
// Made on first use by the variant that runs (a static initializer of the AVX-512 objects would run anywhere).
// ---------------------------------------------------------------------------------------------------
struct GridBytes {
  uint64_t iq2xxs[GGML_EXT_IQ2XXS_GRID_SIZE], iq2xs[GGML_EXT_IQ2XS_GRID_SIZE], iq2s[GGML_EXT_IQ2S_GRID_SIZE];
  uint64_t iq1s[GGML_EXT_IQ1S_GRID_SIZE];
  uint32_t iq3xxs[GGML_EXT_IQ3XXS_GRID_SIZE], iq3s[GGML_EXT_IQ3S_GRID_SIZE];
  uint64_t sign_masks[128];
};

template <class Word, int kValues, class Value>
void fill_grid_bytes(Word* out, const uint16_t* grid, int entries, Value value) {
  for (int e = 0; e < entries; ++e) {
    Word w = 0;
    for (int j = 0; j < kValues; ++j) w |= static_cast<Word>(static_cast<uint8_t>(value(grid[e], j))) << (8 * j);
    out[e] = w;
  }
}

inline const GridBytes& grid_bytes() {
  static const GridBytes tables = [] {
    GridBytes t;
    auto iq2 = [](uint32_t w, int j) { return ggml_ext_iq2_grid_value(w, j); };
    fill_grid_bytes<uint64_t, 8>(t.iq2xxs, GGML_EXT_GRID(iq2xxs), GGML_EXT_IQ2XXS_GRID_SIZE, iq2);
    fill_grid_bytes<uint64_t, 8>(t.iq2xs, GGML_EXT_GRID(iq2xs), GGML_EXT_IQ2XS_GRID_SIZE, iq2);
    fill_grid_bytes<uint64_t, 8>(t.iq2s, GGML_EXT_GRID(iq2s), GGML_EXT_IQ2S_GRID_SIZE, iq2);
    fill_grid_bytes<uint64_t, 8>(t.iq1s, GGML_EXT_GRID(iq1s), GGML_EXT_IQ1S_GRID_SIZE,
                                 [](uint32_t w, int j) { return 8 * ggml_ext_iq1_grid_value(w, j) + 8; });
    fill_grid_bytes<uint32_t, 4>(t.iq3xxs, GGML_EXT_GRID(iq3xxs), GGML_EXT_IQ3XXS_GRID_SIZE,
                                 [](uint32_t w, int j) { return ggml_ext_iq3xxs_grid_value(w, j); });
    fill_grid_bytes<uint32_t, 4>(t.iq3s, GGML_EXT_GRID(iq3s), GGML_EXT_IQ3S_GRID_SIZE,
                                 [](uint32_t w, int j) { return ggml_ext_iq3s_grid_value(w, j); });
    for (uint32_t s = 0; s < 128; ++s) {
      const uint32_t bits = ggml_ext_iq_ksigns(s);
      t.sign_masks[s] = 0;
      for (int j = 0; j < 8; ++j) t.sign_masks[s] |= static_cast<uint64_t>((bits >> j) & 1 ? 0xFF : 0) << (8 * j);
    }
    return t;
  }();
  return tables;
}

// ---------------------------------------------------------------------------------------------------
// 32 codes (a sub-block) at a time, in 32-byte generic vectors (one AVX2 register, two SSE or NEON ones): four grid
// entries of 8 values (or eight of 4), four bytes of sign bits (bit j of byte g: element j of group g negative).
// ---------------------------------------------------------------------------------------------------
typedef int8_t vi8x32 __attribute__((vector_size(32)));
typedef uint8_t vu8x32 __attribute__((vector_size(32)));
typedef uint32_t vu32x8 __attribute__((vector_size(32)));
typedef uint64_t vu64x4 __attribute__((vector_size(32)));
typedef uint32_t vu32x4 __attribute__((vector_size(16)));

inline __attribute__((always_inline)) vi8x32 entries8(uint64_t e0, uint64_t e1, uint64_t e2, uint64_t e3) {
  return (vi8x32)vu64x4{e0, e1, e2, e3};
}
// Byte g of `word` in the 8 lanes of group g (a broadcast and a byte shuffle).
inline __attribute__((always_inline)) vu8x32 group_bytes(uint32_t word) {
  const vu8x32 v = (vu8x32)(vu32x8{} + word);
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                 3, 3, 3, 3, 3, 3);
}
// -1 in the lanes whose bit is set in their group's byte of `bits`, else 0.
inline __attribute__((always_inline)) vi8x32 lane_bits(uint32_t bits) {
  const vu8x32 lane_bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                           1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return (vi8x32)((group_bytes(bits) & lane_bit) == lane_bit);
}
// The values with their signs applied: (v ^ m) - m negates where m is -1.
inline __attribute__((always_inline)) vi8x32 signed32(vi8x32 v, uint32_t signs) {
  const vi8x32 negative = lane_bits(signs);
  return (v ^ negative) - negative;
}
// The values with the signs of four 7-bit sign fields (one per group of 8 values) applied.
inline __attribute__((always_inline)) vi8x32 signed_by_fields(vi8x32 v, uint32_t f0, uint32_t f1, uint32_t f2,
                                                              uint32_t f3, const GridBytes& t) {
  const vi8x32 negative = entries8(t.sign_masks[f0], t.sign_masks[f1], t.sign_masks[f2], t.sign_masks[f3]);
  return (v ^ negative) - negative;
}
// The same for the four fields of an IQ2_XXS / IQ3_XXS sub-block word (bits 0..27).
inline __attribute__((always_inline)) vi8x32 signed_by_word(vi8x32 v, uint32_t aux, const GridBytes& t) {
  return signed_by_fields(v, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127, t);
}
inline __attribute__((always_inline)) void put32(StagedBlock* s, int sub_block, vi8x32 codes) {
  std::memcpy(s->qs + 32 * sub_block, &codes, sizeof codes);
}
inline __attribute__((always_inline)) int8_t odd_scale(uint32_t s) { return static_cast<int8_t>(2 * s + 1); }
// IQ2_XS, IQ2_S: sub-block ib's two chunk scales, the nibbles of one byte (low first).
inline __attribute__((always_inline)) void nibble_scales(StagedBlock* s, int ib, uint32_t byte) {
  s->scales[2 * ib] = odd_scale(byte & 15);
  s->scales[2 * ib + 1] = odd_scale(byte >> 4);
}
inline __attribute__((always_inline)) uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// One block each, sub-block ib = 32 elements = chunks 2ib, 2ib + 1 = groups 4ib .. 4ib + 3 of 8
// (kernels/common/iq_decoders.h has the element orders).
// ---------------------------------------------------------------------------------------------------
inline __attribute__((always_inline)) void stage_block(const block_iq2_xxs* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t idx = b->qs[4 * ib] | (static_cast<uint32_t>(b->qs[4 * ib + 1]) << 16);
    const uint32_t aux = b->qs[4 * ib + 2] | (static_cast<uint32_t>(b->qs[4 * ib + 3]) << 16);
    s->scales[2 * ib] = s->scales[2 * ib + 1] = odd_scale(aux >> 28);
    put32(s, ib, signed_by_word(entries8(t.iq2xxs[idx & 255], t.iq2xxs[(idx >> 8) & 255],
                                         t.iq2xxs[(idx >> 16) & 255], t.iq2xxs[idx >> 24]),
                                aux, t));
  }
}

inline __attribute__((always_inline)) void stage_block(const block_iq2_xs* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    nibble_scales(s, ib, b->scales[ib]);
    const uint16_t* q = b->qs + 4 * ib;
    put32(s, ib, signed_by_fields(entries8(t.iq2xs[q[0] & 511], t.iq2xs[q[1] & 511], t.iq2xs[q[2] & 511],
                                           t.iq2xs[q[3] & 511]),
                                  q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9, t));
  }
}

inline __attribute__((always_inline)) void stage_block(const block_iq2_s* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    nibble_scales(s, ib, b->scales[ib]);
    const uint8_t* q = b->qs + 4 * ib;
    const uint32_t high = b->qh[ib];  // 2 index bits per group
    put32(s, ib, signed32(entries8(t.iq2s[q[0] | ((high & 3) << 8)], t.iq2s[q[1] | ((high & 12) << 6)],
                                   t.iq2s[q[2] | ((high & 48) << 4)], t.iq2s[q[3] | ((high & 192) << 2)]),
                          load_u32(b->signs + 4 * ib)));
  }
}

inline __attribute__((always_inline)) void stage_block(const block_iq3_xxs* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.25f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux = b->scales_signs[2 * ib] | (static_cast<uint32_t>(b->scales_signs[2 * ib + 1]) << 16);
    s->scales[2 * ib] = s->scales[2 * ib + 1] = odd_scale(aux >> 28);
    const uint8_t* q = b->qs + 8 * ib;
    const vu32x8 v = {t.iq3xxs[q[0]], t.iq3xxs[q[1]], t.iq3xxs[q[2]], t.iq3xxs[q[3]],
                      t.iq3xxs[q[4]], t.iq3xxs[q[5]], t.iq3xxs[q[6]], t.iq3xxs[q[7]]};
    put32(s, ib, signed_by_word((vi8x32)v, aux, t));
  }
}

inline __attribute__((always_inline)) void stage_block(const block_iq3_s* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d);
  for (int ib = 0; ib < 8; ++ib) {
    s->scales[2 * ib] = s->scales[2 * ib + 1] = odd_scale((b->scales[ib >> 1] >> (4 * (ib & 1))) & 15);
    const uint8_t* q = b->qs + 8 * ib;
    const uint32_t high = b->qh[ib];  // the 9th index bit of each of the 8 entries
    const vu32x8 v = {t.iq3s[q[0] | ((high & 1) << 8)],   t.iq3s[q[1] | ((high & 2) << 7)],
                      t.iq3s[q[2] | ((high & 4) << 6)],   t.iq3s[q[3] | ((high & 8) << 5)],
                      t.iq3s[q[4] | ((high & 16) << 4)],  t.iq3s[q[5] | ((high & 32) << 3)],
                      t.iq3s[q[6] | ((high & 64) << 2)],  t.iq3s[q[7] | ((high & 128) << 1)]};
    put32(s, ib, signed32((vi8x32)v, load_u32(b->signs + 4 * ib)));
  }
}

// IQ1: grid values times 8 plus the delta's sign (+1, or -1 where the group's delta is negative); the table's
// entries are 8 above that.
inline __attribute__((always_inline)) void stage_block(const block_iq1_s* b, StagedBlock* s, const GridBytes& t) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d) * 0.125f;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t qh = b->qh[ib];
    s->scales[2 * ib] = s->scales[2 * ib + 1] = odd_scale((qh >> 12) & 7);
    const uint8_t* q = b->qs + 4 * ib;
    const int8_t delta = (qh & 0x8000u) ? -9 : -7;  // the delta's sign less the table's 8
    put32(s, ib, entries8(t.iq1s[q[0] | ((qh & 7) << 8)], t.iq1s[q[1] | ((qh & 0x38) << 5)],
                          t.iq1s[q[2] | ((qh & 0x1C0) << 2)], t.iq1s[q[3] | ((qh & 0xE00) >> 1)]) + delta);
  }
}

// IQ1_M: the 3-bit fields of a 12-bit scale word, one per byte (byte k: bits 3k .. 3k + 2).
inline __attribute__((always_inline)) uint32_t spread3(uint32_t w) {
  return (w & 7u) | ((w & 0x38u) << 5) | ((w & 0x1C0u) << 10) | ((w & 0xE00u) << 15);
}
inline __attribute__((always_inline)) void stage_block(const block_iq1_m* b, StagedBlock* s, const GridBytes& t) {
  uint32_t words[4];
  for (int k = 0; k < 4; ++k) words[k] = ggml_ext_iq1m_scale_word(b, k);
  const uint32_t d_bits = (words[0] >> 12) | ((words[1] >> 8) & 0xF0u) | ((words[2] >> 4) & 0xF00u) |
                          (words[3] & 0xF000u);
  s->d = GGML_EXT_HALF_TO_FLOAT(static_cast<uint16_t>(d_bits)) * 0.125f;
  for (int k = 0; k < 4; ++k) {
    const uint32_t odd = 2 * spread3(words[k]) + 0x01010101u;  // 2s + 1 in each byte: no carries (s <= 7)
    std::memcpy(s->scales + 4 * k, &odd, sizeof odd);
  }
  // The delta's sign of group g: bit 3 (g even) or 7 (g odd) of qh byte g / 2, tested in the group's lanes.
  const vu8x32 delta_bit = {8,   8,   8,   8,   8,   8,   8,   8,   128, 128, 128, 128, 128, 128, 128, 128,
                            8,   8,   8,   8,   8,   8,   8,   8,   128, 128, 128, 128, 128, 128, 128, 128};
  for (int ib = 0; ib < 8; ++ib) {
    // groups 4ib .. 4ib + 3: a nibble each (3 index bits, the delta's sign in bit 3)
    const uint32_t lo = b->qh[2 * ib], hi = b->qh[2 * ib + 1];
    const uint8_t* q = b->qs + 4 * ib;
    const vi8x32 grid = entries8(t.iq1s[q[0] | ((lo & 7) << 8)], t.iq1s[q[1] | ((lo & 0x70) << 4)],
                                 t.iq1s[q[2] | ((hi & 7) << 8)], t.iq1s[q[3] | ((hi & 0x70) << 4)]);
    const vu8x32 pair = (vu8x32)(vu32x8{} + (lo | (hi << 8)));
    const vu8x32 bytes = __builtin_shufflevector(pair, pair, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1,
                                                 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    const vi8x32 negative = (vi8x32)((bytes & delta_bit) == delta_bit);
    put32(s, ib, grid - 7 + (negative + negative));  // -8 + 1, or -8 - 1 in the negative delta's groups
  }
}

// TQ1_0: base-3 digits minus 1, d per block. Digit k of a byte q is (3 (q 3^k mod 256)) >> 8: 0, 1 or 2 as
// y = q 3^k mod 256 is below 86, below 171 or not. 32 bytes at a time: y from 16-bit products (each lane's low
// byte from the whole lane's product, its high byte from the high byte's), the digit from two byte compares,
// without widening 16 bytes at a time to 16-bit lanes and narrowing them back.
typedef uint16_t vu16x16 __attribute__((vector_size(32)));
inline __attribute__((always_inline)) vi8x32 ternary32(vu8x32 bytes, vu16x16 pow3) {
  const vu16x16 w = (vu16x16)bytes;
  const vu8x32 y = (vu8x32)(((w * pow3) & 0x00FF) | (((w & 0xFF00) * pow3) & 0xFF00));
  const vi8x32 past1 = (vi8x32)(y >= 86), past2 = (vi8x32)(y >= 171);  // -1 where true
  return ~past1 - past2;  // -1 + (digit >= 1) + (digit >= 2)
}
inline __attribute__((always_inline)) vu16x16 halves(uint16_t low, uint16_t high) {
  return vu16x16{low, low, low, low, low, low, low, low, high, high, high, high, high, high, high, high};
}
// A TQ1_0 block's three code vectors (qs[0..31]; qs[32..47] twice; qs[32..47] then qh[j % 4] in lane 16 + j), loaded
// once, and the digits minus 1 of its sub-block ib (elements 32 ib .. 32 ib + 31) made from them: the staging and
// the one-row dot (matmul_iq_signed_one_row.h) both take them from here.
struct Tq1Codes {
  vu8x32 head, tail, last;
  inline __attribute__((always_inline)) void load(const block_tq1_0* b) {
    head = load_vec<vu8x32>(b->qs);  // elements 0..159: qs[j % 32], digit j / 32
    const vu8x16 t16 = load16(b->qs + 32);  // elements 160..239: qs[32 + j % 16], digit j / 16
    tail = __builtin_shufflevector(t16, t16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6,
                                   7, 8, 9, 10, 11, 12, 13, 14, 15);
    const vu8x16 qh = (vu8x16)(vu32x4{} + load_u32(b->qh));  // elements 240..255: qh[j % 4], digit j / 4
    last = __builtin_shufflevector(t16, qh, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                   21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  template <int ib>
  inline __attribute__((always_inline)) vi8x32 digits() const {
    if constexpr (ib < 5) {
      constexpr uint16_t kPow3[5] = {1, 3, 9, 27, 81};
      return ternary32(head, vu16x16{} + kPow3[ib]);
    } else if constexpr (ib < 7) {
      return ternary32(tail, ib == 5 ? halves(1, 3) : halves(9, 27));
    } else {
      return ternary32(last, vu16x16{81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27});
    }
  }
};
inline __attribute__((always_inline)) void stage_block(const block_tq1_0* b, StagedBlock* s, const GridBytes&) {
  s->d = GGML_EXT_HALF_TO_FLOAT(b->d);
  std::memset(s->scales, 1, sizeof s->scales);
  Tq1Codes codes;
  codes.load(b);
  [&]<int... ib>(std::integer_sequence<int, ib...>) __attribute__((always_inline)) {
    (put32(s, ib, codes.template digits<ib>()), ...);
  }(std::make_integer_sequence<int, 8>{});
}

// A grid type as the matmul drivers see it: its packed blocks, which the row dots read as StagedFormat once
// stage() has run over them.
template <class Block>
struct GridFormat {
  using B = Block;
  using Staged = StagedFormat;
  static constexpr int kQK = GGML_EXT_QK_K;
  static void stage(const Block* b, int64_t count, StagedBlock* out) {
    const GridBytes& t = grid_bytes();
    for (int64_t i = 0; i < count; ++i) {
      prefetch_ahead<2>(reinterpret_cast<const uint8_t*>(b + i));
      stage_block(b + i, out + i, t);
    }
  }
};

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
