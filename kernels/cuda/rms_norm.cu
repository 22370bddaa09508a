// RMSNorm: one block per row; each thread keeps its first packets of the row in registers between the
// sum of squares and the scaling, so rows up to kCached * kPack * blockDim elements are read once.
#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kCached = 4;
constexpr int kMaxThreads = 256;

// kPack elements per packet: 8 when rows and pointers allow vector access, else 1.
template <typename T, int kPack>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(RmsNormArgs a) {
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.dim;
  T* y = static_cast<T*>(a.y) + row * a.dim;
  const T* w = a.weight ? static_cast<const T*>(a.weight) + (row / a.rows_per_weight) * a.dim : nullptr;
  const int64_t packets = a.dim / kPack;

  float cached[kCached][kPack];
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    const int64_t p = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (p < packets) {
      load(x + p * kPack, cached[c]);
#pragma unroll
      for (int j = 0; j < kPack; ++j) sum += cached[c][j] * cached[c][j];
    }
  }
  for (int64_t p = threadIdx.x + static_cast<int64_t>(kCached) * blockDim.x; p < packets; p += blockDim.x) {
    float v[kPack];
    load(x + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; ++j) sum += v[j] * v[j];
  }
  const float scale = 1.0f / sqrtf(block_sum(sum) / static_cast<float>(a.dim) + a.eps);

  auto write = [&](int64_t p, float (&v)[kPack]) {
    float out[kPack];
    if (w) {
      float wv[kPack];
      load(w + p * kPack, wv);
#pragma unroll
      for (int j = 0; j < kPack; ++j) out[j] = (v[j] * scale) * wv[j];
    } else {
#pragma unroll
      for (int j = 0; j < kPack; ++j) out[j] = v[j] * scale;
    }
    store(y + p * kPack, out);
  };
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    const int64_t p = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (p < packets) write(p, cached[c]);
  }
  for (int64_t p = threadIdx.x + static_cast<int64_t>(kCached) * blockDim.x; p < packets; p += blockDim.x) {
    float v[kPack];
    load(x + p * kPack, v);
    write(p, v);
  }
}

template <FloatType kType>
KernelLaunch rms_norm_launch_typed(const RmsNormArgs& a) {
  using T = typename Storage<kType>::type;
  constexpr int kPack = 8;
  const bool vector = a.dim % kPack == 0 && aligned(a.x, kPack * sizeof(T)) && aligned(a.y, kPack * sizeof(T)) &&
                      (!a.weight || aligned(a.weight, kPack * sizeof(T)));
  const int64_t packets = vector ? a.dim / kPack : a.dim;
  const unsigned threads = static_cast<unsigned>(std::min<int64_t>(kMaxThreads, ceil_div(packets, 32) * 32));
  KernelLaunch l;
  l.kernel = vector ? reinterpret_cast<const void*>(&rms_norm_kernel<T, kPack>)
                    : reinterpret_cast<const void*>(&rms_norm_kernel<T, 1>);
  l.grid = dim3(static_cast<unsigned>(a.rows));
  l.block = dim3(threads);
  return l;
}

}  // namespace

KernelLaunch rms_norm_launch(const RmsNormArgs& args, FloatType type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(type, kType, return rms_norm_launch_typed<kType>(args));
  return {};
}

}  // namespace ggml_ext::cuda
