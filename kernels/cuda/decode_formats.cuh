// The decode kernels' view of each ggml format (matmul_decode_plans.cuh): 32 consecutive elements of a weight row
// (an "x-block": the span of one int8 scale of the quantized activations) as 32 int8 codes in 8 words, in
// x's element order, plus what turns their integer dot with x's codes into a float.
//
// The weight rows are read as raw bytes, from global memory when they are 4-byte aligned, else staged in shared
// memory (ggml blocks are only 2-byte aligned, MXFP4's 1-byte), so every field is read as aligned 32-bit words
// joined by funnel shifts (sh_words). The block
// structs, field offsets and the scale/min/codebook helpers are those of kernels/common/ggml_blocks.h; the
// offsets used below are checked against the structs with offsetof.
//
// A sub-block's contribution to y for one row of x (dx: x's scale, s0/s1: the sums of x's codes over the
// two 16-element halves, i0/i1: the integer dots of the halves):
//   a * dx * (ia0 * (i0 - kZero * s0) + ia1 * (i1 - kZero * s1))      (kPerHalf; else ia = 1 and one dot)
//   + b * dx * (s0 + s1)                                                (kOffset == 1: a per-32 offset)
//   + b * dx * (ib0 * s0 + ib1 * s1)                                    (kOffset == 2: per-16 mins, Q2_K)
// Everything inside the parentheses is exact integer arithmetic; only the scales are float.
#pragma once
#include <cstddef>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda::decode {

// ------------------------------------------------------------------------------------------------ reading

// N little-endian words starting at byte `offset` (any alignment) of a buffer `base` (4-byte aligned, shared or
// global): the N aligned words that hold them, plus the next one when `offset` is unaligned (so a buffer whose
// length is a multiple of 4 is never read past its end).
template <int N>
__device__ __forceinline__ void sh_words(const uint8_t* base, int offset, uint32_t (&out)[N]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(base + (offset & ~3));
  const unsigned shift = 8u * static_cast<unsigned>(offset & 3);
  uint32_t prev = w[0];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t next = (i + 1 < N || shift != 0) ? w[i + 1] : 0u;
    out[i] = __funnelshift_r(prev, next, shift);  // shift 0: prev
    prev = next;
  }
}

// As sh_words, with 16-byte loads where base + offset is 16-byte aligned (the fields of Q4_K/Q5_K blocks, whose
// sizes are multiples of 16, in rows whose base is): a quarter of the load instructions.
template <int N>
__device__ __forceinline__ void words(const uint8_t* base, int offset, uint32_t (&out)[N]) {
  static_assert(N % 4 == 0, "whole 16-byte words");
  if ((reinterpret_cast<uintptr_t>(base + offset) & 15u) != 0) {
    sh_words(base, offset, out);
    return;
  }
  const uint4* p = reinterpret_cast<const uint4*>(base + offset);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint4 v = p[i];
    out[4 * i] = v.x;
    out[4 * i + 1] = v.y;
    out[4 * i + 2] = v.z;
    out[4 * i + 3] = v.w;
  }
}

__device__ __forceinline__ uint32_t sh_u16(const uint8_t* base, int offset) {  // offset even
  return *reinterpret_cast<const uint16_t*>(base + offset);
}

__device__ __forceinline__ float half_bits(uint32_t h) { return GGML_EXT_HALF_TO_FLOAT(static_cast<uint16_t>(h)); }

// Indexable view of packed little-endian bytes (for ggml_blocks.h's scale helpers, which index q[j]).
template <int N>
struct PackedBytes {
  uint32_t w[N];
  __device__ __forceinline__ uint32_t operator[](int j) const {
    uint32_t word = w[0];
#pragma unroll
    for (int i = 1; i < N; ++i) word = (j >> 2) == i ? w[i] : word;  // selects, no local memory
    return (word >> (8 * (j & 3))) & 0xFFu;
  }
};

// Bit b of each byte of v spread to bit 0 of four bytes: bits 0..3 of v -> bytes 0..3 (the four shifted
// copies of a 4-bit value do not overlap, so the product has no carries).
__device__ __forceinline__ uint32_t spread4(uint32_t v) { return ((v & 0xFu) * 0x00204081u) & 0x01010101u; }

