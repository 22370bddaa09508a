// ggml's quantized block formats, defined once for every backend.
//
// This header is included by the CPU kernels (C++), the CUDA kernels (nvcc) and the Metal kernels (MSL,
// and the project's Metal emulator). It holds: the list of types (GGML_EXT_FOR_EACH_FLOAT_TYPE and
// GGML_EXT_FOR_EACH_QUANT_TYPE, X-macros: the one place the types are enumerated) and the type ids made
// from it, the block structs (little-endian, fields in ggml's order, sizes checked), the small decoding
// helpers (scales, nibble lookups), each format's chunk layout as data (`ggml_ext_layout16_<type>(chunk)`: which bytes, shifts and masks hold 16 consecutive
// elements; `ggml_ext_scale16_<type>(block, chunk)`: their scale and offset) and, built on those, one
// reference decoder per type, `ggml_ext_dequant16_<type>(block, chunk, out)`, writing the elements
// [16*chunk, 16*chunk + 16) of a block as float. Fast kernels interpret the same layouts with vectors, so
// a format's layout lives here only.
//
// Values are computed in the same order as ggml's C code and the `gguf` package (e.g. Q2_K..Q5_K: (d*sc)*q
// - (dmin*m)), so a float32 result is bit-identical to theirs provided the compiler does not contract
// a*b - c into an FMA (CPU dequantize sources are built with -ffp-contract=off).
//
// Pointers are template parameters so the same code accepts Metal's address spaces (device/threadgroup/
// thread) and plain C++/CUDA pointers.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#define GGML_EXT_FN inline
#define GGML_EXT_LAYOUT_FN inline
#define GGML_EXT_HALF_TO_FLOAT(h) float(as_type<half>(ushort(h)))
#elif defined(__CUDACC__)
#include <stddef.h>
#include <stdint.h>
#include <cuda_fp16.h>
#include "fp16.h"
#define GGML_EXT_FN __host__ __device__ inline
#define GGML_EXT_LAYOUT_FN __host__ __device__ constexpr inline
#else
#include <stddef.h>
#include <stdint.h>
#include "fp16.h"
// Forced inline: a CPU kernel calls these per block, and an out-of-line call returning the scale struct costs more
// than the decode (measured: MXFP4's scale as a call made its matmul 8x slower).
#if defined(__GNUC__)
#define GGML_EXT_FN inline __attribute__((always_inline))
#else
#define GGML_EXT_FN inline
#endif
// Layouts are constants: C++ kernels may evaluate them at compile time.
#define GGML_EXT_LAYOUT_FN constexpr inline
#ifndef GGML_EXT_HALF_TO_FLOAT  // a CPU kernel may use the hardware conversion (same value; NaNs come out quiet)
#define GGML_EXT_HALF_TO_FLOAT(h) ggml_ext_fp16_to_fp32(h)
#endif
#endif

#if defined(__CUDACC__)
GGML_EXT_FN float ggml_ext_half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return ggml_ext_fp16_to_fp32(h);
#endif
}
#undef GGML_EXT_HALF_TO_FLOAT
#define GGML_EXT_HALF_TO_FLOAT(h) ggml_ext_half_to_float(h)
#endif

#define GGML_EXT_QK32 32   // legacy types, IQ4_NL, MXFP4
#define GGML_EXT_QK_K 256  // K-quants, IQ4_XS, the IQ1/IQ2/IQ3 and ternary types

// The ggml types this package handles, listed once: every switch over them is generated from these lists.
// X(NAME, id, bytes): a float type; GGML_EXT_TYPE_<NAME> = id (as stored in GGUF files), bytes per element
// (a float type is a block of one element).
#define GGML_EXT_FOR_EACH_FLOAT_TYPE(X)     \
  X(F32, 0, 4)                              \
  X(F16, 1, 2)                              \
  X(BF16, 30, 2)
