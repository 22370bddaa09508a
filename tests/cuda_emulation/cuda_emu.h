// Runs the CUDA kernels of kernels/cuda on the host, for tests/test_cuda_emulation.py: the .cu files are
// compiled as C++ with this header forced in. Each block runs alone, one host thread per CUDA thread, so
// __shared__ memory is a static variable, __syncthreads a barrier over the block's threads and a warp
// shuffle an exchange through memory between barriers of the warp's 32 threads. Arithmetic is the host's
// IEEE float32 without contraction (the kernels' __f*_rn intrinsics are plain operations). Tensor-core code
// is not emulated: the kernels fall back to their FMA paths (GGML_EXT_CUDA_WMMA is 0 without nvcc).
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#define GGML_EXT_CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

unsigned char* ggml_ext_emulated_dynamic_shared();
void __syncthreads();
float ggml_ext_emulated_shuffle_xor(float v, int lane_mask);

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) { return ggml_ext_emulated_shuffle_xor(v, lane_mask); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