// The 16-entry int8 codebook of ggml_blocks.h (IQ4_NL, MXFP4) as 4 words, built once per thread from the
// shared lookup so the table lives in one place.
struct Codebook {
  uint32_t t[4];
  __device__ explicit Codebook(int codebook) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        word |= (static_cast<uint32_t>(ggml_ext_codebook_value(codebook, 4 * i + j)) & 0xFFu) << (8 * j);
      t[i] = word;
    }
  }
  // Four indices (bytes 0..15) to their four int8 values: two byte permutes of 8 entries, then a per-byte
  // choice by bit 3 of the index.
  __device__ __forceinline__ uint32_t lookup(uint32_t idx) const {
    const uint32_t packed = idx | (idx >> 4);                    // byte 0: i0 | i1 << 4, byte 2: i2 | i3 << 4
    const uint32_t sel = __byte_perm(packed, 0u, 0x0020u) & 0x7777u;  // 4 selectors of 3 bits (no sign mode)
    const uint32_t lo = __byte_perm(t[0], t[1], sel), hi = __byte_perm(t[2], t[3], sel);
    const uint32_t upper = ((idx >> 3) & 0x01010101u) * 0xFFu;
    return (hi & upper) | (lo & ~upper);
  }
};

// ------------------------------------------------------------------------------------------------ formats

// The scales of one x-block of one weight row (a, b, and the per-16 integer scales ia/ib of the formula above).
struct SubScales {
  float a = 0.0f, b = 0.0f;
  int ia0 = 1, ia1 = 1, ib0 = 1, ib1 = 1;
};

// What one lane holds for one x-block of one weight row.
struct Sub : SubScales {
  uint32_t q[8];  // 32 codes (int8 lanes; unsigned codes below 128 where kZero != 0)
};

struct NoContext {
  __device__ NoContext() {}
};

// Plain codes: a nibble is its code.
struct Identity {
  __device__ __forceinline__ uint32_t lookup(uint32_t idx) const { return idx; }
};

// The 32 nibbles of 16 bytes at `offset` (byte j: element j low, element 16 + j high) as codes through `map`.
template <class Map>
__device__ __forceinline__ void load_nibbles(const uint8_t* seg, int offset, const Map& map, Sub& s) {
  uint32_t q[4];
  sh_words(seg, offset, q);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s.q[i] = map.lookup(q[i] & 0x0F0F0F0Fu);             // elements 4i..4i+3: low nibbles
    s.q[4 + i] = map.lookup((q[i] >> 4) & 0x0F0F0F0Fu);  // elements 16+4i..: high nibbles
  }
}

// What one lane holds for the tensor-core decode (the fragment kernels of matmul_decode_tensor_cores.cuh): of one
// x-block of one row,
// the codes of elements 4t..4t+3 (lo) and 16+4t..16+4t+3 (hi), lane t's A-fragment words of an m16n8k32
// product (or of two m16n8k16 products, one per half, where kPerHalf), with the x-block's scales as in Sub. In
// every format those 8 codes lie in one word of each field (a nibble field's byte j holds elements j and 16 + j;
// a byte or bit-plane field's words t and 4 + t), so each of a row's four lanes reads only its quarter of the
// x-block.
struct Frag : SubScales {
  uint32_t lo, hi;
};

__device__ __forceinline__ uint32_t sh_word(const uint8_t* base, int offset) {
  uint32_t w[1];
  sh_words(base, offset, w);
  return w[0];
}

// Lane t's codes of 16 nibble bytes at `offset` (see load_nibbles): bytes 4t..4t+3, low nibbles then high,
// through `map`.
template <class Map>
__device__ __forceinline__ void nibble_frag(const uint8_t* row, int offset, int t, const Map& map, Frag& f) {
  const uint32_t q = sh_word(row, offset + 4 * t);
  f.lo = map.lookup(q & 0x0F0F0F0Fu);
  f.hi = map.lookup((q >> 4) & 0x0F0F0F0Fu);
}

