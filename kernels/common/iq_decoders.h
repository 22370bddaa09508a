// Reference decoders of the "decoded" block types (GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE in ggml_blocks.h, which
// includes this header at its end): ggml's IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (values from
// fixed grids, kernels/common/iq_grids.h) and the ternary TQ1_0, TQ2_0. Each
// ggml_ext_dequant16_<name>(block, chunk, out) writes the elements [16*chunk, 16*chunk + 16) of a 256-element
// block as float, computed in the order of ggml's C code and the `gguf` package's numpy (e.g. IQ2_XXS:
// (d * (0.5 + s)) * 0.25, then (db * grid) * sign; IQ1_S: dl * (grid + delta)), so a float32 result is
// bit-identical to theirs. As in ggml_blocks.h, pointers are template parameters (Metal address spaces) and
// the functions compile as C++, CUDA (host and device) and Metal.
//
// Element order, per 32-element sub-block ib (chunk / 2) where the format has one:
//   IQ2_XXS: words qs[4ib..4ib+1] hold 4 grid indices (bytes), qs[4ib+2..4ib+3] (aux) 4 seven-bit sign fields at
//            bits 7l and the scale s = aux >> 28; group l (8 elements): grid[index l], signs ksigns(field l);
//            db = d * (0.5 + s) * 0.25.
//   IQ2_XS:  qs[i] per 8 elements i: grid[qs & 511], ksigns(qs >> 9); per 16 elements c a nibble scale
//            (scales[c/2] >> 4(c%2)); db as IQ2_XXS.
//   IQ2_S:   per 8 elements i: grid[qs[i] | ((qh[i/4] >> 2(i%4)) & 3) << 8], sign bits signs[i]; scales as IQ2_XS.
//   IQ3_XXS: per 4 elements a grid index qs[k]; per sub-block a u32 as IQ2_XXS's aux (signs per 8 elements),
//            db = d * (0.5 + s) * 0.5.
//   IQ3_S:   per 4 elements k: grid[qs[k] | ((qh[k/8] >> k%8) & 1) << 8]; element e's sign bit e%8 of signs[e/8];
//            per sub-block db = d * (1 + 2 * nibble ib of scales).
//   IQ1_S:   per sub-block the u16 qh[ib]: group l (8 elements) grid[qs[4ib+l] | ((qh >> 3l) & 7) << 8],
//            dl = d * (2 * ((qh >> 12) & 7) + 1), delta = -0.125 if bit 15 else 0.125; y = dl * (grid + delta).
//   IQ1_M:   group i (8 elements): nibble i of qh gives 3 high index bits and the delta's sign (bit 3);
//            3-bit scale per 16 elements c: (u16 c/4 of scales >> 3(c%4)) & 7; d: the top nibbles of the 4 u16.
//   TQ1_0:   base-3 digits: byte b times 3^n (mod 256), then (t * 3) >> 8 is the digit, value digit - 1.
//            Elements 0-159: qs[e%32], n = e/32; 160-239: qs[32 + (e-160)%16], n = (e-160)/16; 240-255:
//            qh[(e-240)%4], n = (e-240)/4.
//   TQ2_0:   a layout like Q2_K's (ggml_ext_layout16_tq2_0), codes minus 1, times d.
#pragma once

#include "iq_grids.h"

// The grid tables, one definition of the values (iq_grids.h) per backend: a Metal program-scope constant
// array; on CUDA a device copy and a host copy (a __host__ __device__ decoder reads the one of its side);
// elsewhere a C++ constant. Static: every kernel file includes them (Metal links the files into one library).
#if defined(__METAL_VERSION__)
#define GGML_EXT_DEFINE_GRID(name, NAME) \
  static const constant uint16_t ggml_ext_##name##_grid[GGML_EXT_##NAME##_GRID_SIZE] = {GGML_EXT_##NAME##_GRID_WORDS};
#define GGML_EXT_GRID(name) ggml_ext_##name##_grid
#elif defined(__CUDACC__)
#define GGML_EXT_DEFINE_GRID(name, NAME)                                                          \
  static __device__ const uint16_t ggml_ext_##name##_grid_device[GGML_EXT_##NAME##_GRID_SIZE] = { \
      GGML_EXT_##NAME##_GRID_WORDS};                                                              \
  static const uint16_t ggml_ext_##name##_grid_host[GGML_EXT_##NAME##_GRID_SIZE] = {GGML_EXT_##NAME##_GRID_WORDS};
