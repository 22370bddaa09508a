// The decode kernels' view (decode_formats.cuh) of the grid and ternary formats: ggml's IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and TQ1_0, TQ2_0. Their values are small integers times a scale per 32 (or 16)
// elements, so each x-block becomes 32 int8 codes for the same __dp4a products as the other formats:
//   IQ2:  +-{8, 25, 43} (grid values with their signs), a = d * (0.5 + s) * 0.25, or d / 8 with ia = 2s + 1 per 16;
//   IQ3:  +-{4, 12, ..., 62} (IQ3_XXS), a = d * (0.5 + s) * 0.5; +-{1, 3, ..., 15} (IQ3_S), a = d * (1 + 2s);
//   IQ1:  8 * (grid value) +- 1 (the +-1/8 delta times 8), a = d * (2s + 1) / 8 (ia per 16 for IQ1_M);
//   TQ:   base-3 digits t with kZero 1 (values t - 1), a = d.
// The bit fields are kernels/common/iq_decoders.h's (its comment has every format's element order); the grids are
// its device tables, read per 8 (IQ2, IQ1) or 4 (IQ3) elements, which L1 serves. A grid word's 2- or 3-bit value
// indices become the selector nibbles of one __byte_perm over an 8-entry table of code bytes: for the IQ2 and IQ1
// grids (3 values) the 4th selector bit picks the negated (IQ2) or the other delta's (IQ1) half of the table, so
// sign and value take one instruction per 4 elements. These formats have load() only: the decode kernels take
// them through __dp4a at every row count up to 8 (no tensor-core fragments), the tiles above that.
#pragma once
#include "kernels/cuda/decode_formats.cuh"

namespace ggml_ext::cuda::decode {

// Bits 2j, 2j + 1 of b (4 two-bit fields) into nibble j: a __byte_perm selector.
__device__ __forceinline__ uint32_t nibbles_of_pairs(uint32_t b) {
  return (b & 0x3u) | ((b & 0xCu) << 2) | ((b & 0x30u) << 4) | ((b & 0xC0u) << 6);
}
// Bit j of the 4-bit s into bit 2 of nibble j (the selector's half of an 8-entry table).
__device__ __forceinline__ uint32_t nibble_bit2(uint32_t s) {
  return ((s & 1u) << 2) | ((s & 2u) << 5) | ((s & 4u) << 8) | ((s & 8u) << 11);
}

// 8 codes of a grid of 2-bit value indices (IQ2, IQ1) with one selector bit each (sign or delta): `lower` holds
// the 4 code bytes of indices 0..3 with the bit clear, `upper` with it set.
__device__ __forceinline__ void pair_grid_codes(uint32_t word, uint32_t bits, uint32_t lower, uint32_t upper,
                                                uint32_t& lo, uint32_t& hi) {
  lo = __byte_perm(lower, upper, nibbles_of_pairs(word & 0xFFu) | nibble_bit2(bits & 0xFu));
  hi = __byte_perm(lower, upper, nibbles_of_pairs((word >> 8) & 0xFFu) | nibble_bit2((bits >> 4) & 0xFu));
}

// IQ2's grid values 8, 25, 43 and their negations (bytes 0..2 of each word).
constexpr uint32_t kIq2Positive = 0x002B1908u, kIq2Negative = 0x00D5E7F8u;
__device__ __forceinline__ void iq2_codes(uint32_t word, uint32_t signs, uint32_t& lo, uint32_t& hi) {
  pair_grid_codes(word, signs, kIq2Positive, kIq2Negative, lo, hi);
}

// 4 codes of 3-bit value indices in nibbles (the IQ3 grids' words) through an 8-entry table, then negated where
// the 4 sign bits say: every value is >= 1, so (c ^ 0xFF) + 1 per byte carries into no other byte.
__device__ __forceinline__ uint32_t iq3_codes(uint32_t word, uint32_t table0, uint32_t table1, uint32_t signs4) {
  const uint32_t c = __byte_perm(table0, table1, word & 0x7777u);
  const uint32_t negate = spread4(signs4) * 0xFFu;
  return (c ^ negate) + (negate & 0x01010101u);
}
// IQ3_XXS: 4, 12, ..., 52, 62; IQ3_S: 1, 3, ..., 15.
constexpr uint32_t kIq3xxs0 = 0x1C140C04u, kIq3xxs1 = 0x3E342C24u, kIq3s0 = 0x07050301u, kIq3s1 = 0x0F0D0B09u;

struct FmtIQ2_XXS {
  using Block = block_iq2_xxs;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t w[2];  // 4 grid indices, then 4 seven-bit sign fields and the scale
    sh_words(seg, o + offsetof(Block, qs) + 8 * sb, w);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      iq2_codes(GGML_EXT_GRID(iq2xxs)[(w[0] >> (8 * l)) & 0xFFu], ggml_ext_iq_ksigns((w[1] >> (7 * l)) & 0x7Fu),
                s.q[2 * l], s.q[2 * l + 1]);
    }
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d))) * (0.5f + static_cast<float>(w[1] >> 28)) * 0.25f;
  }
};

