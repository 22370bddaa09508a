#include "kernels/cuda/matmul_common.cuh"
namespace ggml_ext::cuda {
namespace {
constexpr int kDecodeRows = 8;
template <typename Weights, typename T>
__global__ void __launch_bounds__(kDecodeRows * 32) decode_kernel(QuantizedMatmulArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kDecodeRows + threadIdx.x / 32;
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
template <typename T, typename Weights>
QuantizedMatmulPlan plan_for(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  l.kernel = reinterpret_cast<const void*>(&decode_kernel<Weights, T>);
  l.grid = dim3(ceil_div(a.n, kDecodeRows), static_cast<unsigned>(a.batches));
  l.block = dim3(kDecodeRows * 32);
  return p;
}
}  // namespace
QuantizedMatmulPlan decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, return with_weights(ggml_type, [&](auto weights) {
    return plan_for<typename Storage<kType>::type, decltype(weights)>(args);
  }));
  return {};
}
}  // namespace ggml_ext::cuda
