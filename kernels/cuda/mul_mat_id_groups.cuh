// mul_mat_id's step 0 (mul_mat_id.cu has the design): the (token, slot) pairs grouped by expert on the device, from
// the ids the kernel reads itself (no host round trip), into the workspace:
//   offsets: e + 2 int32, offsets[b] the first sorted position of bucket b (buckets 0..e-1 the experts, bucket e
//            the pairs whose id is outside [0, e)), offsets[e + 1] = t * n_used;
//   busy:    e + 2 int32, busy[0] the number of buckets with pairs, busy[1 ..] those buckets in increasing order
//            (the later kernels' blocks take these, not every expert: at most min(e + 1, t * n_used) of them);
//   tiles:   e + 2 int32, tiles[i] the first tile of kTilePairs pairs of busy bucket i (busy[1 + i]) and
//            tiles[busy[0]] the number of tiles: the grouped tensor-core tiles (mul_mat_id_tiles.cuh) map a block
//            to its bucket and tile by a search in it;
//   rank:    t * n_used int32, pair p's position within its bucket (scratch of this step);
//   sorted:  t * n_used int32, the pair indices by bucket (within a bucket in no set order: each pair's output is
//            computed on its own, so the order changes no value);
//   then, 16-byte aligned, what later steps keep there (x's quantized rows).
#pragma once
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kGroupThreads = 256;      // the grouping is one block
constexpr int kSharedBuckets = 4096;    // buckets counted in shared memory (more: in the workspace, global atomics)
constexpr int kTilePairs = 64;          // pairs per tile of the grouped tensor-core tiles (their rows of x)

__host__ __device__ inline int64_t round_up16(int64_t bytes) { return (bytes + 15) / 16 * 16; }
__host__ __device__ inline int64_t pair_count(const MulMatIdArgs& a) { return a.t * a.n_used; }
// Bytes of the four arrays above (where the later steps' part of the workspace starts).
__host__ __device__ inline int64_t groups_bytes(const MulMatIdArgs& a) {
  return 3 * round_up16(4 * (a.e + 2)) + 2 * round_up16(4 * pair_count(a));
}
// Blocks of the later kernels along y: one per bucket that can have pairs, known without reading the ids.
inline unsigned busy_bound(const MulMatIdArgs& a) {
  const int64_t pairs = pair_count(a);
  return static_cast<unsigned>(a.e + 1 < pairs ? a.e + 1 : pairs);
}

struct PairGroups {
  int32_t* offsets;
  int32_t* busy;
  int32_t* tiles;
  int32_t* rank;
  int32_t* sorted;
  __device__ explicit PairGroups(const MulMatIdArgs& a)
      : offsets(static_cast<int32_t*>(a.workspace)),
        busy(offsets + round_up16(4 * (a.e + 2)) / 4),
        tiles(busy + round_up16(4 * (a.e + 2)) / 4),
        rank(tiles + round_up16(4 * (a.e + 2)) / 4),
        sorted(rank + round_up16(4 * pair_count(a)) / 4) {}
  // The bucket of a later kernel's block row y (blockIdx.y), or -1 where fewer buckets have pairs.
  __device__ int bucket_of_block(unsigned y) const { return static_cast<int>(y) < busy[0] ? busy[1 + y] : -1; }
};

__device__ __forceinline__ bool valid_expert(int32_t id, int64_t e) { return id >= 0 && id < e; }
// A pair's bucket: its expert, or e for an id outside [0, e).
__device__ __forceinline__ int bucket_of(int32_t id, int64_t e) {
  return valid_expert(id, e) ? id : static_cast<int>(e);
}