// IQ2_XS, IQ2_S: a nibble scale per 16 elements: a = d / 8, ia = 2s + 1.
__device__ __forceinline__ void iq2_nibble_scales(const uint8_t* seg, int o, int scales, int sb, Sub& s) {
  const uint32_t byte = seg[o + scales + sb];
  s.ia0 = 2 * static_cast<int>(byte & 0xFu) + 1;
  s.ia1 = 2 * static_cast<int>(byte >> 4) + 1;
  s.a = half_bits(sh_u16(seg, o)) * 0.125f;  // d is the first field
}

struct FmtIQ2_XS {
  using Block = block_iq2_xs;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t w[2];  // 4 u16: a 9-bit grid index and 7 sign bits each
    sh_words(seg, o + offsetof(Block, qs) + 8 * sb, w);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t q = (w[l >> 1] >> (16 * (l & 1))) & 0xFFFFu;
      iq2_codes(GGML_EXT_GRID(iq2xs)[q & 511u], ggml_ext_iq_ksigns(q >> 9), s.q[2 * l], s.q[2 * l + 1]);
    }
    iq2_nibble_scales(seg, o, offsetof(Block, scales), sb, s);
  }
};

struct FmtIQ2_S {
  using Block = block_iq2_s;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t low[1], signs[1];  // groups 4sb .. 4sb + 3: index bytes, sign bytes
    sh_words(seg, o + offsetof(Block, qs) + 4 * sb, low);
    sh_words(seg, o + offsetof(Block, signs) + 4 * sb, signs);
    const uint32_t high = seg[o + offsetof(Block, qh) + sb];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t index = ((low[0] >> (8 * l)) & 0xFFu) | (((high >> (2 * l)) & 3u) << 8);
      iq2_codes(GGML_EXT_GRID(iq2s)[index], (signs[0] >> (8 * l)) & 0xFFu, s.q[2 * l], s.q[2 * l + 1]);
    }
    iq2_nibble_scales(seg, o, offsetof(Block, scales), sb, s);
  }
};

struct FmtIQ3_XXS {
  using Block = block_iq3_xxs;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t idx[2], aux[1];  // 8 grid indices (4 elements each); 4 seven-bit sign fields and the scale
    sh_words(seg, o + offsetof(Block, qs) + 8 * sb, idx);
    sh_words(seg, o + offsetof(Block, scales_signs) + 4 * sb, aux);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t signs = ggml_ext_iq_ksigns((aux[0] >> (7 * l)) & 0x7Fu);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t index = (idx[l >> 1] >> (16 * (l & 1) + 8 * h)) & 0xFFu;
        s.q[2 * l + h] = iq3_codes(GGML_EXT_GRID(iq3xxs)[index], kIq3xxs0, kIq3xxs1, (signs >> (4 * h)) & 0xFu);
      }
    }
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d))) * (0.5f + static_cast<float>(aux[0] >> 28)) * 0.5f;
  }
};

struct FmtIQ3_S {
  using Block = block_iq3_s;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t low[2], signs[1];  // 8 index bytes (4 elements each); one sign bit per element
    sh_words(seg, o + offsetof(Block, qs) + 8 * sb, low);
    sh_words(seg, o + offsetof(Block, signs) + 4 * sb, signs);
    const uint32_t high = seg[o + offsetof(Block, qh) + sb];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t index = ((low[k >> 2] >> (8 * (k & 3))) & 0xFFu) | (((high >> k) & 1u) << 8);
      s.q[k] = iq3_codes(GGML_EXT_GRID(iq3s)[index], kIq3s0, kIq3s1, (signs[0] >> (4 * k)) & 0xFu);
    }
    const uint32_t scale = (seg[o + offsetof(Block, scales) + (sb >> 1)] >> (4 * (sb & 1))) & 0xFu;
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d))) * static_cast<float>(1u + 2u * scale);
  }
};

// IQ1: 8 * (v - 1) + 1 for the value indices v = 0, 1, 2 (delta +1/8), 8 * (v - 1) - 1 with the delta's sign set.
constexpr uint32_t kIq1PlusDelta = 0x000901F9u, kIq1MinusDelta = 0x0007FFF7u;
__device__ __forceinline__ void iq1_codes(uint32_t index, bool minus_delta, uint32_t& lo, uint32_t& hi) {
  pair_grid_codes(GGML_EXT_GRID(iq1s)[index], minus_delta ? 0xFFu : 0u, kIq1PlusDelta, kIq1MinusDelta, lo, hi);
}

struct FmtIQ1_S {
  using Block = block_iq1_s;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t low[1];  // 4 index bytes
    sh_words(seg, o + offsetof(Block, qs) + 4 * sb, low);
    const uint32_t qh = sh_u16(seg, o + offsetof(Block, qh) + 2 * sb);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      iq1_codes(((low[0] >> (8 * l)) & 0xFFu) | (((qh >> (3 * l)) & 7u) << 8), (qh & 0x8000u) != 0, s.q[2 * l],
                s.q[2 * l + 1]);
    }
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d))) * static_cast<float>(2u * ((qh >> 12) & 7u) + 1u) * 0.125f;
  }
};

