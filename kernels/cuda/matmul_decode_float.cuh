// The decode kernel of float weights (F32/F16/BF16, matmul_decode_plans.cuh has the design): a warp per weight row.
#pragma once
#include "kernels/cuda/matmul_common.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ float

constexpr int kFloatRows = 8;  // warps per block, one weight row each

// Float weights (and any weight whose rows do not split into 32-element x-blocks): a warp per row, each lane
// 16-element chunks decoded to float and multiplied with x in float32.
template <typename Weights, typename T>
__global__ void __launch_bounds__(kFloatRows * 32) decode_float_kernel(QuantizedMatmulArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kFloatRows + threadIdx.x / 32;
  const int64_t z = blockIdx.y;
  if (n >= a.n) return;  // the whole warp
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + (weight_batch(a, z) * a.n + n) * a.row_bytes;
  const T* x = static_cast<const T*>(a.x) + z * a.m * a.k;
  // Whole 16-element chunks on 16-byte boundaries: every x row starts on one when k % 16 == 0.
  const bool vector = a.k % 16 == 0 && aligned(a.x, 16);
  float acc[kDecodeMaxM] = {};
  const int64_t chunks = (a.k + 15) / 16;
  for (int64_t c = lane; c < chunks; c += 32) {
    float w[16];
    Weights::row_chunk(row, c, a.k, w);
#pragma unroll
    for (int m = 0; m < kDecodeMaxM; ++m) {
      if (m < a.m) {
        float xv[16];
        load_x_chunk(x + m * a.k, c, a.k, vector, xv);
        float chunk_sum = 0.0f;  // summed apart, then added: shorter float32 rounding chains
#pragma unroll
        for (int j = 0; j < 16; ++j) chunk_sum += w[j] * xv[j];
        acc[m] += chunk_sum;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kDecodeMaxM; ++m) {
    if (m < a.m) {
      const float sum = warp_sum(acc[m]);
      if (lane == 0) store_output<T>(a, (z * a.m + m) * a.n + n, sum);
    }
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
