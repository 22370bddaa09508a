// ggml's quantized block formats, defined once for every backend.
//
// This header is included by the CPU kernels (C++), the CUDA kernels (nvcc) and the Metal kernels (MSL,
// and the project's Metal emulator). It holds: the type ids, the block structs (little-endian, fields in
// ggml's order, sizes checked), the small decoding helpers (scales, nibble lookups) and one reference
// decoder per type, `ggml_ext_dequant16_<type>(block, chunk, out)`, writing the 16 consecutive elements
// [16*chunk, 16*chunk + 16) of a block as float. Fast kernels may decode differently, but must produce
// the values these decoders define.
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
#define GGML_EXT_HALF_TO_FLOAT(h) float(as_type<half>(ushort(h)))
#elif defined(__CUDACC__)
#include <stdint.h>
#include <cuda_fp16.h>
#include "fp16.h"
#define GGML_EXT_FN __host__ __device__ inline
#else
#include <stdint.h>
#include "fp16.h"
#define GGML_EXT_FN inline
#define GGML_EXT_HALF_TO_FLOAT(h) ggml_ext_fp16_to_fp32(h)
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

// ggml type ids, as stored in GGUF files.
enum ggml_ext_type_id {
  GGML_EXT_TYPE_F32 = 0,
  GGML_EXT_TYPE_F16 = 1,
  GGML_EXT_TYPE_Q4_0 = 2,
  GGML_EXT_TYPE_Q4_1 = 3,
  GGML_EXT_TYPE_Q5_0 = 6,
  GGML_EXT_TYPE_Q5_1 = 7,
  GGML_EXT_TYPE_Q8_0 = 8,
  GGML_EXT_TYPE_Q2_K = 10,
  GGML_EXT_TYPE_Q3_K = 11,
  GGML_EXT_TYPE_Q4_K = 12,
  GGML_EXT_TYPE_Q5_K = 13,
  GGML_EXT_TYPE_Q6_K = 14,
  GGML_EXT_TYPE_IQ4_NL = 20,
  GGML_EXT_TYPE_IQ4_XS = 23,
  GGML_EXT_TYPE_BF16 = 30,
  GGML_EXT_TYPE_MXFP4 = 39,
};

