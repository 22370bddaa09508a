// Runs the CUDA kernels of kernels/cuda on the host, for tests/test_cuda_emulation.py: the .cu files are
// compiled as C++ with this header forced in. Each block runs alone, its CUDA threads fibers of one host thread
// (emulated_launch.cpp), so __shared__ memory is a static variable, __syncthreads a barrier over the block's
// threads and a warp shuffle an exchange through memory between barriers of the warp's 32 threads. Arithmetic is the host's
// IEEE float32 without contraction (the kernels' __f*_rn intrinsics are plain operations). The WMMA API is
// emulated with whole 16x16 tiles per thread (every lane computes the warp's fragment; lane 0 stores it), which
// checks the kernels' tile indexing, not the tensor cores' rounding.
#pragma once
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
// The fibers of a block switch only at barriers and shuffles, so a plain read-modify-write is atomic.
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float x[16][16];
};

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      f.x[i][j] = static_cast<float>(std::is_same_v<Layout, col_major> ? p[j * ldm + i] : p[i * ldm + j]);
}

template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, float v) {
  for (auto& row : f.x)
    for (auto& e : row) e = v;
}

template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float sum = c.x[i][j];
      for (int k = 0; k < 16; ++k) sum += a.x[i][k] * b.x[k][j];
      out[i][j] = sum;
    }
  std::memcpy(d.x, out, sizeof out);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t) {
  if (threadIdx.x % 32 != 0) return;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) p[i * ldm + j] = f.x[i][j];
}
}  // namespace nvcuda::wmma

// ---- decode kernels' intrinsics
// mma.sync m16n8k32 s8 (matmul_decode_tensor_cores.cuh's mma_s8_16x8x32): the warp's fragments exchanged through
// memory.
void ggml_ext_emulated_mma_s8_16x8x32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
// cp.async (common.cuh's copy_async_*): a thread's copies are queued by group and done at the wait that
// covers their group, so a kernel that reads a stage before waiting for it reads what was there before.
void ggml_ext_emulated_copy_async(void* dst, const void* src, int bytes);
void ggml_ext_emulated_copy_async_commit();
void ggml_ext_emulated_copy_async_wait(int newer_groups_left);
// __syncwarp: a shuffle is a barrier of the warp's 32 threads (every decode kernel calls it with whole warps).
inline void __syncwarp(unsigned = 0xffffffffu) { ggml_ext_emulated_shuffle_xor(0.0f, 0); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
// Signed 4-way byte dot product plus c.
inline int __dp4a(int a, int b, int c) {
  for (int j = 0; j < 4; ++j) c += static_cast<int8_t>(a >> (8 * j)) * static_cast<int8_t>(b >> (8 * j));
  return c;
}
// (hi:lo) >> (shift & 31), low 32 bits.
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<uint32_t>(v >> (shift & 31u));
}
// PTX prmt (default mode): byte k of the result is byte (s >> 4k) & 7 of {y:x}, or its sign replicated when
// bit 3 of that selector is set.
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t sel = (s >> (4 * k)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * k);
  }
  return r;
}