// X(NAME, name, id, qk, bytes): a block type; GGML_EXT_TYPE_<NAME> = id, qk elements and ggml's bytes per
// block (checked against sizeof(block_<name>)), block_<name> and ggml_ext_dequant16_<name> below. Two kinds:
// - layout types: codes at fixed bits of the block, described as data by ggml_ext_layout16_<name> and
//   ggml_ext_scale16_<name> (below), which the fast kernels (CPU SIMD, CUDA integer dots) interpret;
// - decoded types (IQ1/IQ2/IQ3 grids, the ternary TQ1_0/TQ2_0): read through their reference decoders only
//   (kernels/common/iq_decoders.h), whose grids no layout can express. Every kernel that takes a decoder
//   handles them; the layout kernels list GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE.
#define GGML_EXT_FOR_EACH_QUANT_TYPE(X) GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(X) GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(X)
#define GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(X) \
  X(IQ2_XXS, iq2_xxs, 16, GGML_EXT_QK_K, 66)    \
  X(IQ2_XS, iq2_xs, 17, GGML_EXT_QK_K, 74)      \
  X(IQ3_XXS, iq3_xxs, 18, GGML_EXT_QK_K, 98)    \
  X(IQ1_S, iq1_s, 19, GGML_EXT_QK_K, 50)        \
  X(IQ3_S, iq3_s, 21, GGML_EXT_QK_K, 110)       \
  X(IQ2_S, iq2_s, 22, GGML_EXT_QK_K, 82)        \
  X(IQ1_M, iq1_m, 29, GGML_EXT_QK_K, 56)        \
  X(TQ1_0, tq1_0, 34, GGML_EXT_QK_K, 54)        \
  X(TQ2_0, tq2_0, 35, GGML_EXT_QK_K, 66)
#define GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(X) \
  X(Q4_0, q4_0, 2, GGML_EXT_QK32, 18)       \
  X(Q4_1, q4_1, 3, GGML_EXT_QK32, 20)       \
  X(Q5_0, q5_0, 6, GGML_EXT_QK32, 22)       \
  X(Q5_1, q5_1, 7, GGML_EXT_QK32, 24)       \
  X(Q8_0, q8_0, 8, GGML_EXT_QK32, 34)       \
  X(Q2_K, q2_k, 10, GGML_EXT_QK_K, 84)      \
  X(Q3_K, q3_k, 11, GGML_EXT_QK_K, 110)     \
  X(Q4_K, q4_k, 12, GGML_EXT_QK_K, 144)     \
  X(Q5_K, q5_k, 13, GGML_EXT_QK_K, 176)     \
  X(Q6_K, q6_k, 14, GGML_EXT_QK_K, 210)     \
  X(IQ4_NL, iq4_nl, 20, GGML_EXT_QK32, 18)  \
  X(IQ4_XS, iq4_xs, 23, GGML_EXT_QK_K, 136) \
  X(MXFP4, mxfp4, 39, GGML_EXT_QK32, 17)

#define GGML_EXT_FLOAT_TYPE_ID(NAME, id, bytes) GGML_EXT_TYPE_##NAME = id,
#define GGML_EXT_QUANT_TYPE_ID(NAME, name, id, qk, bytes) GGML_EXT_TYPE_##NAME = id,
enum ggml_ext_type_id {
  GGML_EXT_FOR_EACH_FLOAT_TYPE(GGML_EXT_FLOAT_TYPE_ID)
  GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_QUANT_TYPE_ID)
};
#undef GGML_EXT_FLOAT_TYPE_ID
#undef GGML_EXT_QUANT_TYPE_ID