// Step 0, by one block of kGroupThreads (the caller's block 0): a counting sort of the pairs by bucket. Each pair
// takes its rank in its bucket from an atomic count (in shared memory where the buckets fit: one step per pair and
// thread, where the stable ranking it replaced compared every pair with its 255 neighbours); the counts become
// offsets and the list of busy buckets with their first tiles (each thread a span of consecutive buckets, the
// spans' totals scanned across the block), and every pair is written to its place.
__device__ void group_pairs(const MulMatIdArgs& a) {
  __shared__ int shared_count[kSharedBuckets];
  __shared__ int3 scan[kGroupThreads];  // per span: pairs, busy buckets, tiles
  const PairGroups g(a);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pairs = pair_count(a), buckets = a.e + 1;
  int* count = buckets <= kSharedBuckets ? shared_count : g.offsets;  // offsets after the scan
  for (int64_t b = tid; b < buckets; b += kGroupThreads) count[b] = 0;
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kGroupThreads) g.rank[p] = atomicAdd(&count[bucket_of(a.ids[p], a.e)], 1);
  __syncthreads();
  const int64_t span = (buckets + kGroupThreads - 1) / kGroupThreads, first = tid * span;
  const int64_t end = first + span < buckets ? first + span : buckets;
  int3 own{0, 0, 0};
  for (int64_t b = first; b < end; ++b) {
    own.x += count[b];
    own.y += count[b] > 0;
    own.z += (count[b] + kTilePairs - 1) / kTilePairs;
  }
  // Inclusive sums over the threads in log2(kGroupThreads) doubling steps (Hillis-Steele). A serial scan by thread 0
  // took most of this launch's 8.5 us on an H200 at base clocks (ncu, 128 experts).
  scan[tid] = own;
  __syncthreads();
  for (int step = 1; step < kGroupThreads; step *= 2) {
    const int3 before = tid >= step ? scan[tid - step] : int3{0, 0, 0};
    __syncthreads();
    scan[tid].x += before.x;
    scan[tid].y += before.y;
    scan[tid].z += before.z;
    __syncthreads();
  }
  if (tid == kGroupThreads - 1) {
    g.offsets[buckets] = scan[tid].x;
    g.busy[0] = scan[tid].y;
    g.tiles[scan[tid].y] = scan[tid].z;
  }
  __syncthreads();
  int running = scan[tid].x - own.x, next_busy = scan[tid].y - own.y, next_tile = scan[tid].z - own.z;
  for (int64_t b = first; b < end; ++b) {
    const int c = count[b];
    g.offsets[b] = running;  // after reading count[b]: the same element where count is the workspace's
    if (c > 0) {
      g.tiles[next_busy] = next_tile;
      g.busy[1 + next_busy++] = static_cast<int>(b);
      next_tile += (c + kTilePairs - 1) / kTilePairs;
    }
    running += c;
  }
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kGroupThreads) g.sorted[g.offsets[bucket_of(a.ids[p], a.e)] + g.rank[p]] =
      static_cast<int32_t>(p);
}

__global__ void __launch_bounds__(kGroupThreads) group_pairs_kernel(MulMatIdArgs a) { group_pairs(a); }

// Row of x (of t * x_slots) that pair p reads.
__device__ __forceinline__ int64_t x_row_of_pair(const MulMatIdArgs& a, int64_t p) {
  return a.x_slots == 1 ? p / a.n_used : p;
}

// Bucket e (the bad ids, `pairs` of them listed in `list`): NaN in rows n0 .. n0 + rows - 1 (those below n) of
// every such pair's output, a warp's lanes taking them in turn.
template <typename T>
__device__ void store_nan_rows(const MulMatIdArgs& a, const int32_t* list, int64_t pairs, int64_t n0, int rows,
                               int lane) {
  for (int64_t i = lane; i < pairs * rows; i += 32) {
    const int64_t n = n0 + i % rows;
    if (n < a.n) static_cast<T*>(a.y)[list[i / rows] * a.n + n] = from_float<T>(NAN);
  }
}
// The same for the grouped buckets of step 0.
template <typename T>
__device__ void store_nan_rows(const MulMatIdArgs& a, const PairGroups& g, int64_t n0, int rows, int lane) {
  store_nan_rows<T>(a, g.sorted + g.offsets[a.e], g.offsets[a.e + 1] - g.offsets[a.e], n0, rows, lane);
}

}  // namespace
}  // namespace ggml_ext::cuda
