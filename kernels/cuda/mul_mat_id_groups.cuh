// mul_mat_id's step 0 (mul_mat_id.cu has the design): the (token, slot) pairs grouped by expert on the device, from
// the ids the kernel reads itself (no host round trip), into the workspace:
//   offsets: e + 2 int32, offsets[b] the first sorted position of bucket b (buckets 0..e-1 the experts, bucket e
//            the pairs whose id is outside [0, e)), offsets[e + 1] = t * n_used;
//   rank:    t * n_used int32, pair p's position within its bucket (scratch of this step);
//   sorted:  t * n_used int32, the pair indices by bucket, each bucket in increasing pair order (a stable sort);
//   then, 16-byte aligned, what later steps keep there (x's quantized rows).
#pragma once
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kGroupThreads = 256;  // one block; pairs are ranked kGroupThreads at a time

__host__ __device__ inline int64_t round_up16(int64_t bytes) { return (bytes + 15) / 16 * 16; }
__host__ __device__ inline int64_t pair_count(const MulMatIdArgs& a) { return a.t * a.n_used; }
// Bytes of the three arrays above (where the later steps' part of the workspace starts).
__host__ __device__ inline int64_t groups_bytes(const MulMatIdArgs& a) {
  return round_up16(4 * (a.e + 2)) + 2 * round_up16(4 * pair_count(a));
}

struct PairGroups {
  int32_t* offsets;
  int32_t* rank;
  int32_t* sorted;
  __device__ explicit PairGroups(const MulMatIdArgs& a)
      : offsets(static_cast<int32_t*>(a.workspace)),
        rank(offsets + round_up16(4 * (a.e + 2)) / 4),
        sorted(rank + round_up16(4 * pair_count(a)) / 4) {}
};

__device__ __forceinline__ bool valid_expert(int32_t id, int64_t e) { return id >= 0 && id < e; }
// A pair's bucket: its expert, or e for an id outside [0, e).
__device__ __forceinline__ int bucket_of(int32_t id, int64_t e) {
  return valid_expert(id, e) ? id : static_cast<int>(e);
}

// Step 0, one block of kGroupThreads: a counting sort of the pairs by bucket, stable and without atomics. The pairs
// are taken kGroupThreads at a time: each thread ranks its pair among the chunk's earlier pairs of the same bucket
// (a pass over the chunk's buckets in shared memory), its rank in the bucket is that plus the bucket's count so far,
// and the chunk's last pair of each bucket adds the chunk's share to the count. Then the counts become offsets (an
// exclusive scan) and every pair is written to its place. About `pairs` steps per thread (not timed on a GPU yet);
// a decode's n_used pairs are one chunk.
__global__ void __launch_bounds__(kGroupThreads) group_pairs_kernel(MulMatIdArgs a) {
  __shared__ int chunk_buckets[kGroupThreads];
  __shared__ int64_t span_sums[kGroupThreads];
  const PairGroups g(a);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pairs = pair_count(a), buckets = a.e + 1;
  int32_t* count = g.offsets;  // counts first, offsets after the scan
  for (int64_t b = tid; b < buckets; b += kGroupThreads) count[b] = 0;
  __syncthreads();
  for (int64_t base = 0; base < pairs; base += kGroupThreads) {
    const int chunk = static_cast<int>(pairs - base < kGroupThreads ? pairs - base : kGroupThreads);
    const int64_t p = base + tid;
    const int bucket = tid < chunk ? bucket_of(a.ids[p], a.e) : -1;
    chunk_buckets[tid] = bucket;
    __syncthreads();
    int before = 0, same = 0;
    for (int j = 0; j < chunk; ++j) {
      const bool match = chunk_buckets[j] == bucket;
      before += match && j < tid;
      same += match;
    }
    if (bucket >= 0) g.rank[p] = count[bucket] + before;
    __syncthreads();  // every rank read its bucket's count before the count grows
    if (bucket >= 0 && before == same - 1) count[bucket] += same;
    __syncthreads();  // the counts, and chunk_buckets free for the next chunk
  }
  // Exclusive scan of the bucket counts: each thread sums a span of consecutive buckets, thread 0 scans the spans.
  const int64_t span = (buckets + kGroupThreads - 1) / kGroupThreads, first = tid * span;
  const int64_t end = first + span < buckets ? first + span : buckets;
  int64_t sum = 0;
  for (int64_t b = first; b < end; ++b) sum += count[b];
  span_sums[tid] = sum;
  __syncthreads();
  if (tid == 0) {
    int64_t running = 0;
    for (int i = 0; i < kGroupThreads; ++i) {
      const int64_t s = span_sums[i];
      span_sums[i] = running;
      running += s;
    }
    count[buckets] = static_cast<int32_t>(running);
  }
  __syncthreads();
  int64_t running = span_sums[tid];
  for (int64_t b = first; b < end; ++b) {
    const int32_t c = count[b];
    count[b] = static_cast<int32_t>(running);
    running += c;
  }
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kGroupThreads) g.sorted[g.offsets[bucket_of(a.ids[p], a.e)] + g.rank[p]] =
      static_cast<int32_t>(p);
}

// Row of x (of t * x_slots) that pair p reads.
__device__ __forceinline__ int64_t x_row_of_pair(const MulMatIdArgs& a, int64_t p) {
  return a.x_slots == 1 ? p / a.n_used : p;
}

// Bucket e (the bad ids): NaN in rows n0 .. n0 + rows - 1 (those below n) of every pair's output, a warp's lanes
// taking them in turn.
template <typename T>
__device__ void store_nan_rows(const MulMatIdArgs& a, const PairGroups& g, int64_t n0, int rows, int lane) {
  const int64_t first = g.offsets[a.e], pairs = g.offsets[a.e + 1] - first;
  for (int64_t i = lane; i < pairs * rows; i += 32) {
    const int64_t n = n0 + i % rows;
    if (n < a.n) static_cast<T*>(a.y)[g.sorted[first + i / rows] * a.n + n] = from_float<T>(NAN);
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
