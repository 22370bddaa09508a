// mul_mat_id of one token in one kernel (mul_mat_id.cu has the design): where its (token, slot) pairs fit one
// block (n_used <= kOneLaunchPairs: a decode) and its row of x fits the shared memory, every block finds its own expert and pairs from the ids and quantizes the chunk's rows of x itself, so
// the product is one kernel node (in MLX's CUDA graph each node costs host time, ~1-3 us) with no workspace. Also
// here: what this kernel and the two-launch grouped_dot_kernel share (the expert's view, storing the sums).
#pragma once
#include "kernels/cuda/matmul_decode_dp4a.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"
#include "kernels/cuda/mul_mat_id_groups.cuh"

namespace ggml_ext::cuda {
namespace {

// Both dot kernels: warps per block, and rows per warp at MB pairs per chunk (the decode route's rows_per_warp). A
// tuning build may set either (-DGGML_EXT_MMID_WARPS=N, -DGGML_EXT_MMID_ROWS=R for MB >= 2) to time alternatives.
#if defined(GGML_EXT_TUNING) && defined(GGML_EXT_MMID_WARPS)
constexpr int kDotWarps = GGML_EXT_MMID_WARPS;
#else
constexpr int kDotWarps = 4;
#endif
template <int MB>
constexpr int dot_rows_per_warp() {
#if defined(GGML_EXT_TUNING) && defined(GGML_EXT_MMID_ROWS)
  if (MB > 1) return GGML_EXT_MMID_ROWS;
#endif
  return rows_per_warp<MB>();
}
constexpr int kOneLaunchPairs = 64;       // pairs one block groups by itself (one token of up to 64 experts)
constexpr int64_t kOneLaunchShared = 48 * 1024;  // the chunk's quantized rows of x: several blocks per SM
static_assert(kDotWarps * 32 >= kOneLaunchPairs, "a thread per pair");
// Row groups (kDotWarps * R weight rows each) a one-launch block takes in turn on the x it quantized once: the most
// of 1, 2, 4, 8 that leave the grid kOneLaunchMinBlocks blocks. With one group a block read and quantized its row of
// x (4 bytes an element) for 4 weight rows (0.56 bytes an element at Q4_K): the x work was twice the weight's bytes.
// H200, ncu at base clocks, 8 of 128 experts, one token (bench/cuda_mul_mat_id_driver.cu), groups 1 / 2 / 4 / 8:
// Q4_K 768 x 2048 16.0 / 11.9 / 11.7 / 15.0 us, 2048 x 768 24.0 / 17.1 / 14.3 / 15.6 (Q4_0, Q8_0, Q6_K alike):
// the best left 768 and 1024 blocks, fewer (384, 512) left SMs without enough loads in flight.
constexpr int64_t kOneLaunchMinBlocks = 768;
inline int one_launch_groups(int64_t row_groups, int64_t busy) {
  int groups = 8;
  while (groups > 1 && (row_groups + groups - 1) / groups * busy < kOneLaunchMinBlocks) groups /= 2;
  return tuning_int("GGML_EXT_MMID_GROUPS", groups);
}

// The experts as one product of one batch (b2 = a2 = ratio2 = ratio3 = 1, so weight_batch(view, e) is e), m set per
// chunk; x and the workspace as the caller needs them.
__host__ __device__ inline QuantizedMatmulArgs expert_view(const MulMatIdArgs& a) {
  QuantizedMatmulArgs q{};
  q.x = a.x;
  q.w = a.w;
  q.m = a.t * a.x_slots;
  q.n = a.n;
  q.k = a.k;
  q.row_bytes = a.row_bytes;
  q.batches = q.b2 = q.a2 = q.ratio2 = q.ratio3 = 1;
  return q;
}

// Lanes per group of R weight rows in both dot kernels (kLanes): 32, or 16 where a row has too few x-block groups to
// give 32 lanes one each (the down experts of qwen3-30b-a3b, K = 768: 24 x-blocks, 12 pairs of Q4_K sub-blocks, so
// 12 of 32 lanes worked); a warp then takes 32 / kLanes groups of rows side by side, kLanes lanes each. Every lane
// of a warp runs the same loop (the groups of rows past n read the last row and store nothing), so the segments'
// sums can shuffle over the whole warp.
template <int kLanes>
struct SubWarp {
  static constexpr int kGroups = 32 / kLanes;  // groups of rows per warp
  int lane;                                    // within the segment
  int group;                                   // the warp's group this lane works on
  __device__ explicit SubWarp(int warp_lane) : lane(warp_lane % kLanes), group(warp_lane / kLanes) {}
};

// The sums of a segment's R weight rows (n0 ..) with the chunk's m pairs, each into its pair's output row (lane:
// within the segment of kLanes lanes).
template <typename T, int kLanes, class Dot, int MB>
__device__ __forceinline__ void store_pair_sums(const MulMatIdArgs& a, Dot& dot, const int32_t (&pair)[MB], int m,
                                                int64_t n0, int lane) {
#pragma unroll
  for (int r = 0; r < Dot::R; ++r)
#pragma unroll
    for (int i = 0; i < MB; ++i) {
      if (i < m) {
        const float sum = warp_sum<kLanes>(dot.acc[r][i]);
        if (lane == (r * MB + i) % kLanes && n0 + r < a.n)
          static_cast<T*>(a.y)[int64_t{pair[i]} * a.n + n0 + r] = from_float<T>(sum);
      }
    }
}

// Shared memory of one chunk: MB rows of x quantized (SharedX's planes: 40 bytes per x-block).
template <int MB>
inline int64_t one_launch_shared_bytes(const MulMatIdArgs& a) {
  return MB * (a.k / 32) * static_cast<int64_t>(32 + sizeof(XRecord));
}

// Block (bx, y) takes the y-th distinct bucket of the ids in pair order (blocks past the last exit; bucket e, the
// ids outside [0, e), gets NaN rows) and its G row groups of kDotWarps * 32 / kLanes * R weight rows (G from the
// grid's width: the groups of the weight over gridDim.x), warp w's segment s the R rows
// n0 = (((bx * G + g) * kDotWarps + w) * 32 / kLanes + s) * R .. of group g; for each chunk of up to MB of the
// bucket's pairs the block quantizes their rows of x into shared memory (as quantize_x_kernel would) and the warps
// take them as grouped_dot_kernel does, one row group after another.
template <class F, int MB, typename T, int kLanes>
__global__ void __launch_bounds__(kDotWarps * 32) one_launch_dot_kernel(MulMatIdArgs a) {
  constexpr int R = dot_rows_per_warp<MB>();
  using Sub = SubWarp<kLanes>;
  __shared__ int bucket[kOneLaunchPairs], first[kOneLaunchPairs];
  __shared__ int32_t mine[kOneLaunchPairs];
  __shared__ int mine_count, block_bucket;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, pairs = static_cast<int>(pair_count(a));
  // Every thread reaches every barrier: warps past the weight's rows skip only the products.
  if (tid == 0) block_bucket = -1;
  if (tid < pairs) bucket[tid] = bucket_of(a.ids[tid], a.e);
  __syncthreads();
  if (tid < pairs) {
    int is_first = 1;
    for (int j = 0; j < tid; ++j) is_first &= bucket[j] != bucket[tid];
    first[tid] = is_first;
  }
  __syncthreads();
  if (tid < pairs && first[tid]) {
    int before = 0;
    for (int j = 0; j < tid; ++j) before += first[j];
    if (before == static_cast<int>(blockIdx.y)) block_bucket = bucket[tid];  // one thread of the block
  }
  __syncthreads();
  const int b = block_bucket;
  if (b < 0) return;  // the whole block: fewer buckets have pairs than the grid has rows
  if (tid < pairs && bucket[tid] == b) {
    int at = 0;
    for (int j = 0; j < tid; ++j) at += bucket[j] == b;
    mine[at] = tid;
    if (first[tid]) {  // the bucket's first pair counts them
      int count = 0;
      for (int j = tid; j < pairs; ++j) count += bucket[j] == b;
      mine_count = count;
    }
  }
  __syncthreads();
  const int count = mine_count;
  constexpr int kWarpRows = Sub::kGroups * R, kGroupRows = kDotWarps * kWarpRows;  // rows of a warp, of a group
  const int64_t groups_per_block = ((a.n + kGroupRows - 1) / kGroupRows + gridDim.x - 1) / gridDim.x;
  const int64_t warp_row = static_cast<int64_t>(blockIdx.x) * groups_per_block * kGroupRows + tid / 32 * kWarpRows;
  if (b == a.e) {
    for (int64_t g = 0; g < groups_per_block; ++g) {
      const int64_t n0 = warp_row + g * kGroupRows;
      if (n0 < a.n) store_nan_rows<T>(a, mine, count, n0, kWarpRows, lane);
    }
    return;
  }
  const Sub sub(lane);
  const int xblocks = static_cast<int>(a.k / 32), all = MB * xblocks;
  uint4* planes = dynamic_shared_memory<uint4>();
  XRecord* records = reinterpret_cast<XRecord*>(planes + 2 * all);
  const SharedX x{planes, planes + all, records, xblocks};
  QuantizedMatmulArgs view = expert_view(a);
  constexpr int kG = lane_group<F, R>(), kUnroll = 4 / kG;  // as grouped_dot_kernel
  const int groups = xblocks / kG;
  for (int c = 0; c < count; c += MB) {
    const int m = count - c < MB ? count - c : MB;
    int32_t pair[MB];
#pragma unroll
    for (int i = 0; i < MB; ++i) pair[i] = mine[i < m ? c + i : c];
    for (int i = 0; i < m; ++i) {
      quantize_x_to_shared<T>(static_cast<const T*>(a.x) + x_row_of_pair(a, pair[i]) * a.k, xblocks,
                              [&](int xb, uint4 lo, uint4 hi, XRecord r) {
                                planes[i * xblocks + xb] = lo;
                                planes[all + i * xblocks + xb] = hi;
                                records[i * xblocks + xb] = r;
                              });
    }
    __syncthreads();
    view.m = m;
    for (int64_t g = 0; g < groups_per_block; ++g) {
      const int64_t warp_n0 = warp_row + g * kGroupRows;
      if (warp_n0 >= a.n) break;  // the whole warp, and its later groups too
      const int64_t n0 = warp_n0 + sub.group * R;
      WarpDot<F, MB, R, SharedX> dot(view, n0, x, b);
#pragma unroll kUnroll
      for (int p = sub.lane; p < groups; p += kLanes) dot.template add<kG>(dot.rows, p, int64_t{p} * kG);
      store_pair_sums<T, kLanes>(a, dot, pair, m, n0, sub.lane);
    }
    __syncthreads();  // the planes are rewritten by the next chunk
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
