// Tiles (prefill, and the transposed product of the vjp): 64x64 outputs per block, the weight decoded 32
// reduction steps at a time into shared memory in x's type, then tensor cores (WMMA, float32 accumulation)
// for float16/bfloat16 x, or float32 FMAs for float32 x (no precision lost to the inputs).
#include "kernels/cuda/matmul_common.cuh"
// Tensor cores (WMMA, bfloat16 included) under nvcc for sm_80 and newer (and in the host emulation of
// tests/cuda_emulation, which supplies the API); for an older target a build asks for, float32 FMAs.
#if defined(GGML_EXT_CUDA_EMULATION)
#define GGML_EXT_CUDA_WMMA 1
#elif defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define GGML_EXT_CUDA_WMMA 1
#include <mma.h>
#else
#define GGML_EXT_CUDA_WMMA 0
#endif
namespace ggml_ext::cuda {
namespace {
constexpr int kTileM = 64, kTileOut = 64, kTileReduce = 32, kTileThreads = 128;
constexpr int kPadX = 8, kPadW = 8, kPadOut = 4;  // keep WMMA's 32-byte row alignment, spread the banks
template <typename T>
using XTile = T[kTileM][kTileReduce + kPadX];
template <typename T>
using WTile = T[kTileReduce][kTileOut + kPadW];  // the weight as (reduction, output)

// The 64x64 float32 accumulators of a tile, with the multiply of one (x, weight) pair of shared tiles.
// FMAs: each thread owns 8 rows x 4 outputs; each 32-step tile is summed on its own before it is added, which
// keeps float32 rounding over long reductions near that of a pairwise sum.
template <typename T>
struct FmaAccumulators {
  float acc[8][4] = {};
  __device__ int row() const { return (threadIdx.x / 16) * 8; }
  __device__ int col() const { return (threadIdx.x % 16) * 4; }
  __device__ void multiply(const XTile<T>& xs, const WTile<T>& ws) {
    float part[8][4] = {};
#pragma unroll 8
    for (int r = 0; r < kTileReduce; ++r) {
      float xv[8], wv[4];
#pragma unroll
      for (int i = 0; i < 8; ++i) xv[i] = to_float(xs[row() + i][r]);
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = to_float(ws[r][col() + j]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] += xv[i] * wv[j];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += part[i][j];
  }
  // out(i, j, value) for the tile's row i and output j.
  template <typename Out>
  __device__ void store(Out&& out) const {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) out(row() + i, col() + j, acc[i][j]);
  }
};

#if GGML_EXT_CUDA_WMMA
// Tensor cores: 2x2 warps, each 2x2 fragments of 16x16.
template <typename T>
struct WmmaAccumulators {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
  __device__ int warp_row() const { return (threadIdx.x / 32 / 2) * 32; }
  __device__ int warp_col() const { return (threadIdx.x / 32 % 2) * 32; }
  __device__ WmmaAccumulators() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
  }
  __device__ void multiply(const XTile<T>& xs, const WTile<T>& ws) {
    namespace wmma = nvcuda::wmma;
#pragma unroll
    for (int kk = 0; kk < kTileReduce; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &xs[warp_row() + 16 * i][kk], kTileReduce + kPadX);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &ws[kk][warp_col() + 16 * j], kTileOut + kPadW);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  // Through shared memory: fragments have no documented element layout. Called by the whole block.
  template <typename Out>
  __device__ void store(Out&& out) const {
    __shared__ __align__(128) float tile[kTileM][kTileOut + kPadOut];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        nvcuda::wmma::store_matrix_sync(&tile[warp_row() + 16 * i][warp_col() + 16 * j], acc[i][j],
                                        kTileOut + kPadOut, nvcuda::wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < kTileM * kTileOut; e += kTileThreads) out(e / kTileOut, e % kTileOut, tile[e / kTileOut][e % kTileOut]);
  }
};
template <typename T>
using Accumulators = std::conditional_t<std::is_same_v<T, float>, FmaAccumulators<T>, WmmaAccumulators<T>>;
#else
template <typename T>
using Accumulators = FmaAccumulators<T>;
#endif

// Output tile (kTileM rows of x) x (kTileOut outputs); the reduction runs over k (forward) or n (transposed).
template <typename Weights, typename T, bool kTranspose>
__global__ void __launch_bounds__(kTileThreads) tiled_kernel(QuantizedMatmulArgs a) {
  __shared__ __align__(128) XTile<T> xs;
  __shared__ __align__(128) WTile<T> ws;
  const int t = threadIdx.x;
  const int64_t z = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileOut;
  const int64_t reduce = kTranspose ? a.n : a.k;
  const int64_t outs = kTranspose ? a.k : a.n;
  const T* x = static_cast<const T*>(a.x) + z * a.m * reduce;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + weight_batch(a, z) * a.n * a.row_bytes;

  Accumulators<T> acc;
  for (int64_t r0 = 0; r0 < reduce; r0 += kTileReduce) {
    {  // x tile: thread t fills 16 elements of row t / 2
      const int i = t / 2, j0 = 16 * (t % 2);
      const int64_t m = m0 + i;
      float v[16];
      if (m < a.m) {
        load_x_chunk(x + m * reduce, (r0 + j0) / 16, reduce, false, v);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) xs[i][j0 + j] = from_float<T>(v[j]);
    }
    {  // weight tile: one 16-element chunk of a weight row per thread
      float v[16];
      const int64_t n = kTranspose ? r0 + t / 4 : o0 + t / 2;
      const int64_t chunk = kTranspose ? o0 / 16 + t % 4 : r0 / 16 + t % 2;
      if (n < a.n && chunk * 16 < a.k) {
        Weights::row_chunk(w + n * a.row_bytes, chunk, a.k, v);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = 0.0f;
      }
      if constexpr (kTranspose) {
#pragma unroll
        for (int j = 0; j < 16; ++j) ws[t / 4][16 * (t % 4) + j] = from_float<T>(v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) ws[16 * (t % 2) + j][t / 2] = from_float<T>(v[j]);
      }
    }
    __syncthreads();
    acc.multiply(xs, ws);
    __syncthreads();
  }
  acc.store([&](int i, int j, float v) {
    if (m0 + i < a.m && o0 + j < outs) store_output<T>(a, (z * a.m + m0 + i) * outs + o0 + j, v);
  });
}
template <typename T, typename Weights>
QuantizedMatmulPlan plan_for(const QuantizedMatmulArgs& a, bool transpose) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  l.kernel = transpose ? reinterpret_cast<const void*>(&tiled_kernel<Weights, T, true>)
                       : reinterpret_cast<const void*>(&tiled_kernel<Weights, T, false>);
  l.grid = dim3(ceil_div(transpose ? a.k : a.n, kTileOut), ceil_div(a.m, kTileM), static_cast<unsigned>(a.batches));
  l.block = dim3(kTileThreads);
  return p;
}
}  // namespace
QuantizedMatmulPlan tiles_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type, bool transpose) {
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, return with_weights(ggml_type, [&](auto weights) {
    return plan_for<typename Storage<kType>::type, decltype(weights)>(args, transpose);
  }));
  return {};
}
}  // namespace ggml_ext::cuda
