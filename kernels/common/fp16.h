// Scalar IEEE half and bfloat16 conversions, bit-exact and dependency-free,
// for host code on every backend (CUDA and Metal have native types on device).
#pragma once
#include <stdint.h>
#include <string.h>
#include <math.h>

#ifdef __cplusplus
#define GGML_EXT_INLINE static inline
#else
#define GGML_EXT_INLINE static inline
#endif

GGML_EXT_INLINE float ggml_ext_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

GGML_EXT_INLINE uint32_t ggml_ext_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

GGML_EXT_INLINE float ggml_ext_fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return ggml_ext_bits_to_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float32
    const float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return ggml_ext_bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, overflow to infinity, NaN stays NaN (quiet).
GGML_EXT_INLINE uint16_t ggml_ext_fp32_to_fp16(float f) {
  const uint32_t x = ggml_ext_f32_to_bits(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {
    // below 2^-14: subnormal half; scaling by 2^24 is exact, rint rounds half to even
    return (uint16_t)(sign | (uint16_t)rintf(ggml_ext_bits_to_f32(ax) * 16777216.0f));
  }
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
  return (uint16_t)(sign | (r >> 13));
}

GGML_EXT_INLINE float ggml_ext_bf16_to_fp32(uint16_t h) {
  return ggml_ext_bits_to_f32((uint32_t)h << 16);
}

GGML_EXT_INLINE uint16_t ggml_ext_fp32_to_bf16(float f) {
  const uint32_t u = ggml_ext_f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