#if defined(__CUDA_ARCH__)
#define GGML_EXT_GRID(name) ggml_ext_##name##_grid_device
#else
#define GGML_EXT_GRID(name) ggml_ext_##name##_grid_host
#endif
#else
#define GGML_EXT_DEFINE_GRID(name, NAME) \
  inline constexpr uint16_t ggml_ext_##name##_grid[GGML_EXT_##NAME##_GRID_SIZE] = {GGML_EXT_##NAME##_GRID_WORDS};
#define GGML_EXT_GRID(name) ggml_ext_##name##_grid
#endif
GGML_EXT_DEFINE_GRID(iq2xxs, IQ2XXS)
GGML_EXT_DEFINE_GRID(iq2xs, IQ2XS)
GGML_EXT_DEFINE_GRID(iq2s, IQ2S)
GGML_EXT_DEFINE_GRID(iq3xxs, IQ3XXS)
GGML_EXT_DEFINE_GRID(iq3s, IQ3S)
GGML_EXT_DEFINE_GRID(iq1s, IQ1S)
#undef GGML_EXT_DEFINE_GRID

// Value j of a grid word, from its index through the format's value map (tools/gen_iq_grids.py checks these
// maps against gguf's grid_map): IQ2 {8, 25, 43}, IQ3_XXS {4, 12, ..., 52, 62}, IQ3_S {1, 3, ..., 15}, IQ1 {-1, 0, 1}.
GGML_EXT_FN int ggml_ext_iq2_grid_value(uint32_t word, int j) {
  return (int)((0x2B1908u >> (8u * ((word >> (2 * j)) & 3u))) & 0xFFu);
}
GGML_EXT_FN int ggml_ext_iq3xxs_grid_value(uint32_t word, int j) {
  const int q = (int)((word >> (4 * j)) & 7u);
  return q < 7 ? 8 * q + 4 : 62;
}
GGML_EXT_FN int ggml_ext_iq3s_grid_value(uint32_t word, int j) { return 2 * (int)((word >> (4 * j)) & 7u) + 1; }
GGML_EXT_FN int ggml_ext_iq1_grid_value(uint32_t word, int j) { return (int)((word >> (2 * j)) & 3u) - 1; }

// ggml's ksigns table: 7 stored sign bits plus an eighth that makes the count of negative signs even.
GGML_EXT_FN uint32_t ggml_ext_iq_ksigns(uint32_t s7) {
  uint32_t p = s7 ^ (s7 >> 4);
  p ^= p >> 2;
  p ^= p >> 1;
  return s7 | ((p & 1u) << 7);
}

// (scale * value) * (+1 or -1, bit j of signs): the product first, as ggml and gguf. A real multiplication by a
// factor made from its bits: written as `c ? -1.0f : 1.0f`, GCC turns it into a conditional negation, which
// flips a NaN's sign where the multiplication (x86, numpy) keeps it.
GGML_EXT_FN float ggml_ext_iq_signed(float scale, int value, uint32_t signs, int j) {
  const uint32_t factor = 0x3F800000u | (((signs >> j) & 1u) << 31);
#if defined(__METAL_VERSION__)
  return scale * (float)value * as_type<float>(factor);
#elif defined(__CUDA_ARCH__)
  return scale * (float)value * __uint_as_float(factor);
#else
  return scale * (float)value * ggml_ext_bits_to_f32(factor);
#endif
}

// IQ2_XS, IQ2_S: d * (0.5 + nibble) * 0.25 of 16-element chunk c.
template <typename B>
GGML_EXT_FN float ggml_ext_iq2_nibble_scale(B b, int chunk) {
  const uint32_t s = (b->scales[chunk >> 1] >> (4 * (chunk & 1))) & 0xFu;
  return GGML_EXT_HALF_TO_FLOAT(b->d) * (0.5f + (float)s) * 0.25f;
}

