// What the quantized-matmul kernels (matmul_decode.cu, matmul_tiles.cu) share: ggml's batch broadcasting, the
// output store, x's 16-element chunks, and the entry points quantized_matmul.cu dispatches to.
#pragma once
#include "kernels/cuda/weights.cuh"

namespace ggml_ext::cuda {

// Decode: forward products of m <= kDecodeMaxM rows of x. steps[0].kernel == nullptr: not handled here.
constexpr int kDecodeMaxM = 8;
QuantizedMatmulPlan decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
// Its quantized formats by group, one translation unit each (matmul_decode_plans.cuh): an empty plan where
// ggml_type is not of the group.
QuantizedMatmulPlan decode_plan_blocks32(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
QuantizedMatmulPlan decode_plan_superblocks(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
QuantizedMatmulPlan decode_plan_decoded(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
// Decode with x kept as floats (the op's precise_x), any weight type: the float kernel, a warp per weight row whose
// 16-element chunks are decoded to float32 (weights.cuh) and multiplied with x's. steps[0].kernel == nullptr: not
// handled here.
QuantizedMatmulPlan precise_decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
// Int8 tiles (matmul_int8_tiles.cu): forward products of m > kDecodeMaxM rows of x on the formats with tensor-core
// fragments, x quantized to int8 per 32 elements (step 0), weight rows on 4-byte boundaries, k % 32 == 0;
// steps[0].kernel == nullptr: not handled here.
QuantizedMatmulPlan int8_tiles_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type);
// Tiles: any m, forward or transposed. exact_x: float32 x stays float32 (the FMA tiles), else its forward product
// on quantized weights takes the bfloat16 tensor cores.
QuantizedMatmulPlan tiles_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type, bool transpose,
                               bool exact_x);

// Whether every weight row starts on a `bytes`-byte boundary (the base and the row length are multiples of it).
inline bool rows_aligned(const QuantizedMatmulArgs& a, int bytes) {
  return aligned(a.w, bytes) && a.row_bytes % bytes == 0;
}

// The weight matrix of batch z (ggml's broadcasting). Batch 0 (every product of one matrix) takes no division;
// the others divide in 32 bits: the launch takes at most 65535 batches (grid.y), so every operand fits. (The
// 64-bit divisions this replaced were 15% of the Q6_K tensor-core decode's instructions, where each weight-row
// address of its copies called this.)
__device__ inline int64_t weight_batch(const QuantizedMatmulArgs& a, int64_t z) {
  if (z == 0) return 0;
  const uint32_t batch = static_cast<uint32_t>(z), b2 = static_cast<uint32_t>(a.b2);
  return static_cast<int64_t>(batch / b2 / static_cast<uint32_t>(a.ratio3)) * a.a2 +
         (batch % b2) / static_cast<uint32_t>(a.ratio2);
}

template <typename T>
__device__ inline void store_output(const QuantizedMatmulArgs& a, int64_t index, float v) {
  if (a.out_f32) {
    static_cast<float*>(a.y)[index] = v;
  } else {
    static_cast<T*>(a.y)[index] = from_float<T>(v);
  }
}

// 16 elements of a row of x from element 16 * chunk, zero past `length`.
template <typename T>
__device__ inline void load_x_chunk(const T* row, int64_t chunk, int64_t length, bool vector, float (&v)[16]) {
  const T* p = row + chunk * 16;
  if (vector) {
    load(p, v);
    return;
  }
  const int64_t valid = length - chunk * 16;
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = j < valid ? to_float(p[j]) : 0.0f;
}

}  // namespace ggml_ext::cuda