// Each format: Block, kQK, kBytes, kPerHalf, kZero, kOffset, Context, and
//   load(ctx, seg, g, sub): x-block g of a staged segment that starts at a block boundary;
//   fragment(ctx, row, g, t, frag): lane t's quarter of x-block g of a 4-byte aligned row, or of a staged chunk
//   (Frag); the formats with a scale per 16 (Q2_K, Q3_K, Q6_K) have only fragment_group (below), read from staged
//   chunks only.
// 32-element blocks: x-block g is block g. 256-element blocks: block g / 8, sub-block g % 8.
// Formats whose consecutive x-blocks share bytes also have kGroup and
//   load_group(ctx, seg, p, subs): x-blocks kGroup * p .. kGroup * p + kGroup - 1, each shared byte read once.

struct FmtQ4_0 {
  using Block = block_q4_0;
  using Context = NoContext;
  static constexpr int kQK = 32, kZero = 8, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_nibbles(seg, o + offsetof(Block, qs), Identity{}, s);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    nibble_frag(row, o + offsetof(Block, qs), t, Identity{}, f);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
  }
};

struct FmtQ4_1 {
  using Block = block_q4_1;
  using Context = NoContext;
  static constexpr int kQK = 32, kZero = 0, kOffset = 1;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_nibbles(seg, o + offsetof(Block, qs), Identity{}, s);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
    s.b = half_bits(sh_u16(seg, o + offsetof(Block, m)));  // + m per element
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    nibble_frag(row, o + offsetof(Block, qs), t, Identity{}, f);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
    f.b = half_bits(sh_u16(row, o + offsetof(Block, m)));
  }
};

// Q5_0/Q5_1: bit j of the little-endian qh word is the 5th bit of element j.
template <typename Block>
__device__ __forceinline__ void load_q5_codes(const uint8_t* seg, int o, Sub& s) {
  uint32_t q[4], h[1];
  sh_words(seg, o + offsetof(Block, qs), q);
  sh_words(seg, o + offsetof(Block, qh), h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s.q[i] = (q[i] & 0x0F0F0F0Fu) | (spread4(h[0] >> (4 * i)) << 4);
    s.q[4 + i] = ((q[i] >> 4) & 0x0F0F0F0Fu) | (spread4(h[0] >> (16 + 4 * i)) << 4);
  }
}

template <typename Block>
__device__ __forceinline__ void q5_frag(const uint8_t* row, int o, int t, Frag& f) {
  const uint32_t q = sh_word(row, o + offsetof(Block, qs) + 4 * t), h = sh_word(row, o + offsetof(Block, qh));
  f.lo = (q & 0x0F0F0F0Fu) | (spread4(h >> (4 * t)) << 4);
  f.hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(h >> (16 + 4 * t)) << 4);
}

struct FmtQ5_0 {
  using Block = block_q5_0;
  using Context = NoContext;
  static constexpr int kQK = 32, kZero = 16, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_q5_codes<Block>(seg, o, s);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    q5_frag<Block>(row, o, t, f);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
  }
};

struct FmtQ5_1 {
  using Block = block_q5_1;
  using Context = NoContext;
  static constexpr int kQK = 32, kZero = 0, kOffset = 1;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_q5_codes<Block>(seg, o, s);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
    s.b = half_bits(sh_u16(seg, o + offsetof(Block, m)));
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    q5_frag<Block>(row, o, t, f);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
    f.b = half_bits(sh_u16(row, o + offsetof(Block, m)));
  }
};

struct FmtQ8_0 {
  using Block = block_q8_0;
  using Context = NoContext;
  static constexpr int kQK = 32, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    sh_words(seg, o + offsetof(Block, qs), s.q);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    f.lo = sh_word(row, o + offsetof(Block, qs) + 4 * t);
    f.hi = sh_word(row, o + offsetof(Block, qs) + 16 + 4 * t);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
  }
};

struct FmtIQ4_NL {
  using Block = block_iq4_nl;
  struct Context : Codebook {
    __device__ Context() : Codebook(GGML_EXT_CODEBOOK_IQ4NL) {}
  };
  static constexpr int kQK = 32, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context& c, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_nibbles(seg, o + offsetof(Block, qs), c, s);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  __device__ static void fragment(const Context& c, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    nibble_frag(row, o + offsetof(Block, qs), t, c, f);
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
  }
};