// 8 elements of an IQ2 grid entry, signed and scaled, into y[0..7].
template <typename Y>
GGML_EXT_FN void ggml_ext_iq2_put8(uint32_t word, uint32_t signs, float db, Y y) {
  for (int j = 0; j < 8; ++j) y[j] = ggml_ext_iq_signed(db, ggml_ext_iq2_grid_value(word, j), signs, j);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq2_xxs(B b, int chunk, Y y) {
  const int ib = chunk >> 1;
  const uint32_t indices = (uint32_t)b->qs[4 * ib] | ((uint32_t)b->qs[4 * ib + 1] << 16);
  const uint32_t aux = (uint32_t)b->qs[4 * ib + 2] | ((uint32_t)b->qs[4 * ib + 3] << 16);
  const float db = GGML_EXT_HALF_TO_FLOAT(b->d) * (0.5f + (float)(aux >> 28)) * 0.25f;
  for (int g = 0; g < 2; ++g) {
    const int l = 2 * (chunk & 1) + g;
    ggml_ext_iq2_put8(GGML_EXT_GRID(iq2xxs)[(indices >> (8 * l)) & 0xFFu], ggml_ext_iq_ksigns((aux >> (7 * l)) & 0x7Fu),
                      db, y + 8 * g);
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq2_xs(B b, int chunk, Y y) {
  const float db = ggml_ext_iq2_nibble_scale(b, chunk);
  for (int g = 0; g < 2; ++g) {
    const uint32_t q = b->qs[2 * chunk + g];
    ggml_ext_iq2_put8(GGML_EXT_GRID(iq2xs)[q & 511u], ggml_ext_iq_ksigns(q >> 9), db, y + 8 * g);
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq2_s(B b, int chunk, Y y) {
  const float db = ggml_ext_iq2_nibble_scale(b, chunk);
  for (int g = 0; g < 2; ++g) {
    const int i = 2 * chunk + g;
    const uint32_t index = (uint32_t)b->qs[i] | ((((uint32_t)b->qh[i >> 2] >> (2 * (i & 3))) & 3u) << 8);
    ggml_ext_iq2_put8(GGML_EXT_GRID(iq2s)[index], (uint32_t)b->signs[i], db, y + 8 * g);
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq3_xxs(B b, int chunk, Y y) {
  const int ib = chunk >> 1;
  const uint32_t aux = (uint32_t)b->scales_signs[2 * ib] | ((uint32_t)b->scales_signs[2 * ib + 1] << 16);
  const float db = GGML_EXT_HALF_TO_FLOAT(b->d) * (0.5f + (float)(aux >> 28)) * 0.5f;
  for (int g = 0; g < 2; ++g) {
    const int l = 2 * (chunk & 1) + g;
    const uint32_t signs = ggml_ext_iq_ksigns((aux >> (7 * l)) & 0x7Fu);
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = GGML_EXT_GRID(iq3xxs)[b->qs[8 * ib + 2 * l + (j >> 2)]];
      y[8 * g + j] = ggml_ext_iq_signed(db, ggml_ext_iq3xxs_grid_value(word, j & 3), signs, j);
    }
  }
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq3_s(B b, int chunk, Y y) {
  const int ib = chunk >> 1;
  const uint32_t s = (b->scales[ib >> 1] >> (4 * (ib & 1))) & 0xFu;
  const float db = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)(1u + 2u * s);
  const uint32_t signs = (uint32_t)b->signs[2 * chunk] | ((uint32_t)b->signs[2 * chunk + 1] << 8);
  for (int j = 0; j < 16; ++j) {
    const int k = 4 * chunk + (j >> 2);
    const uint32_t index = (uint32_t)b->qs[k] | ((((uint32_t)b->qh[k >> 3] >> (k & 7)) & 1u) << 8);
    y[j] = ggml_ext_iq_signed(db, ggml_ext_iq3s_grid_value(GGML_EXT_GRID(iq3s)[index], j & 3), signs, j);
  }
}

// IQ1_S, IQ1_M: 8 elements dl * (grid + delta) of grid entry `index`.
template <typename Y>
GGML_EXT_FN void ggml_ext_iq1_put8(uint32_t index, float dl, float delta, Y y) {
  const uint32_t word = GGML_EXT_GRID(iq1s)[index];
  for (int j = 0; j < 8; ++j) y[j] = dl * ((float)ggml_ext_iq1_grid_value(word, j) + delta);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq1_s(B b, int chunk, Y y) {
  const int ib = chunk >> 1;
  const uint32_t qh = b->qh[ib];
  const float dl = GGML_EXT_HALF_TO_FLOAT(b->d) * (float)(2u * ((qh >> 12) & 7u) + 1u);
  const float delta = (qh & 0x8000u) ? -0.125f : 0.125f;
  for (int g = 0; g < 2; ++g) {
    const int l = 2 * (chunk & 1) + g;
    ggml_ext_iq1_put8((uint32_t)b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7u) << 8), dl, delta, y + 8 * g);
  }
}

template <typename B>
GGML_EXT_FN uint32_t ggml_ext_iq1m_scale_word(B b, int k) {
  return (uint32_t)b->scales[2 * k] | ((uint32_t)b->scales[2 * k + 1] << 8);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_iq1_m(B b, int chunk, Y y) {
  const uint32_t d_bits = (ggml_ext_iq1m_scale_word(b, 0) >> 12) | ((ggml_ext_iq1m_scale_word(b, 1) >> 8) & 0xF0u) |
                          ((ggml_ext_iq1m_scale_word(b, 2) >> 4) & 0xF00u) | (ggml_ext_iq1m_scale_word(b, 3) & 0xF000u);
  const uint32_t s = (ggml_ext_iq1m_scale_word(b, chunk >> 2) >> (3 * (chunk & 3))) & 7u;
  const float dl = GGML_EXT_HALF_TO_FLOAT((uint16_t)d_bits) * (float)(2u * s + 1u);
  for (int g = 0; g < 2; ++g) {
    const int i = 2 * chunk + g;
    const uint32_t nibble = ((uint32_t)b->qh[i >> 1] >> (4 * (i & 1))) & 0xFu;
    ggml_ext_iq1_put8((uint32_t)b->qs[i] | ((nibble & 7u) << 8), dl, (nibble & 8u) ? -0.125f : 0.125f, y + 8 * g);
  }
}

// TQ1_0: digit n (0..4) of a base-3 byte, stored as a fraction of 256: the byte times 3^n (mod 256), times 3,
// over 256.
GGML_EXT_FN int ggml_ext_tq1_digit(uint32_t byte, int n) {
  const uint32_t pow3 = n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
  return (int)((((byte * pow3) & 0xFFu) * 3u) >> 8);
}

template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_tq1_0(B b, int chunk, Y y) {
  const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
  for (int j = 0; j < 16; ++j) {
    int digit;
    if (chunk < 10) {  // elements 0..159: 32 bytes, digit e / 32
      digit = ggml_ext_tq1_digit(b->qs[16 * (chunk & 1) + j], chunk >> 1);
    } else if (chunk < 15) {  // 160..239: 16 bytes, digit (e - 160) / 16
      digit = ggml_ext_tq1_digit(b->qs[32 + j], chunk - 10);
    } else {  // 240..255: 4 bytes, digit (e - 240) / 4
      digit = ggml_ext_tq1_digit(b->qh[j & 3], j >> 2);
    }
    y[j] = d * (float)(digit - 1);
  }
}

// TQ2_0: element 128h + 32s + l = (qs[32h + l] >> 2s) & 3, minus 1, times d: a chunk layout as Q2_K's, so the
// CPU's integer kernels can take it too (kernels/cpu/matmul.cpp).
GGML_EXT_LAYOUT_FN ggml_ext_layout16 ggml_ext_layout16_tq2_0(int chunk) {
  const int h = chunk >> 3, s = (chunk >> 1) & 3, l0 = 16 * (chunk & 1);
  return ggml_ext_make_layout16(32 * h + l0, 2 * s, 3, 1);
}
template <typename B>
GGML_EXT_FN ggml_ext_scale16 ggml_ext_scale16_tq2_0(B b, int) {
  return ggml_ext_make_scale16(GGML_EXT_HALF_TO_FLOAT(b->d), 0.0f, 0);
}
template <typename B, typename Y>
GGML_EXT_FN void ggml_ext_dequant16_tq2_0(B b, int chunk, Y y) {
  ggml_ext_dequant16_layout(b, ggml_ext_layout16_tq2_0(chunk), ggml_ext_scale16_tq2_0(b, chunk), y);
}

#if !defined(__METAL_VERSION__)
static_assert(offsetof(block_iq2_s, qh) == 66 && offsetof(block_iq3_xxs, scales_signs) == 66 &&
                  offsetof(block_iq3_s, signs) == 74 && offsetof(block_iq1_s, qh) == 34 &&
                  offsetof(block_tq1_0, d) == 52 && offsetof(block_tq2_0, d) == 64,
              "decoded types' offsets");
#endif