// ---------------------------------------------------------------------------------------------------
// Block layouts. f16 fields are stored as raw uint16_t bits (IEEE half).
// ---------------------------------------------------------------------------------------------------
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];  // byte j: element j (low nibble), element j+16 (high nibble)
};
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];  // little-endian u32; bit j = 5th bit of element j
  uint8_t qs[16];
};
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct block_q8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct block_q2_k {
  uint8_t scales[16];  // per 16 elements: low nibble scale, high nibble min
  uint8_t qs[64];      // 2-bit quants
  uint16_t d;
  uint16_t dmin;
};
struct block_q3_k {
  uint8_t hmask[32];   // bit b of hmask[l] = high bit of element 32*b + l
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 six-bit scales, offset by 32
  uint16_t d;
};
struct block_q4_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins
  uint8_t qs[128];
};
struct block_q5_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];  // bit s of qh[l] = 5th bit of element 32*s + l
  uint8_t qs[128];
};
struct block_q6_k {
  uint8_t ql[128];     // low 4 bits
  uint8_t qh[64];      // high 2 bits
  int8_t scales[16];   // per 16 elements
  uint16_t d;
};
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[16];
};
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;   // 2 high bits of each of the 8 sub-block scales
  uint8_t scales_l[4]; // 4 low bits, two sub-blocks per byte
  uint8_t qs[128];     // sub-block ib: qs[16*ib + j] holds elements 32*ib + j and 32*ib + 16 + j
};
struct block_mxfp4 {
  uint8_t e;  // E8M0 shared exponent
  uint8_t qs[16];
};
// The decoded types (kernels/common/iq_decoders.h has their element order). Sub-blocks of 32 elements; grid
// indices pick 8 (IQ2, IQ1) or 4 (IQ3) values of a fixed grid, signs flip them; multi-byte words that ggml
// reads at any alignment are kept as bytes or 16-bit halves (blocks are only 2-byte aligned, IQ1_M's 1-byte).
struct block_iq2_xxs {
  uint16_t d;
  uint16_t qs[32];  // per sub-block, 2 words: 4 grid indices (bytes), then 4 x 7 sign bits and a 4-bit scale
};
struct block_iq2_xs {
  uint16_t d;
  uint16_t qs[32];     // per 8 elements: 9-bit grid index, 7 sign bits
  uint8_t scales[8];   // per 16 elements, a nibble
};
struct block_iq2_s {
  uint16_t d;
  uint8_t qs[32];      // per 8 elements: low 8 bits of the grid index
  uint8_t signs[32];   // per 8 elements: sign bits
  uint8_t qh[8];       // 2 high bits of each grid index
  uint8_t scales[8];   // per 16 elements, a nibble
};
struct block_iq3_xxs {
  uint16_t d;
  uint8_t qs[64];             // per 4 elements: a grid index
  uint16_t scales_signs[16];  // per sub-block, a little-endian u32: 4 x 7 sign bits and a 4-bit scale
};
struct block_iq3_s {
  uint16_t d;
  uint8_t qs[64];     // per 4 elements: low 8 bits of the grid index
  uint8_t qh[8];      // their 9th bits
  uint8_t signs[32];  // one bit per element
  uint8_t scales[4];  // per sub-block, a nibble
};
struct block_iq1_s {
  uint16_t d;
  uint8_t qs[32];   // per 8 elements: low 8 bits of the grid index
  uint16_t qh[8];   // per sub-block: 4 x 3 high index bits, a 3-bit scale, the delta's sign
};
struct block_iq1_m {
  uint8_t qs[32];     // per 8 elements: low 8 bits of the grid index
  uint8_t qh[16];     // per 8 elements, a nibble: 3 high index bits, the delta's sign
  uint8_t scales[8];  // 4 little-endian u16: 3-bit scales per 16 elements; their top nibbles hold d
};
struct block_tq1_0 {
  uint8_t qs[48];  // five base-3 digits per byte, as a fraction of 256
  uint8_t qh[4];   // four digits per byte
  uint16_t d;
};
struct block_tq2_0 {
  uint8_t qs[64];  // 2-bit codes (value + 1), Q2_K's order
  uint16_t d;
};

#define GGML_EXT_CHECK_BLOCK_SIZE(NAME, name, id, qk, bytes) \
  static_assert(sizeof(block_##name) == bytes, "block_" #name " size");
GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_CHECK_BLOCK_SIZE)
#undef GGML_EXT_CHECK_BLOCK_SIZE

// Elements and bytes per block of a type id; 0 for an id outside the lists above.
#define GGML_EXT_FLOAT_BLOCK_SIZE(NAME, id, bytes) case GGML_EXT_TYPE_##NAME: return 1;
#define GGML_EXT_QUANT_BLOCK_SIZE(NAME, name, id, qk, bytes) case GGML_EXT_TYPE_##NAME: return qk;
GGML_EXT_FN int ggml_ext_block_size(int type) {
  switch (type) {
    GGML_EXT_FOR_EACH_FLOAT_TYPE(GGML_EXT_FLOAT_BLOCK_SIZE)
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_QUANT_BLOCK_SIZE)
    default: return 0;
  }
}
#undef GGML_EXT_FLOAT_BLOCK_SIZE
#undef GGML_EXT_QUANT_BLOCK_SIZE
#define GGML_EXT_FLOAT_TYPE_SIZE(NAME, id, bytes) case GGML_EXT_TYPE_##NAME: return bytes;
#define GGML_EXT_QUANT_TYPE_SIZE(NAME, name, id, qk, bytes) case GGML_EXT_TYPE_##NAME: return sizeof(block_##name);
GGML_EXT_FN int ggml_ext_type_size(int type) {
  switch (type) {
    GGML_EXT_FOR_EACH_FLOAT_TYPE(GGML_EXT_FLOAT_TYPE_SIZE)
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_QUANT_TYPE_SIZE)
    default: return 0;
  }
}
#undef GGML_EXT_FLOAT_TYPE_SIZE
#undef GGML_EXT_QUANT_TYPE_SIZE

