// A key/value cache update's copies (csrc/kv_cache.h, RowsCopyArgs in params.h): one thread per element, moved as
// a 16- or 32-bit word. Memory-bound and small at decode (a token's keys of every head: a few KB); the whole-cache
// copy happens only when MLX could not hand the cache's buffer over or it is full (every `step` rows).
#include "kernels/metal/common.h"

// Grid x: threadgroups along a (batch, head)'s rows * dim elements; grid y: the (batch, head).
#define GGML_EXT_ROWS_COPY_PARAMS(W)                                                                     \
  device const W *src [[buffer(0)]], device W *dst [[buffer(1)]], constant RowsCopyArgs &args [[buffer(2)]], \
      uint2 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],               \
      uint threads [[threads_per_threadgroup]]

template <typename W>
[[kernel]] void rows_copy(GGML_EXT_ROWS_COPY_PARAMS(W)) {
  const uint i = group.x * threads + tid;  // the host keeps rows * dim within 32 bits
  if (i >= args.rows * args.dim) return;
  const uint r = i / args.dim, d = i % args.dim;
  const uint b = group.y / args.heads, h = group.y % args.heads;
  // 64-bit offsets: a cache's elements pass 2^32 long before one head's rows do
  const long from = long(b) * args.strides[0] + long(h) * args.strides[1] + long(r) * args.strides[2] +
                    long(d) * args.strides[3];
  const ulong to = (ulong(group.y) * args.dst_rows + args.row0 + r) * args.dim + d;
  dst[to] = src[from];
}

template [[host_name("rows_copy_u16")]] [[kernel]] void rows_copy<ushort>(GGML_EXT_ROWS_COPY_PARAMS(ushort));
template [[host_name("rows_copy_u32")]] [[kernel]] void rows_copy<uint>(GGML_EXT_ROWS_COPY_PARAMS(uint));
