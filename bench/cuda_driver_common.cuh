// What the standalone CUDA kernel drivers (cuda_kernel_driver.cu, cuda_mul_mat_id_driver.cu) share: error checks,
// weight bytes that keep fp16 fields finite, the read roofline, CUDA-event timing, kernel launches as the plans
// describe them, the quantized types by name, and copies of a weight that make each product read from DRAM.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cuda/kernels.h"

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace driver {

// Bytes from a hash of their index: the content does not change the integer kernels' time; fp16 scales get
// small finite values so the float work is the usual one.
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<uint8_t>(h & 0x3F);  // below 0x40: as an fp16's high byte, a small finite value
  }
}

__global__ void fill_half_kernel(__half* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = __float2half(static_cast<float>(static_cast<int>(i * 7919 % 2001) - 1000) / 1000.0f);
}

// The read roofline: every 16-byte word read once (four loads in flight per thread), one word per block stored.
__global__ void read_kernel(const uint4* p, size_t words, unsigned* out) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < words; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldg(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;  // practically never: keeps the loads
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
  }
  template <typename F>
  float us(int iters, F&& body) {
    for (int i = 0; i < 10; ++i) body(i);  // warm-up
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) body(i);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1000.0f / static_cast<float>(iters);
  }
};

template <class Args>
void launch(const ggml_ext::cuda::KernelLaunch& l, Args& a) {
  if (l.shared_bytes > 48 * 1024) {  // above the default limit: raised per kernel, as csrc/backend/cuda does
    CHECK(cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.shared_bytes)));
  }
  void* params[] = {&a};
  CHECK(cudaLaunchKernel(l.kernel, l.grid, l.block, params, l.shared_bytes, 0));
}

struct TypeInfo {
  const char* name;
  int id, qk, bytes;
};
const TypeInfo kTypes[] = {
#define GGML_EXT_TYPE_INFO(NAME, name, id, qk, bytes) {#NAME, id, qk, bytes},
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_TYPE_INFO)
#undef GGML_EXT_TYPE_INFO
};

const TypeInfo& type_named(const char* name) {
  for (const auto& info : kTypes)
    if (std::strcmp(info.name, name) == 0) return info;
  std::fprintf(stderr, "no type %s\n", name);
  std::exit(1);
}

// Enough copies of a weight of `bytes` bytes (>= 256 MB together) that each product reads its own from DRAM.
std::vector<uint8_t*> weight_copies(int64_t bytes) {
  std::vector<uint8_t*> w(static_cast<size_t>((size_t{256} << 20) / bytes + 1));
  for (size_t c = 0; c < w.size(); ++c) {
    CHECK(cudaMalloc(&w[c], bytes));
    fill_kernel<<<1024, 256>>>(w[c], bytes, 17u * static_cast<uint32_t>(c) + 1);
  }
  return w;
}

// One weight row of k elements (its blocks at `blocks`) dequantized by ggml_blocks.h's reference decoders: the
// drivers' checks compare the kernels with float64 math on these values.
inline void dequantize_row(const TypeInfo& t, const uint8_t* blocks, int64_t k, float* out) {
  for (int64_t c = 0; c < k / 16; ++c) {
    const uint8_t* block = blocks + (c * 16 / t.qk) * t.bytes;
    const int chunk = static_cast<int>(c % (t.qk / 16));
    switch (t.id) {
#define GGML_EXT_CHECK_DEQUANT(NAME, name, id, qk, bytes) \
  case id: ggml_ext_dequant16_##name(reinterpret_cast<const block_##name*>(block), chunk, out + c * 16); break;
      GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_CHECK_DEQUANT)
#undef GGML_EXT_CHECK_DEQUANT
    }
  }
}

// Random weight bytes from a seeded generator, each below 0x40 (as fill_kernel's: fp16 fields stay finite).
inline std::vector<uint8_t> random_weight_bytes(size_t count, uint32_t seed) {
  std::vector<uint8_t> w(count);
  uint32_t h = seed;
  for (auto& b : w) {
    h = h * 1664525u + 1013904223u;
    b = static_cast<uint8_t>((h >> 24) & 0x3F);
  }
  return w;
}

}  // namespace driver
