// mul_mat_id on the GPU, a first correct version: the ids are read by the kernel itself (no host round trip, so
// the launch records into MLX's CUDA graph like any other), each (token, slot) pair's expert row by row through
// the shared chunk decoders of weights.cuh in float32. It does not group tokens by expert: an expert chosen by P
// pairs is read P times (from L2 when they run together); the decode and tile kernels of matmul_decode.cu /
// matmul_tiles.cu, driven per expert, are the fast route still to be written.
//
// An id outside [0, E) gives that pair a row of NaN: the kernel never addresses memory outside the experts (the op
// raises ValueError at graph-building time for ids already evaluated).
#include <cmath>

#include "kernels/cuda/weights.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMaxGridY = 65535;

__device__ __forceinline__ bool valid_expert(int32_t id, int64_t e) { return id >= 0 && id < e; }

// 16 elements of x from element `first` of a row of `count` (those past the end read as zero).
template <typename T>
__device__ __forceinline__ void x_chunk(const T* row, int64_t first, int64_t count, float (&v)[16]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = first + j < count ? to_float(row[first + j]) : 0.0f;
}

// Forward: a warp per (pair, weight row n); lanes take the row's 16-element chunks in turn.
template <typename W, typename T>
__global__ void __launch_bounds__(kThreads) mul_mat_id_forward(MulMatIdArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= a.n) return;  // the whole warp
  const int64_t pairs = a.t * a.n_used, chunks = (a.k + 15) / 16;
  for (int64_t p = blockIdx.y; p < pairs; p += gridDim.y) {
    const int32_t id = a.ids[p];
    T* y = static_cast<T*>(a.y) + p * a.n + n;
    if (!valid_expert(id, a.e)) {
      if (lane == 0) *y = from_float<T>(NAN);
      continue;
    }
    const int64_t token = p / a.n_used, slot = a.x_slots == 1 ? 0 : p % a.n_used;
    const T* x = static_cast<const T*>(a.x) + (token * a.x_slots + slot) * a.k;
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + (id * a.n + n) * a.row_bytes;
    float sum = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
      float w[16], v[16];
      W::row_chunk(row, c, a.k, w);
      x_chunk(x, c * 16, a.k, v);
#pragma unroll
      for (int j = 0; j < 16; ++j) sum += w[j] * v[j];
    }
    sum = warp_sum(sum);
    if (lane == 0) *y = from_float<T>(sum);
  }
}

// Transposed (x's gradient): a thread per (pair, 16-element chunk of K), summing x[p, n] * W[id, n, chunk] over n.
template <typename W, typename T>
__global__ void __launch_bounds__(kThreads) mul_mat_id_transposed(MulMatIdArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c * 16 >= a.k) return;
  const int64_t pairs = a.t * a.n_used;
  for (int64_t p = blockIdx.y; p < pairs; p += gridDim.y) {
    const int32_t id = a.ids[p];
    T* y = static_cast<T*>(a.y) + p * a.k + c * 16;
    const int valid = static_cast<int>(a.k - c * 16 < 16 ? a.k - c * 16 : 16);
    float acc[16] = {};
    if (valid_expert(id, a.e)) {
      const T* x = static_cast<const T*>(a.x) + p * a.n;
      const uint8_t* rows = static_cast<const uint8_t*>(a.w) + id * a.n * a.row_bytes;
      for (int64_t n = 0; n < a.n; ++n) {
        float w[16];
        W::row_chunk(rows + n * a.row_bytes, c, a.k, w);
        const float xn = to_float(x[n]);
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[j] += xn * w[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = NAN;
    }
    for (int j = 0; j < valid; ++j) y[j] = from_float<T>(acc[j]);
  }
}

template <typename T>
KernelLaunch mul_mat_id_launch_typed(const MulMatIdArgs& a, int type, bool transpose) {
  const int64_t pairs = a.t * a.n_used;
  const unsigned grid_y = static_cast<unsigned>(pairs < kMaxGridY ? pairs : kMaxGridY);
  return with_weights(type, [&](auto weights) {
    using W = decltype(weights);
    KernelLaunch l;
    l.block = dim3(kThreads);
    if (transpose) {
      l.kernel = reinterpret_cast<const void*>(&mul_mat_id_transposed<W, T>);
      l.grid = dim3(ceil_div((a.k + 15) / 16, kThreads), grid_y);
    } else {
      l.kernel = reinterpret_cast<const void*>(&mul_mat_id_forward<W, T>);
      l.grid = dim3(ceil_div(a.n, kWarps), grid_y);
    }
    return l;
  });
}

}  // namespace

KernelLaunch mul_mat_id_launch(const MulMatIdArgs& args, int ggml_type, FloatType x_type, bool transpose) {
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType,
                             return mul_mat_id_launch_typed<typename Storage<kType>::type>(args, ggml_type, transpose));
  return {};
}

}  // namespace ggml_ext::cuda