// ---------------------------------------------------------------------------------------------------
// Shared decoding helpers.
// ---------------------------------------------------------------------------------------------------

// Codebooks as packed int8 lanes, so every backend can use them without a table in some address space.
// kvalues_iq4nl = {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113}
// kvalues_mxfp4 = {0,1,2,3,4,6,8,12,0,-1,-2,-3,-4,-6,-8,-12} (E2M1 doubled; pairs with 2^(e-128))
GGML_EXT_FN int ggml_ext_packed_lookup(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int q) {
  const uint32_t w = q < 8 ? (q < 4 ? w0 : w1) : (q < 12 ? w2 : w3);
  return (int)(int8_t)(uint8_t)(w >> (8 * (q & 3)));
}
GGML_EXT_FN int ggml_ext_iq4nl_value(int q) {
  return ggml_ext_packed_lookup(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u, q);
}
GGML_EXT_FN int ggml_ext_mxfp4_value(int q) {
  return ggml_ext_packed_lookup(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu, q);
}

// 2^(e-128) as float, e in E8M0 (ggml's e8m0_to_fp32_half): e < 2 gives a subnormal.
GGML_EXT_FN float ggml_ext_e8m0_half_to_float(uint32_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1u) << 23);
#if defined(__METAL_VERSION__)
  return as_type<float>(bits);
#elif defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return ggml_ext_bits_to_f32(bits);
#endif
}