// MXFP4: doubled E2M1 codes with half the E8M0 scale (ggml's own pairing); 17-byte blocks, any alignment.
struct FmtMXFP4 {
  using Block = block_mxfp4;
  struct Context : Codebook {
    __device__ Context() : Codebook(GGML_EXT_CODEBOOK_MXFP4) {}
  };
  static constexpr int kQK = 32, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context& c, const uint8_t* seg, int g, Sub& s) {
    const int o = g * static_cast<int>(sizeof(Block));
    load_nibbles(seg, o + offsetof(Block, qs), c, s);
    s.a = ggml_ext_e8m0_half_to_float(seg[o + offsetof(Block, e)]);
  }
  __device__ static void fragment(const Context& c, const uint8_t* row, int g, int t, Frag& f) {
    const int o = g * static_cast<int>(sizeof(Block));
    nibble_frag(row, o + offsetof(Block, qs), t, c, f);
    f.a = ggml_ext_e8m0_half_to_float(row[o + offsetof(Block, e)]);
  }
};

// Q4_K/Q5_K: sub-block sb (32 elements) is nibble sb & 1 of the 32 bytes qs[32 * (sb / 2) ...]; scale d * sc,
// min dmin * m (subtracted). Sub-blocks 2j and 2j + 1 share those 32 bytes and the 16-byte header {d, dmin,
// scales}: the direct kernel's lanes take them as a pair (kGroup), reading both once.
template <typename Block>
__device__ __forceinline__ void load_k4_head(const uint8_t* seg, int o, uint32_t (&head)[4]) {
  static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2 && offsetof(Block, scales) == 4,
                "d, dmin and the 12 scale bytes are the block's first 16 bytes");
  words(seg, o, head);
}

template <class S>  // Sub or Frag
__device__ __forceinline__ void k4_scales(const uint32_t (&head)[4], int sb, S& s) {
  const unsigned shift = 8u * static_cast<unsigned>(sb & 3);
  const uint32_t sc = (ggml_ext_k4_scales4(head[1], head[3], sb >> 2) >> shift) & 0xFFu;
  const uint32_t mn = (ggml_ext_k4_mins4(head[2], head[3], sb >> 2) >> shift) & 0xFFu;
  s.a = half_bits(head[0] & 0xFFFFu) * static_cast<float>(sc);
  s.b = -(half_bits(head[0] >> 16) * static_cast<float>(mn));
}

// Codes of sub-block sb from its 32 qs bytes (and, for Q5_K, the 32 qh bytes: bit sb of qh[l] is the 5th bit
// of element l).
__device__ __forceinline__ void k4_codes(const uint32_t (&q)[8], int sb, Sub& s) {
#pragma unroll
  for (int i = 0; i < 8; ++i) s.q[i] = (q[i] >> (4 * (sb & 1))) & 0x0F0F0F0Fu;
}
__device__ __forceinline__ void k5_codes(const uint32_t (&q)[8], const uint32_t (&h)[8], int sb, Sub& s) {
  k4_codes(q, sb, s);
#pragma unroll
  for (int i = 0; i < 8; ++i) s.q[i] |= ((h[i] >> sb) & 0x01010101u) << 4;
}

struct FmtQ4_K {
  using Block = block_q4_k;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 1, kGroup = 2;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t q[8], head[4];
    words(seg, o + offsetof(Block, qs) + 32 * (sb >> 1), q);
    load_k4_head<Block>(seg, o, head);
    k4_codes(q, sb, s);
    k4_scales(head, sb, s);
  }
  // x-blocks 2 pair and 2 pair + 1.
  __device__ static void load_group(const Context&, const uint8_t* seg, int pair, Sub (&s)[kGroup]) {
    const int j = pair & 3, o = (pair >> 2) * static_cast<int>(sizeof(Block));
    uint32_t q[8], head[4];
    words(seg, o + offsetof(Block, qs) + 32 * j, q);
    load_k4_head<Block>(seg, o, head);
#pragma unroll
    for (int t = 0; t < kGroup; ++t) {
      k4_codes(q, 2 * j + t, s[t]);
      k4_scales(head, 2 * j + t, s[t]);
    }
  }
  // Sub-block sb's 32 qs bytes at 32 * (sb / 2): words t and 4 + t, nibble sb & 1.
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int q = o + offsetof(Block, qs) + 32 * (sb >> 1) + 4 * t;
    const unsigned shift = 4u * static_cast<unsigned>(sb & 1);
    uint32_t head[4];
    load_k4_head<Block>(row, o, head);
    f.lo = (sh_word(row, q) >> shift) & 0x0F0F0F0Fu;
    f.hi = (sh_word(row, q + 16) >> shift) & 0x0F0F0F0Fu;
    k4_scales(head, sb, f);
  }
};