#define GGML_EXT_QK32 32   // legacy types, IQ4_NL, MXFP4
#define GGML_EXT_QK_K 256  // K-quants, IQ4_XS

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

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(block_q2_k) == 84, "block_q2_k size");
static_assert(sizeof(block_q3_k) == 110, "block_q3_k size");
static_assert(sizeof(block_q4_k) == 144, "block_q4_k size");
static_assert(sizeof(block_q5_k) == 176, "block_q5_k size");
static_assert(sizeof(block_q6_k) == 210, "block_q6_k size");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");

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
// Reference decoders: elements [16*chunk, 16*chunk + 16) of one block.
// chunk is 0..1 for 32-element blocks and 0..15 for 256-element blocks.
// ---------------------------------------------------------------------------------------------------
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q4_0(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  for (int j = 0; j < 16; ++j) y[j] = d * (float)(((b->qs[j] >> (4 * chunk)) & 0xF) - 8);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q4_1(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  const float m = GGML_EXT_HALF_TO_FLOAT(b->m);
  for (int j = 0; j < 16; ++j) y[j] = d * (float)((b->qs[j] >> (4 * chunk)) & 0xF) + m;
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q5_0(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  const uint32_t qh = ggml_ext_q5_high_bits(b);
  for (int j = 0; j < 16; ++j) {
    const int e = 16 * chunk + j;
    const int q = ((b->qs[j] >> (4 * chunk)) & 0xF) | (int)(((qh >> e) & 1u) << 4);
    y[j] = d * (float)(q - 16);
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q5_1(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  const float m = GGML_EXT_HALF_TO_FLOAT(b->m);
  const uint32_t qh = ggml_ext_q5_high_bits(b);
  for (int j = 0; j < 16; ++j) {
    const int e = 16 * chunk + j;
    const int q = ((b->qs[j] >> (4 * chunk)) & 0xF) | (int)(((qh >> e) & 1u) << 4);
    y[j] = d * (float)q + m;
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q8_0(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  for (int j = 0; j < 16; ++j) y[j] = (float)b->qs[16 * chunk + j] * d;
}

// Q2_K: element 128*h + 32*s + l = (qs[32*h + l] >> 2*s) & 3; sub-block of 16 = element / 16.
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q2_k(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  const float dmin = GGML_EXT_HALF_TO_FLOAT(b->dmin);
  const float dl = d * (float)(b->scales[chunk] & 0xF);
  const float ml = dmin * (float)(b->scales[chunk] >> 4);
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  for (int j = 0; j < 16; ++j) y[j] = dl * (float)((b->qs[32 * h + l0 + j] >> (2 * s)) & 3) - ml;
}

// Q3_K: low 2 bits as Q2_K; minus 4 where the hmask bit is clear.
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q3_k(B b, int chunk, Y y) {
  const float dl = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_q3k_scale(b->scales, chunk);
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  const int hbit = chunk >> 1;  // element 32*hbit + l, l in [0, 32)
  for (int j = 0; j < 16; ++j) {
    const int low = (b->qs[32 * h + l0 + j] >> (2 * s)) & 3;
    const int high = (b->hmask[l0 + j] >> hbit) & 1;
    y[j] = dl * (float)(low - (high ? 0 : 4));
  }
}

// Q4_K: sub-block sb (32 elements) = chunk / 2; chunk c = sb / 2 of 64; low nibble for even sb.
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q4_k(B b, int chunk, Y y) {
  const int sb = chunk >> 1, c = sb >> 1, l0 = 16 * (chunk & 1);
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_k4_scale(b->scales, sb);
  const float m = GGML_EXT_HALF_TO_FLOAT(b->dmin) * (float)ggml_ext_k4_min(b->scales, sb);
  for (int j = 0; j < 16; ++j) y[j] = d * (float)((b->qs[32 * c + l0 + j] >> (4 * (sb & 1))) & 0xF) - m;
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q5_k(B b, int chunk, Y y) {
  const int sb = chunk >> 1, c = sb >> 1, l0 = 16 * (chunk & 1);
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_k4_scale(b->scales, sb);
  const float m = GGML_EXT_HALF_TO_FLOAT(b->dmin) * (float)ggml_ext_k4_min(b->scales, sb);
  for (int j = 0; j < 16; ++j) {
    const int q = ((b->qs[32 * c + l0 + j] >> (4 * (sb & 1))) & 0xF) | (((b->qh[l0 + j] >> sb) & 1) << 4);
    y[j] = d * (float)q - m;
  }
}

// Q6_K: per 128-element half h, element 32*s + l (s = 0..3) = low nibble of ql[64*h + l + 32*(s&1)]
// (high nibble for s >= 2) | two bits (qh[32*h + l] >> 2*s) & 3, minus 32.
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_q6_k(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)b->scales[chunk];
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  for (int j = 0; j < 16; ++j) {
    const int l = l0 + j;
    const int low = (b->ql[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF;
    const int high = (b->qh[32 * h + l] >> (2 * s)) & 3;
    y[j] = d * (float)((low | (high << 4)) - 32);
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq4_nl(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  for (int j = 0; j < 16; ++j) y[j] = d * (float)ggml_ext_iq4nl_value((b->qs[j] >> (4 * chunk)) & 0xF);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq4_xs(B b, int chunk, Y y) {
  const int ib = chunk >> 1;
  const float dl = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)ggml_ext_iq4xs_scale(b, ib);
  for (int j = 0; j < 16; ++j)
    y[j] = dl * (float)ggml_ext_iq4nl_value((b->qs[16 * ib + j] >> (4 * (chunk & 1))) & 0xF);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_mxfp4(B b, int chunk, Y y) {
  const float d = ggml_ext_e8m0_half_to_float(b->e);
  for (int j = 0; j < 16; ++j) y[j] = d * (float)ggml_ext_mxfp4_value((b->qs[j] >> (4 * chunk)) & 0xF);
}
