// What every Metal kernel of the package includes: the shared block formats, the argument blocks and the
// float formats as stored in MLX arrays.
#pragma once
#include <metal_stdlib>

#include "kernels/common/ggml_blocks.h"
#include "kernels/metal/params.h"

using namespace metal;
using namespace ggml_ext_metal;

// Loads and stores of the three float dtypes, computing in float: float, half, and bfloat16 kept as its
// ushort bits (so no kernel depends on Metal 3.1's bfloat type).
template <typename T>
struct FloatIO;
template <>
struct FloatIO<float> {
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
template <>
struct FloatIO<half> {
  static float load(half v) { return float(v); }
  static half store(float v) { return half(v); }  // round to nearest even
};
template <>
struct FloatIO<ushort> {
  static float load(ushort v) { return as_type<float>(uint(v) << 16); }
  // Round to nearest even; NaN stays NaN (quieted), as the CPU kernels do.
  static ushort store(float v) {
    const uint u = as_type<uint>(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ushort((u >> 16) | 0x40u);
    return ushort((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

// 4-element vectors of the three storage types (float4, half4, bfloat16 bits as ushort4).
template <typename T>
struct Vec4;
template <>
struct Vec4<float> {
  typedef float4 type;
};
template <>
struct Vec4<half> {
  typedef half4 type;
};
template <>
struct Vec4<ushort> {
  typedef ushort4 type;
};

// The host names' dtype suffixes: <kernel>_f32, _f16, _bf16.
#define GGML_EXT_FOR_EACH_DTYPE(X, ...) \
  X(f32, float, __VA_ARGS__)            \
  X(f16, half, __VA_ARGS__)             \
  X(bf16, ushort, __VA_ARGS__)