struct FmtQ5_K {
  using Block = block_q5_k;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 1, kGroup = 2;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t q[8], h[8], head[4];
    words(seg, o + offsetof(Block, qs) + 32 * (sb >> 1), q);
    words(seg, o + offsetof(Block, qh), h);
    load_k4_head<Block>(seg, o, head);
    k5_codes(q, h, sb, s);
    k4_scales(head, sb, s);
  }
  __device__ static void load_group(const Context&, const uint8_t* seg, int pair, Sub (&s)[kGroup]) {
    const int j = pair & 3, o = (pair >> 2) * static_cast<int>(sizeof(Block));
    uint32_t q[8], h[8], head[4];
    words(seg, o + offsetof(Block, qs) + 32 * j, q);
    words(seg, o + offsetof(Block, qh), h);
    load_k4_head<Block>(seg, o, head);
#pragma unroll
    for (int t = 0; t < kGroup; ++t) {
      k5_codes(q, h, 2 * j + t, s[t]);
      k4_scales(head, 2 * j + t, s[t]);
    }
  }
  __device__ static void fragment(const Context&, const uint8_t* row, int g, int t, Frag& f) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int q = o + offsetof(Block, qs) + 32 * (sb >> 1) + 4 * t, h = o + offsetof(Block, qh) + 4 * t;
    const unsigned shift = 4u * static_cast<unsigned>(sb & 1);
    uint32_t head[4];
    load_k4_head<Block>(row, o, head);
    f.lo = ((sh_word(row, q) >> shift) & 0x0F0F0F0Fu) | (((sh_word(row, h) >> sb) & 0x01010101u) << 4);
    f.hi = ((sh_word(row, q + 16) >> shift) & 0x0F0F0F0Fu) | (((sh_word(row, h + 16) >> sb) & 0x01010101u) << 4);
    k4_scales(head, sb, f);
  }
};

// Q6_K: in half h = sb / 4, sub-block s = sb % 4: nibble (s / 2) of ql[64h + 32(s & 1) + l], bits 2s of
// qh[32h + l]; minus 32; a signed int8 scale per 16 elements.
struct FmtQ6_K {
  using Block = block_q6_k;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 32, kOffset = 0;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int h = sb >> 2, sub = sb & 3;
    uint32_t hi[8];
    sh_words(seg, o + offsetof(Block, ql) + 64 * h + 32 * (sub & 1), s.q);
    sh_words(seg, o + offsetof(Block, qh) + 32 * h, hi);
    const int lo_shift = 4 * (sub >> 1), hi_shift = 2 * sub;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      s.q[i] = ((s.q[i] >> lo_shift) & 0x0F0F0F0Fu) | (((hi[i] >> hi_shift) & 0x03030303u) << 4);
    const uint32_t sc = sh_u16(seg, o + offsetof(Block, scales) + 2 * sb);  // the chunks 2sb, 2sb + 1
    s.ia0 = static_cast<int8_t>(sc & 0xFFu);
    s.ia1 = static_cast<int8_t>(sc >> 8);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  // x-blocks 4q .. 4q + 3 (half h = q & 1 of block q / 2): each ql and qh word and the scales read once.
  static constexpr int kFragGroup = 4;
  __device__ static void fragment_group(const Context&, const uint8_t* row, int q, int t, Frag (&f)[kFragGroup]) {
    const int h = q & 1, o = (q >> 1) * static_cast<int>(sizeof(Block));
    const int ql = o + offsetof(Block, ql) + 64 * h + 4 * t, qh = o + offsetof(Block, qh) + 32 * h + 4 * t;
    const uint32_t lows[4] = {sh_word(row, ql), sh_word(row, ql + 16), sh_word(row, ql + 32), sh_word(row, ql + 48)};
    const uint32_t high_lo = sh_word(row, qh), high_hi = sh_word(row, qh + 16);
    uint32_t sc[2];  // the int8 scales of chunks 8h .. 8h + 7
    sh_words(row, o + offsetof(Block, scales) + 8 * h, sc);
    const float d = half_bits(sh_u16(row, o + offsetof(Block, d)));
#pragma unroll
    for (int sub = 0; sub < 4; ++sub) {
      const unsigned lo_shift = 4u * (sub >> 1), hi_shift = 2u * sub;
      f[sub].lo = ((lows[2 * (sub & 1)] >> lo_shift) & 0x0F0F0F0Fu) | (((high_lo >> hi_shift) & 0x03030303u) << 4);
      f[sub].hi = ((lows[2 * (sub & 1) + 1] >> lo_shift) & 0x0F0F0F0Fu) | (((high_hi >> hi_shift) & 0x03030303u) << 4);
      const uint32_t pair = sc[sub >> 1] >> (16 * (sub & 1));
      f[sub].ia0 = static_cast<int8_t>(pair & 0xFFu);
      f[sub].ia1 = static_cast<int8_t>((pair >> 8) & 0xFFu);
      f[sub].a = d;
    }
  }
};