// Q4_K/Q5_K: six-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
template <typename P>
GGML_EXT_FN int ggml_ext_k4_scale(P q, int j) {
  return j < 4 ? (q[j] & 63) : ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
}
template <typename P>
GGML_EXT_FN int ggml_ext_k4_min(P q, int j) {
  return j < 4 ? (q[j + 4] & 63) : ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
}
// The same for sub-blocks 4h .. 4h + 3 at once from the 12 bytes as little-endian words w0, w1, w2: byte i of
// the result is the scale (or min) of sub-block 4h + i (no byte indexing: GPU kernels keep it in registers).
GGML_EXT_FN uint32_t ggml_ext_k4_scales4(uint32_t w0, uint32_t w2, int h) {
  return h == 0 ? (w0 & 0x3F3F3F3Fu) : ((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u));
}
GGML_EXT_FN uint32_t ggml_ext_k4_mins4(uint32_t w1, uint32_t w2, int h) {
  return h == 0 ? (w1 & 0x3F3F3F3Fu) : (((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u));
}

// Q3_K: signed scale of sub-block j (0..15): low nibble from bytes 0..7, two high bits from bytes 8..11.
template <typename P>
GGML_EXT_FN int ggml_ext_q3k_scale(P s, int j) {
  const int low = (s[j & 7] >> (4 * (j >> 3))) & 0xF;
  const int high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

// IQ4_XS: signed scale of sub-block ib (0..7).
template <typename B>
GGML_EXT_FN int ggml_ext_iq4xs_scale(B b, int ib) {
  const int low = (b->scales_l[ib >> 1] >> (4 * (ib & 1))) & 0xF;
  const int high = (b->scales_h >> (2 * ib)) & 3;
  return (low | (high << 4)) - 32;
}

// Q5_0/Q5_1: the 32 high bits as one little-endian word (qh is only 2-byte aligned in a row of blocks).
template <typename B>
GGML_EXT_FN uint32_t ggml_ext_q5_high_bits(B b) {
  return (uint32_t)b->qh[0] | ((uint32_t)b->qh[1] << 8) | ((uint32_t)b->qh[2] << 16) |
         ((uint32_t)b->qh[3] << 24);
}

// ---------------------------------------------------------------------------------------------------
// Chunk layouts. Where and how the 16 elements [16*chunk, 16*chunk + 16) of a block are stored, as data,
// so that the reference decoders below and the fast kernels (SIMD, GPU) read every format the same way.
// Element j (0..15) of the chunk:
//   part  = (byte[lo + j] >> lo_shift) & lo_mask                       (as int8 when lo_signed: Q8_0)
//         | ((byte[hi + j] >> hi_shift) & hi_mask) << hi_pos            (when hi_mask != 0)
//         | ((u32 at byte hi >> (hi_shift + j)) & 1) << hi_pos          (instead, when hi_word: Q5_0, Q5_1;
//                                                                     hi_shift is 0 or 16 there)
//   code  = codebook ? table[part] : part - zero
//   value = scale * (float)code, then + offset (offset_op > 0) or - offset (offset_op < 0)
// Byte offsets count from the start of the block (the field offsets are checked below on the host). chunk is
// 0..1 for 32-element blocks and 0..15 for 256-element blocks. The scale and offset come from
// ggml_ext_scale16_<type>(block, chunk), computed in ggml's order (e.g. Q4_K: d*sc, dmin*m).
// ---------------------------------------------------------------------------------------------------
#define GGML_EXT_CODEBOOK_NONE 0
#define GGML_EXT_CODEBOOK_IQ4NL 1
#define GGML_EXT_CODEBOOK_MXFP4 2

struct ggml_ext_layout16 {
  int lo, lo_shift, lo_mask, lo_signed;
  int hi, hi_shift, hi_mask, hi_pos, hi_word;
  int zero, codebook;
};

struct ggml_ext_scale16 {
  float scale;
  float offset;
  int offset_op;  // +1: add the offset, -1: subtract it, 0: none
};

GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_make_layout16(int lo, int lo_shift, int lo_mask, int zero) {
  const ggml_ext_layout16 l = {lo, lo_shift, lo_mask, 0, 0, 0, 0, 0, 0, zero, GGML_EXT_CODEBOOK_NONE};
  return l;
}
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_with_high16(ggml_ext_layout16 l, int hi, int hi_shift, int hi_mask,
                                                          int hi_pos) {
  l.hi = hi;
  l.hi_shift = hi_shift;
  l.hi_mask = hi_mask;
  l.hi_pos = hi_pos;
  return l;
}
GGML_EXT_FN ggml_ext_scale16 ggml_ext_make_scale16(float scale, float offset, int offset_op) {
  ggml_ext_scale16 s;
  s.scale = scale;
  s.offset = offset;
  s.offset_op = offset_op;
  return s;
}

// Q4_0, Q4_1, IQ4_NL, MXFP4: byte j of qs holds element j (low nibble) and j + 16 (high nibble).
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q4_0(int chunk) { return ggml_ext_make_layout16(2, 4 * chunk, 0xF, 8); }
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q4_1(int chunk) { return ggml_ext_make_layout16(4, 4 * chunk, 0xF, 0); }
// Q5_0/Q5_1: plus bit (16*chunk + j) of the little-endian u32 qh.
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q5_0(int chunk) {
  ggml_ext_layout16 l = ggml_ext_with_high16(ggml_ext_make_layout16(6, 4 * chunk, 0xF, 16), 2, 16 * chunk, 1, 4);
  l.hi_word = 1;
  return l;
}
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q5_1(int chunk) {
  ggml_ext_layout16 l = ggml_ext_with_high16(ggml_ext_make_layout16(8, 4 * chunk, 0xF, 0), 4, 16 * chunk, 1, 4);
  l.hi_word = 1;
  return l;
}
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q8_0(int chunk) {
  ggml_ext_layout16 l = ggml_ext_make_layout16(2 + 16 * chunk, 0, 0xFF, 0);
  l.lo_signed = 1;
  return l;
}
// Q2_K: per 128-element half h, element 32*s + l = (qs[32*h + l] >> 2*s) & 3.
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q2_k(int chunk) {
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  return ggml_ext_make_layout16(16 + 32 * h + l0, 2 * s, 3, 0);
}
// Q3_K: low 2 bits as Q2_K; the code is (low | hbit << 2) - 4, hbit = bit (element / 32) of hmask[element % 32].
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q3_k(int chunk) {
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  return ggml_ext_with_high16(ggml_ext_make_layout16(32 + 32 * h + l0, 2 * s, 3, 4), l0, chunk >> 1, 1, 2);
}
// Q4_K: sub-block sb = chunk / 2 (32 elements) sits in 64-element chunk sb / 2, low nibble for even sb.
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q4_k(int chunk) {
  const int sb = chunk >> 1, l0 = 16 * (chunk & 1);
  return ggml_ext_make_layout16(16 + 32 * (sb >> 1) + l0, 4 * (sb & 1), 0xF, 0);
}
// Q5_K: as Q4_K plus bit sb of qh[element % 32].
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q5_k(int chunk) {
  const int sb = chunk >> 1, l0 = 16 * (chunk & 1);
  return ggml_ext_with_high16(ggml_ext_make_layout16(48 + 32 * (sb >> 1) + l0, 4 * (sb & 1), 0xF, 0), 16 + l0, sb, 1, 4);
}
// Q6_K: per 128-element half h, element 32*s + l: nibble (s >> 1) of ql[64*h + l + 32*(s & 1)], two high
// bits (qh[32*h + l] >> 2*s) & 3; minus 32.
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_q6_k(int chunk) {
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  return ggml_ext_with_high16(ggml_ext_make_layout16(64 * h + l0 + 32 * (s & 1), 4 * (s >> 1), 0xF, 32),
                              128 + 32 * h + l0, 2 * s, 3, 4);
}
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_iq4_nl(int chunk) {
  ggml_ext_layout16 l = ggml_ext_make_layout16(2, 4 * chunk, 0xF, 0);
  l.codebook = GGML_EXT_CODEBOOK_IQ4NL;
  return l;
}
// IQ4_XS: sub-block ib = chunk / 2 of 32: qs[16*ib + j] holds elements 32*ib + j and 32*ib + 16 + j.
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_iq4_xs(int chunk) {
  ggml_ext_layout16 l = ggml_ext_make_layout16(8 + 16 * (chunk >> 1), 4 * (chunk & 1), 0xF, 0);
  l.codebook = GGML_EXT_CODEBOOK_IQ4NL;
  return l;
}
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_mxfp4(int chunk) {
  ggml_ext_layout16 l = ggml_ext_make_layout16(1, 4 * chunk, 0xF, 0);
  l.codebook = GGML_EXT_CODEBOOK_MXFP4;
  return l;
}

#if !defined(__METAL_VERSION__)
// The byte offsets above, checked against the structs.
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q4_1, qs) == 4, "legacy offsets");
static_assert(offsetof(block_q5_0, qh) == 2 && offsetof(block_q5_0, qs) == 6, "q5_0 offsets");
static_assert(offsetof(block_q5_1, qh) == 4 && offsetof(block_q5_1, qs) == 8, "q5_1 offsets");
static_assert(offsetof(block_q8_0, qs) == 2 && offsetof(block_q2_k, qs) == 16, "q8_0/q2_k offsets");
static_assert(offsetof(block_q3_k, hmask) == 0 && offsetof(block_q3_k, qs) == 32, "q3_k offsets");
static_assert(offsetof(block_q4_k, qs) == 16 && offsetof(block_q5_k, qh) == 16 && offsetof(block_q5_k, qs) == 48,
              "q4_k/q5_k offsets");
