// Device helpers shared by the CUDA kernels: float formats, vector loads/stores, block reductions.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/kernels.h"

namespace ggml_ext::cuda {

// Variant builds of the standalone kernel drivers (bench/cuda_*_driver.cu, -DGGML_EXT_TUNING): whether the switch
// `name` (an environment variable) is 1, for timing a plan's alternatives in one run; never in the package's builds.
inline bool tuning_switch(const char* name) {
#if defined(GGML_EXT_TUNING)
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) == 1;
#else
  (void)name;
  return false;
#endif
}

// Variant builds: the integer in the environment variable `name`, or `fallback` (always, in the package's builds).
inline int tuning_int(const char* name, int fallback) {
#if defined(GGML_EXT_TUNING)
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
#else
  (void)name;
  return fallback;
#endif
}

// The storage type of each FloatType.
template <FloatType kType>
struct Storage;
template <>
struct Storage<FloatType::f32> {
  using type = float;
};
template <>
struct Storage<FloatType::f16> {
  using type = __half;
};
template <>
struct Storage<FloatType::bf16> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The widest aligned word that moves `bytes` bytes in whole words.
template <int kBytes>
struct Word {
  using type = std::conditional_t<kBytes % 16 == 0, uint4,
               std::conditional_t<kBytes % 8 == 0, uint2, std::conditional_t<kBytes % 4 == 0, uint32_t,
               std::conditional_t<kBytes % 2 == 0, uint16_t, uint8_t>>>>;
};

// N consecutive elements of T as the aligned words that hold them: kept in registers undecoded (16-bit types
// take half the registers of their floats) until to_floats.
template <int N, typename T>
struct Packed {
  using W = typename Word<N * sizeof(T)>::type;
  static constexpr int kWords = N * sizeof(T) / sizeof(W);
  W raw[kWords];
  __device__ __forceinline__ void load(const T* p) {  // p aligned to sizeof(W)
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = reinterpret_cast<const W*>(p)[i];
  }
  __device__ __forceinline__ void to_floats(float (&f)[N]) const {
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < N; ++j) f[j] = to_float(e[j]);
  }
};

// N consecutive elements of T at p (aligned to the widest word that divides N * sizeof(T)), as floats.
template <int N, typename T>
__device__ __forceinline__ void load(const T* p, float (&f)[N]) {
  Packed<N, T> v;
  v.load(p);
  v.to_floats(f);
}

template <int N, typename T>
__device__ __forceinline__ void store(T* p, const float (&f)[N]) {
  using W = typename Word<N * sizeof(T)>::type;
  constexpr int kWords = N * sizeof(T) / sizeof(W);
  W raw[kWords];
  T* e = reinterpret_cast<T*>(raw);
#pragma unroll
  for (int j = 0; j < N; ++j) e[j] = from_float<T>(f[j]);
#pragma unroll
  for (int i = 0; i < kWords; ++i) reinterpret_cast<W*>(p)[i] = raw[i];
}

// The sum of v over the warp (kLanes = 32) or over each aligned segment of kLanes lanes (a power of 2), returned to
// every lane of it; every lane of the warp takes part.
template <int kLanes = 32>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32), returned to every thread.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// The block's dynamic shared memory (KernelLaunch::shared_bytes of it).
template <typename T>
__device__ __forceinline__ T* dynamic_shared_memory() {
#if defined(GGML_EXT_CUDA_EMULATION)
  return reinterpret_cast<T*>(ggml_ext_emulated_dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  return reinterpret_cast<T*>(dynamic_shared);
#endif
}

__host__ __device__ inline bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Asynchronous 16-byte copies from global to shared memory (cp.async, L2 only): issued, committed as a group,
// and waited for with at most N newer groups still in flight. A lane's wait covers only its own copies, so lanes
// that read each other's bytes also need a barrier (__syncwarp) after it. The host emulation defers each
// group's copies to the wait that covers it, as late as a GPU may perform them.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src) {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_copy_async(shared_dst, global_src, 16);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_copy_async_commit();
#else
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copy_async_wait() {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_copy_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Asks for the 128-byte lines of [p, p + bytes) in L1 (a hint; nothing in the host emulation).
__device__ __forceinline__ void prefetch_l1(const void* p, int bytes) {
#if !defined(GGML_EXT_CUDA_EMULATION)
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127);
  for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(p) + bytes; line += 128) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
  }
#else
  (void)p;
  (void)bytes;
#endif
}

// Asks for the 128-byte lines of [p, p + bytes) in L2, a warp's lanes taking every 32nd line (a hint).
__device__ __forceinline__ void prefetch_l2_warp(const void* p, int64_t bytes, int lane) {
#if !defined(GGML_EXT_CUDA_EMULATION)
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127);
  for (uintptr_t line = first + 128 * lane; line < reinterpret_cast<uintptr_t>(p) + bytes; line += 128 * 32) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
#else
  (void)p;
  (void)bytes;
  (void)lane;
#endif
}

// The widest word (16 bytes at most) that divides both an address and a length.
__host__ __device__ inline int copy_width(uintptr_t address, uint64_t bytes) {
  const uint64_t bits = address | bytes | 16u;
  return static_cast<int>(bits & (~bits + 1));
}

// Copies `bytes` bytes of global memory to dst, a warp's lanes taking consecutive words of W bytes (W divides
// `bytes` and both addresses).
template <typename W>
__device__ __forceinline__ void warp_copy(const uint8_t* src, uint8_t* dst, int bytes, int lane) {
  const W* s = reinterpret_cast<const W*>(src);
  W* d = reinterpret_cast<W*>(dst);
#pragma unroll 4
  for (int i = lane; i < bytes / static_cast<int>(sizeof(W)); i += 32) d[i] = __ldg(s + i);
}
// The same in words of `width` bytes (copy_width of both addresses and the length).
__device__ __forceinline__ void warp_copy(const uint8_t* src, uint8_t* dst, int bytes, int width, int lane) {
  switch (width) {
    case 16: return warp_copy<uint4>(src, dst, bytes, lane);
    case 8: return warp_copy<uint2>(src, dst, bytes, lane);
    case 4: return warp_copy<uint32_t>(src, dst, bytes, lane);
    case 2: return warp_copy<uint16_t>(src, dst, bytes, lane);
    default: return warp_copy<uint8_t>(src, dst, bytes, lane);
  }
}

// An attribute of the current device (0 if the runtime cannot tell).
inline int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) return 0;
  return value;
}
// Streaming multiprocessors of the current device (0 if the runtime cannot tell).
inline int multiprocessor_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Calls body with kType bound to the compile-time value of `type`.
#define GGML_EXT_CUDA_FLOAT_SWITCH(type, kType, ...)                                  \
  switch (type) {                                                                    \
    case ::ggml_ext::cuda::FloatType::f32: {                                         \
      constexpr auto kType = ::ggml_ext::cuda::FloatType::f32;                       \
      __VA_ARGS__;                                                                   \
    }                                                                                \
    case ::ggml_ext::cuda::FloatType::f16: {                                         \
      constexpr auto kType = ::ggml_ext::cuda::FloatType::f16;                       \
      __VA_ARGS__;                                                                   \
    }                                                                                \
    case ::ggml_ext::cuda::FloatType::bf16: {                                        \
      constexpr auto kType = ::ggml_ext::cuda::FloatType::bf16;                      \
      __VA_ARGS__;                                                                   \
    }                                                                                \
  }

}  // namespace ggml_ext::cuda