// Q3_K: low 2 bits as Q2_K, the third from bit sb of hmask[l]; minus 4; a signed 6-bit scale per 16.
struct FmtQ3_K {
  using Block = block_q3_k;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 4, kOffset = 0;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int h = sb >> 2, shift = 2 * (sb & 3);
    uint32_t m[8];
    PackedBytes<3> sc;
    sh_words(seg, o + offsetof(Block, qs) + 32 * h, s.q);
    sh_words(seg, o + offsetof(Block, hmask), m);
    sh_words(seg, o + offsetof(Block, scales), sc.w);
#pragma unroll
    for (int i = 0; i < 8; ++i) s.q[i] = ((s.q[i] >> shift) & 0x03030303u) | (((m[i] >> sb) & 0x01010101u) << 2);
    s.ia0 = ggml_ext_q3k_scale(sc, 2 * sb);
    s.ia1 = ggml_ext_q3k_scale(sc, 2 * sb + 1);
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
  // x-blocks 4q .. 4q + 3 (half h = q & 1 of block q / 2): their shared qs and hmask words and the scales read once.
  static constexpr int kFragGroup = 4;
  __device__ static void fragment_group(const Context&, const uint8_t* row, int q, int t, Frag (&f)[kFragGroup]) {
    const int h = q & 1, o = (q >> 1) * static_cast<int>(sizeof(Block));
    const int qs = o + offsetof(Block, qs) + 32 * h + 4 * t, m = o + offsetof(Block, hmask) + 4 * t;
    const uint32_t q_lo = sh_word(row, qs), q_hi = sh_word(row, qs + 16);
    const uint32_t m_lo = sh_word(row, m), m_hi = sh_word(row, m + 16);
    PackedBytes<3> sc;
    sh_words(row, o + offsetof(Block, scales), sc.w);
    const float d = half_bits(sh_u16(row, o + offsetof(Block, d)));
#pragma unroll
    for (int sub = 0; sub < 4; ++sub) {
      const int sb = 4 * h + sub;
      const unsigned shift = 2u * sub;
      f[sub].lo = ((q_lo >> shift) & 0x03030303u) | (((m_lo >> sb) & 0x01010101u) << 2);
      f[sub].hi = ((q_hi >> shift) & 0x03030303u) | (((m_hi >> sb) & 0x01010101u) << 2);
      f[sub].ia0 = ggml_ext_q3k_scale(sc, 2 * sb);
      f[sub].ia1 = ggml_ext_q3k_scale(sc, 2 * sb + 1);
      f[sub].a = d;
    }
  }
};