static_assert(offsetof(block_q6_k, ql) == 0 && offsetof(block_q6_k, qh) == 128, "q6_k offsets");
static_assert(offsetof(block_iq4_nl, qs) == 2 && offsetof(block_iq4_xs, qs) == 8 && offsetof(block_mxfp4, qs) == 1,
              "iq4/mxfp4 offsets");
#endif

// Scales and offsets per chunk, in ggml's operation order.
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q4_0(B b, int) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d), 0.0f, 0);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q4_1(B b, int) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d), GGML_EXT_HALF_TO_FLOAT(b->m), 1);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q5_0(B b, int chunk) { return ggml_ext_scale16_q4_0(b, chunk); }
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q5_1(B b, int chunk) { return ggml_ext_scale16_q4_1(b, chunk); }
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q8_0(B b, int chunk) { return ggml_ext_scale16_q4_0(b, chunk); }
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q2_k(B b, int chunk) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d) * (float)(b->scales[chunk] & 0xF),
                               GGML_EXT_HALF_TO_FLOAT(b->dmin) * (float)(b->scales[chunk] >> 4), -1);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q3_k(B b, int chunk) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_q3k_scale(b->scales, chunk), 0.0f, 0);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q4_k(B b, int chunk) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_k4_scale(b->scales, chunk >> 1),
                               GGML_EXT_HALF_TO_FLOAT(b->dmin) * (float)ggml_ext_k4_min(b->scales, chunk >> 1), -1);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q5_k(B b, int chunk) { return ggml_ext_scale16_q4_k(b, chunk); }
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_q6_k(B b, int chunk) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d) * (float)b->scales[chunk], 0.0f, 0);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_iq4_nl(B b, int chunk) { return ggml_ext_scale16_q4_0(b, chunk); }
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_iq4_xs(B b, int chunk) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_iq4xs_scale(b, chunk >> 1), 0.0f, 0);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_mxfp4(B b, int) {
  return ggml_ext_make_scale16(ggml_ext_e8m0_half_to_float(b->e), 0.0f, 0);
}

