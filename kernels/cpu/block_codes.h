// A block's elements as integer codes and float values, 16 at a time, from the shared layouts of
// kernels/common/ggml_blocks.h: what the dequantize and matmul kernels both decode with.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
// Scales in hardware: a signalling NaN scale comes out quiet, as any product with it does anyway.
#define GGML_EXT_HALF_TO_FLOAT(h) _cvtsh_ss(h)
#endif
#if defined(__clang__) && defined(__SSSE3__)
#include <immintrin.h>
#elif defined(__clang__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/simd.h"

// The 64-byte vectors here only cross always-inline helpers: no ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ggml_ext::cpu::GGML_EXT_ISA {

// 16 lanes whatever the variant's width: GCC lowers these to 1, 2 or 4 native vectors.
typedef uint8_t vu8x16 __attribute__((vector_size(16)));
typedef int8_t vi8x16 __attribute__((vector_size(16)));
typedef int16_t vi16x16 __attribute__((vector_size(32)));
typedef int32_t vi32x16 __attribute__((vector_size(64)));
typedef float vf32x16 __attribute__((vector_size(64)));

// table[idx[i] % 16] per lane (V: a 16-byte vector): GCC's __builtin_shuffle, which clang (Apple's compiler
// included) does not have; there the byte-table instruction of the target (SSSE3 pshufb, NEON tbl) after the
// same modulo, else a loop.
template <class V>
inline __attribute__((always_inline)) V shuffle_bytes(V table, vu8x16 idx) {
#if !defined(__clang__)
  return __builtin_shuffle(table, idx);
#elif defined(__SSSE3__)
  return (V)_mm_shuffle_epi8((__m128i)table, (__m128i)(idx & 15));
#elif defined(__ARM_NEON)
  return (V)vqtbl1q_u8((uint8x16_t)table, (uint8x16_t)(idx & 15));
#else
  V out;
  for (int i = 0; i < 16; ++i) out[i] = table[idx[i] & 15];
  return out;
#endif
}

// A block type with its shared layout and scale functions (kernels/common/ggml_blocks.h).
template <class Block, int QK, ggml_ext_layout16 (*Layout)(int), ggml_ext_scale16 (*Scale)(const Block*, int)>
struct BlockFormat {
  using B = Block;
  static constexpr int kQK = QK;
  static constexpr ggml_ext_layout16 layout(int chunk) { return Layout(chunk); }
  // Always inlined: an out-of-line call per block made the decode kernels several times slower.
  static inline __attribute__((always_inline)) ggml_ext_scale16 scale(const Block* b, int chunk) {
    return Scale(b, chunk);
  }
};

#define GGML_EXT_BLOCK_FORMAT(name, qk) \
  BlockFormat<block_##name, qk, ggml_ext_layout16_##name, ggml_ext_scale16_##name<const block_##name*>>

// A decoded type (the IQ grids, the ternary types: kernels/common/iq_decoders.h): 16 elements at a time through
// its reference decoder, the one way to read it (no chunk layout).
template <class Block, void (*Decode)(const Block*, int, float*)>
struct DecodedFormat {
  using B = Block;
  static constexpr int kQK = GGML_EXT_QK_K;
  static inline __attribute__((always_inline)) void chunk(const Block* b, int c, float* y) { Decode(b, c, y); }
};

#define GGML_EXT_DECODED_FORMAT(name) \
  DecodedFormat<block_##name, ggml_ext_dequant16_##name<const block_##name*, float*>>

inline vu8x16 load16(const uint8_t* p) {
  vu8x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The codebook of a layout as a byte vector (unused for plain codes).
inline vi8x16 codebook_table(int codebook) {
  vi8x16 t = {};
  if (codebook != GGML_EXT_CODEBOOK_NONE) {
    for (int k = 0; k < 16; ++k) t[k] = static_cast<int8_t>(ggml_ext_codebook_value(codebook, k));
  }
  return t;
}

// ggml_ext_code16 of the layout for all 16 elements at once.
inline __attribute__((always_inline)) vi8x16 codes16(const uint8_t* block, const ggml_ext_layout16& l,
                                                     vi8x16 table) {
  vu8x16 part = (load16(block + l.lo) >> l.lo_shift) & static_cast<uint8_t>(l.lo_mask);
  if (l.hi_word) {
    // Bits hi_shift + j of the little-endian word: hi_shift is 0 or 16, so they are two whole bytes, one
    // per half of the lanes; byte tests keep this in byte vectors on every ISA.
    const uint8_t first = block[l.hi + l.hi_shift / 8], second = block[l.hi + l.hi_shift / 8 + 1];
    const vu8x16 bytes = {first, first, first, first, first, first, first, first,
                          second, second, second, second, second, second, second, second};
    const vu8x16 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    // The lane bit as a uint8_t variable: under -fsanitize=shift GCC 12 sees an instrumented shift as an int
    // and refuses to splat it into byte lanes ("conversion ... involves truncation").
    const uint8_t lane_bit = static_cast<uint8_t>(1u << l.hi_pos);
    part |= (vu8x16)((bytes & bit) != 0) & lane_bit;
  } else if (l.hi_mask) {
    part |= ((load16(block + l.hi) >> l.hi_shift) & static_cast<uint8_t>(l.hi_mask)) << l.hi_pos;
  }
  if (l.codebook != GGML_EXT_CODEBOOK_NONE) return shuffle_bytes(table, part);
  return (vi8x16)part - static_cast<int8_t>(l.zero);
}

// ggml_ext_apply_scale16 for all 16 codes: the same two roundings (no contraction in this file).
inline __attribute__((always_inline)) vf32x16 values16(vi8x16 codes, const ggml_ext_scale16& s) {
  // Widening in two steps: GCC 12 scalarizes a direct int8 -> int32 conversion.
  const vi32x16 wide = __builtin_convertvector(__builtin_convertvector(codes, vi16x16), vi32x16);
  vf32x16 v = __builtin_convertvector(wide, vf32x16) * s.scale;
  if (s.offset_op < 0) v = v - s.offset;  // both NaN: the first operand's, the product's, as in gguf
  if (s.offset_op > 0) {
    // An addition's operands may be swapped by the compiler, which changes the NaN returned when both are
    // NaN: keep the product's explicitly. The NaN mask comes from the bits by arithmetic (GCC 12 scalarizes
    // compares of 16-lane vectors below AVX-512).
    const vf32x16 sum = v + s.offset;
    const vi32x16 nan = ~((((vi32x16)v & 0x7fffffff) - 0x7f800001) >> 31);
    v = (vf32x16)(((vi32x16)v & nan) | ((vi32x16)sum & ~nan));
  }
  return v;
}

}  // namespace ggml_ext::cpu::GGML_EXT_ISA