// Q2_K: (qs[32h + l] >> 2s) & 3 in half h = sb / 4, s = sb % 4; per 16 elements a 4-bit scale and min.
struct FmtQ2_K {
  using Block = block_q2_k;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 2;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int shift = 2 * (sb & 3);
    sh_words(seg, o + offsetof(Block, qs) + 32 * (sb >> 2), s.q);
#pragma unroll
    for (int i = 0; i < 8; ++i) s.q[i] = (s.q[i] >> shift) & 0x03030303u;
    q2_scales(seg, o, sb, s);
  }
  // x-blocks 4q .. 4q + 3 (half h = q & 1 of block q / 2): their shared qs words read once.
  static constexpr int kFragGroup = 4;
  __device__ static void fragment_group(const Context&, const uint8_t* row, int q, int t, Frag (&f)[kFragGroup]) {
    const int h = q & 1, o = (q >> 1) * static_cast<int>(sizeof(Block));
    const int qs = o + offsetof(Block, qs) + 32 * h + 4 * t;
    const uint32_t q_lo = sh_word(row, qs), q_hi = sh_word(row, qs + 16);
#pragma unroll
    for (int sub = 0; sub < 4; ++sub) {
      const unsigned shift = 2u * sub;
      f[sub].lo = (q_lo >> shift) & 0x03030303u;
      f[sub].hi = (q_hi >> shift) & 0x03030303u;
      q2_scales(row, o, 4 * h + sub, f[sub]);
    }
  }
  // Sub-block sb's two 4-bit scales and mins (the chunks 2sb, 2sb + 1), d and -dmin.
  __device__ static void q2_scales(const uint8_t* row, int o, int sb, SubScales& s) {
    const uint32_t sc = sh_u16(row, o + offsetof(Block, scales) + 2 * sb);
    s.ia0 = static_cast<int>(sc & 0xFu);
    s.ib0 = static_cast<int>((sc >> 4) & 0xFu);
    s.ia1 = static_cast<int>((sc >> 8) & 0xFu);
    s.ib1 = static_cast<int>((sc >> 12) & 0xFu);
    s.a = half_bits(sh_u16(row, o + offsetof(Block, d)));
    s.b = -half_bits(sh_u16(row, o + offsetof(Block, dmin)));
  }
};

// IQ4_XS: sub-block ib: qs[16 ib + j] holds elements j (low nibble) and 16 + j (high); scale d * (ls - 32).
struct FmtIQ4_XS {
  using Block = block_iq4_xs;
  struct Context : Codebook {
    __device__ Context() : Codebook(GGML_EXT_CODEBOOK_IQ4NL) {}
  };
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  struct Scales {  // the fields ggml_ext_iq4xs_scale reads
    uint32_t scales_h;
    PackedBytes<1> scales_l;
  };
  __device__ static void load(const Context& c, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    Scales sc;
    load_nibbles(seg, o + offsetof(Block, qs) + 16 * sb, c, s);
    sh_words(seg, o + offsetof(Block, scales_l), sc.scales_l.w);
    sc.scales_h = sh_u16(seg, o + offsetof(Block, scales_h));
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d))) * static_cast<float>(ggml_ext_iq4xs_scale(&sc, sb));
  }
  __device__ static void fragment(const Context& c, const uint8_t* row, int g, int t, Frag& f) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    Scales sc;
    nibble_frag(row, o + offsetof(Block, qs) + 16 * sb, t, c, f);
    sh_words(row, o + offsetof(Block, scales_l), sc.scales_l.w);
    sc.scales_h = sh_u16(row, o + offsetof(Block, scales_h));
    f.a = half_bits(sh_u16(row, o + offsetof(Block, d))) * static_cast<float>(ggml_ext_iq4xs_scale(&sc, sb));
  }
};

// kGroup of a format, 1 where it has none.
template <class F>
constexpr int group_of() {
  if constexpr (requires { F::kGroup; }) {
    return F::kGroup;
  } else {
    return 1;
  }
}

// kFragGroup of a format (fragment_group: kFragGroup x-blocks' fragments at once, shared words read once), else 1.
template <class F>
constexpr int fragment_group_of() {
  if constexpr (requires { F::kFragGroup; }) {
    return F::kFragGroup;
  } else {
    return 1;
  }
}

// Lane t's fragments of x-blocks kG * q .. kG * q + kG - 1 (kG: 1 or the format's kFragGroup).
template <class F, int kG>
__device__ __forceinline__ void load_fragments(const typename F::Context& ctx, const uint8_t* row, int q, int t,
                                               Frag (&f)[kG]) {
  if constexpr (kG == 1) {
    F::fragment(ctx, row, q, t, f[0]);
  } else {
    static_assert(kG == fragment_group_of<F>(), "a format's own fragment group");
    F::fragment_group(ctx, row, q, t, f);
  }
}

