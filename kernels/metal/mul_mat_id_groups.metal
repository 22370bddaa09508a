// mul_mat_id's first dispatch: the (token, slot) pairs grouped by expert on the GPU, from the ids it reads
// itself (no host round trip), into the scratch layout of mul_mat_id_groups.h.
//
// One threadgroup of kGroupThreads, a stable counting sort without atomics in three phases:
//   1. count: the pairs are taken kGroupThreads at a time; each thread finds how many of the chunk's pairs
//      share its pair's bucket and how many of them come before it (a pass over the chunk's buckets in
//      threadgroup memory); the chunk's last pair of each bucket adds the chunk's share to the bucket's count.
//   2. offsets: each thread sums the counts of a span of consecutive buckets; a scan over the spans' sums
//      (log2(kGroupThreads) doubling steps in threadgroup memory) gives each span its start; each thread
//      turns its counts into offsets, and copies them as the buckets' write cursors.
//   3. place: the chunks again; each pair goes to its bucket's cursor plus the number of the chunk's
//      earlier pairs of its bucket; the last one of each bucket moves the cursor past the chunk's share.
// Phases 1 and 3 read the ids (tokens x n_used int32, small next to what the product reads), each pass about
// `pairs` comparisons per thread.
#include "kernels/metal/mul_mat_id_groups.h"

enum {
  kGroupThreads = 256,
  kGroupThreadgroupBytes = 2 * kGroupThreads * 4,  // the chunk's buckets, the spans' sums (launch_plans.h)
};

// Among the chunk's `chunk` buckets: how many equal `bucket`, and how many of those come before entry tid.
struct ChunkRank {
  uint before, same;
};
inline ChunkRank rank_in_chunk(threadgroup const uint* chunk_bucket, uint chunk, uint tid, uint bucket) {
  ChunkRank r = {0u, 0u};
  for (uint j = 0; j < chunk; ++j) {
    const bool match = chunk_bucket[j] == bucket;
    r.before += (match && j < tid) ? 1u : 0u;
    r.same += match ? 1u : 0u;
  }
  return r;
}

// Phases 1 and 3: every chunk of pairs ranked; `place` false adds the chunks' shares to counts[bucket],
// true writes each pair at counts[bucket] (the cursors) + its rank and then moves the cursors on.
inline void walk_chunks(device const int* ids, constant MulMatIdArgs& args, device int* counts, device int* sorted,
                        bool place, threadgroup uint* chunk_bucket, uint tid) {
  const uint pairs = args.tokens * args.n_used;
  constexpr uint kNone = 0xffffffffu;  // a thread past the last pair
  for (uint base = 0; base < pairs; base += kGroupThreads) {
    const uint chunk = min(uint(kGroupThreads), pairs - base);
    const uint p = base + tid;
    const uint bucket = tid < chunk ? bucket_of(ids[p], args.experts) : kNone;
    chunk_bucket[tid] = bucket;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const ChunkRank r = rank_in_chunk(chunk_bucket, chunk, tid, bucket);
    if (place && bucket != kNone) sorted[uint(counts[bucket]) + r.before] = int(p);
    threadgroup_barrier(mem_flags::mem_device);  // every cursor read before any moves
    if (bucket != kNone && r.before + 1 == r.same) counts[bucket] += int(r.same);
    // The counts / cursors seen by the next chunk's threads, and chunk_bucket free again.
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  }
}

[[kernel]] void mul_mat_id_group(device const int* ids [[buffer(2)]], constant MulMatIdArgs& args [[buffer(4)]],
                                 device int* scratch [[buffer(5)]], threadgroup uint* shared [[threadgroup(0)]],
                                 uint tid [[thread_index_in_threadgroup]]) {
  threadgroup uint* chunk_bucket = shared;              // [kGroupThreads]
  threadgroup uint* span_sum = shared + kGroupThreads;  // [kGroupThreads]
  device int* offsets = scratch;
  device int* cursor = scratch + cursor_part(args);
  device int* sorted = scratch + sorted_part(args);
  const uint buckets = args.experts + 1;

  for (uint b = tid; b < buckets; b += kGroupThreads) offsets[b] = 0;  // counts until phase 2
  threadgroup_barrier(mem_flags::mem_device);
  walk_chunks(ids, args, offsets, sorted, false, chunk_bucket, tid);

  // Phase 2: thread tid's span of buckets [first, end); an inclusive scan of the spans' sums.
  const uint span = (buckets + kGroupThreads - 1) / kGroupThreads;
  const uint first = min(tid * span, buckets), end = min(first + span, buckets);
  uint own = 0;
  for (uint b = first; b < end; ++b) own += uint(offsets[b]);
  span_sum[tid] = own;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint d = 1; d < kGroupThreads; d *= 2) {
    const uint add = tid >= d ? span_sum[tid - d] : 0u;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    span_sum[tid] += add;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  uint running = span_sum[tid] - own;  // the buckets before this span
  for (uint b = first; b < end; ++b) {
    const uint c = uint(offsets[b]);
    offsets[b] = int(running);
    cursor[b] = int(running);
    running += c;
  }
  if (tid == 0) offsets[buckets] = int(args.tokens * args.n_used);
  threadgroup_barrier(mem_flags::mem_device);

  walk_chunks(ids, args, cursor, sorted, true, chunk_bucket, tid);
}