GGML_EXT_FN float ggml_ext_apply_scale16(ggml_ext_scale16 s, int code) {
  const float v = s.scale * (float)code;
  // v != v: a NaN product stays the result when the offset is NaN too (ggml's and gguf's operand order).
  return s.offset_op == 0 || v != v ? v : s.offset_op > 0 ? v + s.offset : v - s.offset;
}

GGML_EXT_FN int ggml_ext_codebook_value(int codebook, int part) {
  return codebook == GGML_EXT_CODEBOOK_IQ4NL ? ggml_ext_iq4nl_value(part) : ggml_ext_mxfp4_value(part);
}

// Byte `offset` of a block, through a pointer of the block's own address space (the project's Metal
// emulator erases address spaces, so it takes the generic reader).
#if defined(__METAL_VERSION__) && !defined(GGML_EXT_METAL_EMULATED)
template <typename T>
inline uint ggml_ext_block_byte(device const T* b, int offset) { return ((device const uchar*)b)[offset]; }
template <typename T>
inline uint ggml_ext_block_byte(threadgroup const T* b, int offset) { return ((threadgroup const uchar*)b)[offset]; }
template <typename T>
inline uint ggml_ext_block_byte(thread const T* b, int offset) { return ((thread const uchar*)b)[offset]; }
#else
template <typename B>
GGML_EXT_FN uint32_t ggml_ext_block_byte(B b, int offset) { return ((const uint8_t*)b)[offset]; }
#endif

// The element codes and values of one chunk, one element at a time (the reference; kernels vectorize it).
template <typename B>
GGML_EXT_FN int ggml_ext_code16(B b, ggml_ext_layout16 l, int j) {
  int part = (int)((ggml_ext_block_byte(b, l.lo + j) >> l.lo_shift) & (uint32_t)l.lo_mask);
  if (l.lo_signed) part = (int)(int8_t)(uint8_t)part;
  if (l.hi_word) {
    const uint32_t word = ggml_ext_block_byte(b, l.hi) | (ggml_ext_block_byte(b, l.hi + 1) << 8) |
                          (ggml_ext_block_byte(b, l.hi + 2) << 16) | (ggml_ext_block_byte(b, l.hi + 3) << 24);
    part |= (int)((word >> (l.hi_shift + j)) & 1u) << l.hi_pos;
  } else if (l.hi_mask) {
    part |= (int)((ggml_ext_block_byte(b, l.hi + j) >> l.hi_shift) & (uint32_t)l.hi_mask) << l.hi_pos;
  }
  return l.codebook != GGML_EXT_CODEBOOK_NONE ? ggml_ext_codebook_value(l.codebook, part) : part - l.zero;
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_layout(B b, ggml_ext_layout16 l, ggml_ext_scale16 s, Y y) {
  for (int j = 0; j < 16; ++j) y[j] = ggml_ext_apply_scale16(s, ggml_ext_code16(b, l, j));
}

// ---------------------------------------------------------------------------------------------------
// Reference decoders: elements [16*chunk, 16*chunk + 16) of one block.
// ---------------------------------------------------------------------------------------------------
#define GGML_EXT_DEFINE_DEQUANT16(NAME, name, id, qk, bytes)                                   \
  template <typename B, typename Y>                                                            \
  GGML_EXT_FN void ggml_ext_dequant16_##name(B b, int chunk, Y y) {                            \
    ggml_ext_dequant16_layout(b, ggml_ext_layout16_##name(chunk), ggml_ext_scale16_##name(b, chunk), y); \
  }
GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_DEFINE_DEQUANT16)
#undef GGML_EXT_DEFINE_DEQUANT16

#include "iq_decoders.h"