// x-blocks kG * p .. kG * p + kG - 1 (kG: 1 or the format's kGroup).
template <class F, int kG>
__device__ __forceinline__ void load_group(const typename F::Context& ctx, const uint8_t* seg, int p, Sub (&s)[kG]) {
  if constexpr (kG == 1) {
    F::load(ctx, seg, p, s[0]);
  } else {
    static_assert(kG == group_of<F>(), "a format's own group");
    F::load_group(ctx, seg, p, s);
  }
}

// ------------------------------------------------------------------------------------------------ the dot

// x's codes of one x-block (8 words) and its record: the float scale and the two 16-element code sums.
struct XBlock {
  uint4 lo, hi;
  float d;
  int s0, s1;
};

// What the integer dot `dot` of a one-scale sub-block's codes with x's codes (summing to `sums`) contributes,
// with the sub-block's a and b and x's scale dx (sub_dot; the fragment kernels on their tensor-core dots).
template <class F>
__device__ __forceinline__ float scaled_dot(int dot, float a, float b, float dx, int sums) {
  static_assert(!F::kPerHalf, "one integer scale per sub-block");
  if constexpr (F::kZero != 0) dot -= F::kZero * sums;
  float r = (a * dx) * static_cast<float>(dot);
  if constexpr (F::kOffset == 1) r += b * (dx * static_cast<float>(sums));
  return r;
}

// The same for a sub-block with a scale per 16 elements (kPerHalf), from the integer dots of its halves.
template <class F>
__device__ __forceinline__ float scaled_half_dots(int i0, int i1, const SubScales& w, float dx, int s0, int s1) {
  static_assert(F::kPerHalf, "an integer scale per 16 elements");
  if constexpr (F::kZero != 0) {
    i0 -= F::kZero * s0;
    i1 -= F::kZero * s1;
  }
  float r = (w.a * dx) * static_cast<float>(w.ia0 * i0 + w.ia1 * i1);
  if constexpr (F::kOffset == 1) r += w.b * (dx * static_cast<float>(s0 + s1));
  if constexpr (F::kOffset == 2) r += (w.b * dx) * static_cast<float>(w.ib0 * s0 + w.ib1 * s1);
  return r;
}

template <class F>
__device__ __forceinline__ float sub_dot(const Sub& w, const XBlock& x) {
  const uint32_t xq[8] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w, x.hi.x, x.hi.y, x.hi.z, x.hi.w};
  if constexpr (!F::kPerHalf) {
    int i0 = 0, i1 = 0;  // two chains: more instruction-level parallelism
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      i0 = __dp4a(static_cast<int>(w.q[2 * i]), static_cast<int>(xq[2 * i]), i0);
      i1 = __dp4a(static_cast<int>(w.q[2 * i + 1]), static_cast<int>(xq[2 * i + 1]), i1);
    }
    return scaled_dot<F>(i0 + i1, w.a, w.b, x.d, x.s0 + x.s1);
  } else {
    int i0 = 0, i1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      i0 = __dp4a(static_cast<int>(w.q[i]), static_cast<int>(xq[i]), i0);
      i1 = __dp4a(static_cast<int>(w.q[4 + i]), static_cast<int>(xq[4 + i]), i1);
    }
    return scaled_half_dots<F>(i0, i1, w, x.d, x.s0, x.s1);
  }
}

// The 32 weight values of a sub-block (what sub_dot multiplies x by): a * ia * (code - kZero) + the offset.
template <class F>
__device__ __forceinline__ void sub_values(const Sub& w, float (&v)[32]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float scale = F::kPerHalf ? w.a * static_cast<float>(h ? w.ia1 : w.ia0) : w.a;
    const float offset = F::kOffset == 1 ? w.b : F::kOffset == 2 ? w.b * static_cast<float>(h ? w.ib1 : w.ib0) : 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int code = static_cast<int8_t>((w.q[4 * h + j / 4] >> (8 * (j % 4))) & 0xFFu) - F::kZero;
      v[16 * h + j] = F::kOffset != 0 ? scale * static_cast<float>(code) + offset : scale * static_cast<float>(code);
    }
  }
}

}  // namespace ggml_ext::cuda::decode