struct FmtIQ1_M {
  using Block = block_iq1_m;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 0, kOffset = 0;
  static constexpr bool kPerHalf = true;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    uint32_t low[1], sc[2];  // 4 index bytes; the 4 u16 scale words
    sh_words(seg, o + offsetof(Block, qs) + 4 * sb, low);
    const uint32_t qh = sh_u16(seg, o + offsetof(Block, qh) + 2 * sb);  // the 4 groups' nibbles
    sh_words(seg, o + offsetof(Block, scales), sc);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t nibble = (qh >> (4 * l)) & 0xFu;
      iq1_codes(((low[0] >> (8 * l)) & 0xFFu) | ((nibble & 7u) << 8), (nibble & 8u) != 0, s.q[2 * l], s.q[2 * l + 1]);
    }
    // d: the top nibbles of the 4 u16 words; the 3-bit scales of chunks 2sb, 2sb + 1 in u16 word sb / 2.
    const uint32_t d_bits = ((sc[0] >> 12) & 0xFu) | ((sc[0] >> 24) & 0xF0u) | ((sc[1] >> 4) & 0xF00u) |
                            ((sc[1] >> 16) & 0xF000u);
    const uint32_t word = (sc[sb >> 2] >> (16 * ((sb >> 1) & 1))) & 0xFFFFu;
    const int shift = 6 * (sb & 1);
    s.ia0 = 2 * static_cast<int>((word >> shift) & 7u) + 1;
    s.ia1 = 2 * static_cast<int>((word >> (shift + 3)) & 7u) + 1;
    s.a = half_bits(d_bits) * 0.125f;
  }
};

// TQ1_0's base-3 digit n of 4 bytes at once: (byte * 3^n mod 256) * 3 >> 8, in 16-bit lanes (no carries across).
__device__ __forceinline__ uint32_t tq1_digits(uint32_t bytes, int n) {
  const uint32_t pow3 = static_cast<uint32_t>((0x511B090301ull >> (8 * n)) & 0xFFu);  // 1, 3, 9, 27, 81
  const uint32_t even = ((((bytes & 0x00FF00FFu) * pow3) & 0x00FF00FFu) * 3u >> 8) & 0x00030003u;
  const uint32_t odd = (((((bytes >> 8) & 0x00FF00FFu) * pow3) & 0x00FF00FFu) * 3u >> 8) & 0x00030003u;
  return even | (odd << 8);
}

struct FmtTQ1_0 {
  using Block = block_tq1_0;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 1, kOffset = 0;
  static constexpr bool kPerHalf = false;
  // Elements 0-159: byte qs[e % 32], digit e / 32; 160-239: qs[32 + (e - 160) % 16], digit (e - 160) / 16;
  // 240-255: qh[(e - 240) % 4], digit (e - 240) / 4.
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    if (sb < 5) {
      uint32_t q[8];
      sh_words(seg, o + offsetof(Block, qs), q);
#pragma unroll
      for (int i = 0; i < 8; ++i) s.q[i] = tq1_digits(q[i], sb);
    } else {
      uint32_t q[4];
      sh_words(seg, o + offsetof(Block, qs) + 32, q);
      const int n = 2 * (sb - 5);  // digits n and n + 1 of the 16 bytes (sub-block 7: digit 4, then qh)
#pragma unroll
      for (int i = 0; i < 4; ++i) s.q[i] = tq1_digits(q[i], n);
      if (sb < 7) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s.q[4 + i] = tq1_digits(q[i], n + 1);
      } else {
        uint32_t h[1];
        sh_words(seg, o + offsetof(Block, qh), h);
#pragma unroll
        for (int i = 0; i < 4; ++i) s.q[4 + i] = tq1_digits(h[0], i);
      }
    }
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
};

// TQ2_0: element 128h + 32s + l = (qs[32h + l] >> 2s) & 3, minus 1, times d (Q2_K's order, one scale).
struct FmtTQ2_0 {
  using Block = block_tq2_0;
  using Context = NoContext;
  static constexpr int kQK = 256, kZero = 1, kOffset = 0;
  static constexpr bool kPerHalf = false;
  __device__ static void load(const Context&, const uint8_t* seg, int g, Sub& s) {
    const int sb = g & 7, o = (g >> 3) * static_cast<int>(sizeof(Block));
    const int shift = 2 * (sb & 3);
    sh_words(seg, o + offsetof(Block, qs) + 32 * (sb >> 2), s.q);
#pragma unroll
    for (int i = 0; i < 8; ++i) s.q[i] = (s.q[i] >> shift) & 0x03030303u;
    s.a = half_bits(sh_u16(seg, o + offsetof(Block, d)));
  }
};

// Whether a format has the tensor-core decode's fragments (the grid and ternary formats have load() only).
template <class F>
constexpr bool has_fragments() {
  return requires { &F::fragment; } || requires { F::kFragGroup; };
}

}  // namespace ggml_ext::cuda::decode
