// The one-step dp4a kernel (decode_fused_kernel, matmul_decode.cu has the design): each block quantizes x into
// its shared memory, then its warps take weight rows as the direct kernel's do.
#pragma once
#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_dp4a.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"

namespace ggml_ext::cuda {
namespace {

// Up to 4 rows of x in one kernel (decode_fused_kernel; rows on 4-byte boundaries, m * k <= kFusedMaxK): no step
// 0. Each block quantizes x into its shared memory (SharedX; what quantize_x_kernel computes, a thread per x-block),
// then its warps take weight rows (or pairs of rows: fused_pair_max_m) in turn, as decode_direct_kernel's warps do
// with one row of x. The grid is at most kFusedBlocksPerSm blocks per multiprocessor, so x is quantized a few
// hundred times rather than once per 8 rows. Each warp used to ask for its first rows in L2 before quantizing;
// once x's codes took full-rate operations (XScale::nearest_int), the kernel was faster without (H100, ncu through
// MLX, m=1, tuning build, GGML_EXT_FUSED_PREFETCH=1 against none in one run, h100-2026-11-26w-fused-prefetch.json:
// 14336x4096 Q4_0 18.1 / 17.3 us, Q4_K 19.3 / 18.0, Q8_0 28.6 / 27.6, Q5_K 21.7 / 20.5, Q4_1 19.0 / 18.2; 4096x14336
// Q5_K 25.3 / 22.9, Q4_0 22.1 / 21.7).
// H100 (bench/cuda_kernel_driver.cu, both steps against this one, bench/results/h100-2026-11-25v-*.json),
// 14336x4096, m=1: Q4_0 18.6 us (19.5), Q4_K 17.5 (22.1), Q5_K 20.2 (25.4), Q8_0 27.3 (28.2), IQ4_XS 21.8 (22.7),
// Q4_1, Q3_K, Q2_K within 3%; Q6_K 27.9 (26.6), so it keeps both steps. On 4096x14336 (one wave of blocks, each
// quantizing all 14336 elements before its first product) it was slower for every format (Q4_0 21.9 against
// 18.0, IQ4_XS 28.2 / 20.8): weights of at most kFewRows rows keep both steps, but where measured otherwise through
// MLX (fused_few_rows_max_m). 2 blocks per multiprocessor were slower (Q4_0 22.8 us), 8 no faster (18.8). More rows
// of x where fused_max_m allows (below).
constexpr int kFusedWarps = 8, kFusedBlocksPerSm = 4;
constexpr int64_t kFusedMaxK = 32768;  // elements of x (m * k): shared memory, 40 bytes per x-block, 40 KB at most

#if defined(GGML_EXT_TUNING)
// Tuning builds: GGML_EXT_FUSED_PREFETCH=1 (set_fused_step copies it here) has each warp of the fused kernel ask for
// its first weight rows in L2 before x is quantized, as it did before x's codes took full-rate operations.
__device__ int g_fused_prefetch;
__device__ __forceinline__ bool fused_prefetch() { return g_fused_prefetch != 0; }
#else
__device__ __forceinline__ constexpr bool fused_prefetch() { return false; }
#endif

// The fused kernels' x: the batch's rows quantized into the shared-memory planes of SharedX, then a barrier.
template <typename T, bool kSkipX, int kXUnroll>
__device__ __forceinline__ SharedX quantize_x_to_planes(const QuantizedMatmulArgs& a, uint4* planes, int64_t z,
                                                        int xblocks) {
  const int all = static_cast<int>(a.m) * xblocks;  // x-blocks of the batch's rows of x, contiguous in x
  const SharedX x{planes, planes + all, reinterpret_cast<const XRecord*>(planes + 2 * all), xblocks};
  if constexpr (!kSkipX) {
    quantize_x_to_shared<T, kXUnroll>(static_cast<const T*>(a.x) + z * a.m * a.k, all,
                                      [&](int xb, uint4 lo, uint4 hi, XRecord r) {
                                        planes[xb] = lo;
                                        planes[all + xb] = hi;
                                        reinterpret_cast<XRecord*>(planes + 2 * all)[xb] = r;
                                      });
  }
  __syncthreads();
  return x;
}

// kRows weight rows per warp at a time (fused_rows). kSkipX: tuning builds' timing of the products alone (x is not
// quantized; the results are meaningless). kXUnroll: x-blocks each thread quantizes at once.
template <class F, int MB, typename T, int kRows, bool kSkipX = false, int kXUnroll = 2>
__global__ void __launch_bounds__(kFusedWarps * 32) decode_fused_kernel(QuantizedMatmulArgs a) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, xblocks = static_cast<int>(a.k / 32);
  const int64_t z = blockIdx.y, warps = static_cast<int64_t>(gridDim.x) * kFusedWarps;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kFusedWarps + warp) * kRows;
  if (fused_prefetch() && first < a.n)
    prefetch_l2_warp(weight_row(a, z, first), a.row_bytes * (a.n - first < kRows ? a.n - first : kRows), lane);
  uint4* planes = dynamic_shared_memory<uint4>();
  const SharedX x = quantize_x_to_planes<T, kSkipX, kXUnroll>(a, planes, z, xblocks);
  constexpr int kG = lane_group<F, kRows>(), kUnroll = 4 / kG;  // four x-blocks' loads in flight per lane
  const int groups = xblocks / kG;
  for (int64_t n = first; n < a.n; n += warps * kRows) {
    WarpDot<F, MB, kRows, SharedX> dot(a, n, x);
#pragma unroll kUnroll
    for (int p = lane; p < groups; p += 32) dot.template add<kG>(dot.rows, p, int64_t{p} * kG);
    dot.template store<T>(lane);
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
