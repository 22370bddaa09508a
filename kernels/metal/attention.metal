// Flash attention on Metal: ggml's flash_attn_ext (GQA, additive mask, causal with a KV-cache offset, softcap,
// sinks), float32 math, one rounding to T at the output. The design of kernels/cuda/attention.cu, in Metal's
// terms. Checked only in the project's Metal emulator (tests/test_metal_emulation_attention.py); it has never
// run on Apple hardware, and nothing here is measured on a GPU.
//
// A threadgroup (4 simdgroups, 128 threads) takes R rows: up to R query heads of one kv head's group times
// query positions (every head of the group at once where they fit, so each key and value row is read once for
// all of them), and walks its range of keys in tiles of 32 with the online softmax (running max m, sum l and
// unnormalized output O per row, in registers; no Tq x Tk matrix exists). Simdgroup s owns rows s, s + 4, ...:
//   1. the queries are staged once in threadgroup memory as floats, pre-scaled (zeros past the head dim);
//   2. scores: the key tile is staged 64 head-dim elements at a time as floats (coalesced loads by all 128
//      threads, 4-element vectors where the rows allow them); lane j dots key j with each of its simdgroup's rows (query reads are broadcasts, key rows
//      padded to 65 floats so the 32 lanes hit 32 banks); then softcap, mask, causal limit;
//   3. softmax: a row's 32 scores are one per lane, so simd_max and simd_sum give the tile's max and sum at
//      once; p goes to threadgroup memory, O is rescaled in registers;
//   4. O += P V: the value tile is staged 64 columns at a time; lane l accumulates columns l and l + 32 of
//      each chunk for its simdgroup's rows (kMaxDim / 32 columns per lane, a compile-time count, so the
//      accumulators stay in registers: 16 or 32 floats per lane).
// Decode (few rows over many keys) splits the keys between threadgroups (grid x) so that the GPU fills: each
// split writes its (m, l, O) to a float32 buffer, and attention_combine merges them and applies the sinks. With
// one split the kernel normalizes and writes y itself. Three kernels per dtype by the larger head dim (up to
// 128, 256, 512): the rows and the accumulators' size are template constants.
//
// Not done (a first version): a threadgroup with a single valid row (decode without GQA) leaves 3 of its 4
// simdgroups idle in steps 2-4 (the key splits supply the parallelism instead); a prefill threadgroup holds
// 16 rows (8 for head dims over 256), so k and v are read once per 16 rows; no half-precision tiles or
// simdgroup matrices for long prefills.
#include "kernels/metal/common.h"

enum {
  kSimdgroups = kAttentionThreads / 32,
  kTileStride = kAttentionChunk + 1,  // floats per staged key or value row
};

#define GGML_EXT_ATTENTION_PARAMS(T)                                                                          \
  device const T *q [[buffer(0)]], device const T *k [[buffer(1)]], device const T *v [[buffer(2)]],           \
      device const float *mask [[buffer(3)]], device const float *sinks [[buffer(4)]], device T *y [[buffer(5)]], \
      device float *partials [[buffer(6)]], constant AttentionArgs &args [[buffer(7)]],                          \
      threadgroup float *shared [[threadgroup(0)]], uint3 group [[threadgroup_position_in_grid]],              \
      uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],                      \
      uint simdgroup [[simdgroup_index_in_threadgroup]]

#define GGML_EXT_ATTENTION_COMBINE_PARAMS(T)                                                           \
  device const float *sinks [[buffer(4)]], device T *y [[buffer(5)]], device const float *partials [[buffer(6)]], \
      constant AttentionArgs &args [[buffer(7)]], uint row [[threadgroup_position_in_grid]],            \
      uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]]

// The factor that turns a row's unnormalized O into y: 1 / l, or 0 for a row that saw no key. A sink joins the
// denominator with exp(sink - m), the max taken over it too (when it exceeds m, O and l shrink by exp(m - sink),
// which is 0 for a row that saw no key: zeros again, as ggml).
inline float output_factor(float m, float l, float sink) {
  if (sink == -INFINITY) return l > 0.0f ? 1.0f / l : 0.0f;
  if (sink > m) {
    const float shrink = precise::exp(m - sink);
    return shrink / (l * shrink + 1.0f);
  }
  return 1.0f / (l + precise::exp(sink - m));
}

inline float sink_of(device const float* sinks, constant AttentionArgs& a, uint b, uint h) {
  return a.has_sinks ? sinks[ulong(b) * a.sinks_batch_stride + h] : -INFINITY;
}

// Where a threadgroup's rows are: query heads h0 + r / queries_per_group, positions i0 + r % queries_per_group.
struct RowBlock {
  uint b, kvh, h0, i0, heads, queries;
  bool valid(uint r, constant AttentionArgs& a) const {
    return r / a.queries_per_group < heads && r % a.queries_per_group < queries;
  }
  uint head(uint r, constant AttentionArgs& a) const { return h0 + r / a.queries_per_group; }
  uint position(uint r, constant AttentionArgs& a) const { return i0 + r % a.queries_per_group; }
};

// Elements [c0, c0 + 64) of rows jt .. jt + 31 of one head's k or v into the tile as floats (row jj at
// jj * kTileStride); zeros past the n rows of this step or past `dim`. Adjacent threads take adjacent elements,
// or adjacent 4-element vectors when `vec4` (unit element stride, rows on 4-element boundaries, dim % 4 == 0).
template <typename T>
inline void stage_tile(threadgroup float* tile, device const T* src, int token_stride, int element_stride, bool vec4,
                       uint jt, uint n, uint c0, uint dim, uint tid) {
  if (vec4) {
    typedef typename Vec4<T>::type V;
    for (uint e = tid; e < kAttentionKeyTile * kAttentionChunk / 4; e += kAttentionThreads) {
      const uint jj = e / (kAttentionChunk / 4), c = 4 * (e % (kAttentionChunk / 4));
      threadgroup float* dst = tile + jj * kTileStride + c;
      if (jj < n && c0 + c < dim) {
        const V x = *(device const V*)(src + long(jt + jj) * token_stride + long(c0 + c));
        for (int u = 0; u < 4; ++u) dst[u] = FloatIO<T>::load(x[u]);
      } else {
        for (int u = 0; u < 4; ++u) dst[u] = 0.0f;
      }
    }
    return;
  }
  for (uint e = tid; e < kAttentionKeyTile * kAttentionChunk; e += kAttentionThreads) {
    const uint jj = e / kAttentionChunk, c = c0 + e % kAttentionChunk;
    float x = 0.0f;
    if (jj < n && c < dim) x = FloatIO<T>::load(src[long(jt + jj) * token_stride + long(c) * element_stride]);
    tile[jj * kTileStride + e % kAttentionChunk] = x;
  }
}

// The score of (row r, key j) after the dot product: softcap, mask, causal limit; -inf outside the tile or the
// rows.
inline float finish_score(float s, uint r, uint j, bool in_tile, device const float* mask, constant AttentionArgs& a,
                          thread const RowBlock& rows) {
  if (!in_tile || !rows.valid(r, a)) return -INFINITY;
  if (a.softcap > 0.0f) s = a.softcap * precise::tanh(s);
  const uint h = rows.head(r, a), i = rows.position(r, a);
  if (a.has_mask) {
    s += mask[ulong(rows.b) * a.mask_strides[0] + ulong(h) * a.mask_strides[1] + ulong(i) * a.mask_strides[2] +
              ulong(j) * a.mask_strides[3]];
  }
  if (a.causal && long(j) > long(i) + long(a.kv_len) - long(a.q_len)) return -INFINITY;
  return s;
}

template <typename T, uint kMaxDim>
[[kernel]] void attention(GGML_EXT_ATTENTION_PARAMS(T)) {
  constexpr uint kRows = attention_rows(kMaxDim), kRowsPerSimd = kRows / kSimdgroups;
  constexpr uint kColsPerLane = kMaxDim / 32, kChunks = kMaxDim / kAttentionChunk;
  constexpr uint kTile = kAttentionKeyTile;
  const uint group_size = args.q_heads / args.kv_heads;
  const uint head_chunk = group.y % args.head_chunks;
  RowBlock rows;
  rows.b = group.z / args.kv_heads;
  rows.kvh = group.z % args.kv_heads;
  rows.h0 = rows.kvh * group_size + head_chunk * args.heads_per_group;
  rows.i0 = group.y / args.head_chunks * args.queries_per_group;
  rows.heads = min(args.heads_per_group, group_size - head_chunk * args.heads_per_group);
  rows.queries = min(args.queries_per_group, args.q_len - rows.i0);
  const uint dq = (args.head_dim + kAttentionChunk - 1) / kAttentionChunk * kAttentionChunk;
  threadgroup float* qs = shared;                          // kRows x dq
  threadgroup float* tile = qs + kRows * dq;               // kTile x kTileStride
  threadgroup float* ps = tile + kTile * kTileStride;      // kRows x kTile

  // 1. Queries times the scale (over the softcap, which then takes tanh of the dot product directly).
  const float factor = args.softcap > 0.0f ? args.scale / args.softcap : args.scale;
  for (uint e = tid; e < kRows * dq; e += kAttentionThreads) {
    const uint r = e / dq, d = e % dq;
    float x = 0.0f;
    if (d < args.head_dim && rows.valid(r, args)) {
      x = FloatIO<T>::load(q[long(rows.b) * args.q_strides[0] + long(rows.head(r, args)) * args.q_strides[1] +
                             long(rows.position(r, args)) * args.q_strides[2] + long(d) * args.q_strides[3]]) *
          factor;
    }
    qs[e] = x;
  }

  // This split's keys, cut at the last key the block's last query sees.
  const uint j_begin = group.x * args.keys_per_split;
  uint j_end = min(j_begin + args.keys_per_split, args.kv_len);
  if (args.causal) {
    const long last = long(rows.i0) + long(rows.queries) + long(args.kv_len) - long(args.q_len);
    if (last < long(j_end)) j_end = last > 0 ? uint(last) : 0u;
  }
  device const T* kh = k + long(rows.b) * args.k_strides[0] + long(rows.kvh) * args.k_strides[1];
  device const T* vh = v + long(rows.b) * args.v_strides[0] + long(rows.kvh) * args.v_strides[1];

  float m[kRowsPerSimd], l[kRowsPerSimd], acc[kRowsPerSimd][kColsPerLane];
  for (uint i = 0; i < kRowsPerSimd; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (uint c = 0; c < kColsPerLane; ++c) acc[i][c] = 0.0f;
  }
  for (uint jt = j_begin; jt < j_end; jt += kTile) {
    const uint n = min(uint(kTile), j_end - jt);
    // 2. Scores of key jt + lane against the simdgroup's rows.
    float s[kRowsPerSimd];
    for (uint i = 0; i < kRowsPerSimd; ++i) s[i] = 0.0f;
    for (uint c0 = 0; c0 < dq; c0 += kAttentionChunk) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the tile's last readers are done (and qs is written)
      stage_tile(tile, kh, args.k_strides[2], args.k_strides[3], args.k_vec4 != 0, jt, n, c0, args.head_dim, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      threadgroup const float* key = tile + lane * kTileStride;
      for (uint i = 0; i < kRowsPerSimd; ++i) {
        threadgroup const float* query = qs + (simdgroup + i * kSimdgroups) * dq + c0;
        float dot = 0.0f;
        for (uint d = 0; d < kAttentionChunk; ++d) dot += query[d] * key[d];
        s[i] += dot;
      }
    }
    // 3. The online softmax, a row per simdgroup step: the tile's 32 scores are one per lane.
    for (uint i = 0; i < kRowsPerSimd; ++i) {
      const uint r = simdgroup + i * kSimdgroups;
      const float x = finish_score(s[i], r, jt + lane, lane < n, mask, args, rows);
      const float m_new = max(m[i], simd_max(x));
      const bool none = m_new == -INFINITY;  // nothing visible yet
      const float p = none ? 0.0f : precise::exp(x - m_new);
      const float alpha = none ? 1.0f : precise::exp(m[i] - m_new);  // 0 after nothing visible
      l[i] = l[i] * alpha + simd_sum(p);
      m[i] = m_new;
      ps[r * kTile + lane] = p;
      for (uint c = 0; c < kColsPerLane; ++c) acc[i][c] *= alpha;
    }
    // 4. O += P V, 64 columns at a time (the barriers below also order the p stores before their reads).
    for (uint chunk = 0; chunk < kChunks; ++chunk) {
      if (chunk * kAttentionChunk >= args.v_dim) break;  // uniform over the threadgroup
      threadgroup_barrier(mem_flags::mem_threadgroup);
      stage_tile(tile, vh, args.v_strides[2], args.v_strides[3], args.v_vec4 != 0, jt, n, chunk * kAttentionChunk,
                 args.v_dim, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (uint j = 0; j < n; ++j) {
        const float v0 = tile[j * kTileStride + lane], v1 = tile[j * kTileStride + lane + 32];
        for (uint i = 0; i < kRowsPerSimd; ++i) {
          const float p = ps[(simdgroup + i * kSimdgroups) * kTile + j];
          acc[i][2 * chunk] += p * v0;
          acc[i][2 * chunk + 1] += p * v1;
        }
      }
    }
  }

  // One split: y = O times output_factor. Several: this split's m, l and O, per output row
  // [split][m, l, O...] (attention_combine's input).
  for (uint i = 0; i < kRowsPerSimd; ++i) {
    const uint r = simdgroup + i * kSimdgroups;
    if (!rows.valid(r, args)) continue;
    const uint h = rows.head(r, args);
    const ulong out_row = (ulong(rows.b) * args.q_heads + h) * args.q_len + rows.position(r, args);
    if (args.splits == 1) {
      const float f = output_factor(m[i], l[i], sink_of(sinks, args, rows.b, h));
      device T* yr = y + out_row * args.v_dim;
      for (uint c = 0; c < kColsPerLane; ++c) {
        const uint col = c / 2 * kAttentionChunk + c % 2 * 32 + lane;
        if (col < args.v_dim) yr[col] = FloatIO<T>::store(acc[i][c] * f);
      }
    } else {
      device float* part = partials + (out_row * args.splits + group.x) * (args.v_dim + 2);
      if (lane == 0) {
        part[0] = m[i];
        part[1] = l[i];
      }
      for (uint c = 0; c < kColsPerLane; ++c) {
        const uint col = c / 2 * kAttentionChunk + c % 2 * 32 + lane;
        if (col < args.v_dim) part[2 + col] = acc[i][c];
      }
    }
  }
}

// One threadgroup per output row: the splits' (m, l, O) merged under their common max, then the sink.
template <typename T>
[[kernel]] void attention_combine(GGML_EXT_ATTENTION_COMBINE_PARAMS(T)) {
  const uint splits = args.splits, stride = args.v_dim + 2;
  device const float* part = partials + ulong(row) * splits * stride;
  float m = -INFINITY;
  for (uint s = 0; s < splits; ++s) m = max(m, part[s * stride]);
  float l = 0.0f;
  for (uint s = 0; s < splits; ++s) {
    if (part[s * stride] != -INFINITY) l += part[s * stride + 1] * precise::exp(part[s * stride] - m);
  }
  const uint h = row / args.q_len % args.q_heads, b = row / (args.q_len * args.q_heads);
  const float f = output_factor(m, l, sink_of(sinks, args, b, h));
  device T* yr = y + ulong(row) * args.v_dim;
  for (uint d = tid; d < args.v_dim; d += threads) {
    float o = 0.0f;
    for (uint s = 0; s < splits; ++s) {
      if (part[s * stride] != -INFINITY) o += part[s * stride + 2 + d] * precise::exp(part[s * stride] - m);
    }
    yr[d] = FloatIO<T>::store(o * f);
  }
}

#define GGML_EXT_INSTANTIATE_ATTENTION_DIM(suffix, T, dim)                   \
  template [[host_name("attention_d" #dim "_" #suffix)]] [[kernel]] void \
  attention<T, dim>(GGML_EXT_ATTENTION_PARAMS(T));
#define GGML_EXT_INSTANTIATE_ATTENTION(suffix, T, unused)                                     \
  GGML_EXT_INSTANTIATE_ATTENTION_DIM(suffix, T, 128)                                          \
  GGML_EXT_INSTANTIATE_ATTENTION_DIM(suffix, T, 256)                                          \
  GGML_EXT_INSTANTIATE_ATTENTION_DIM(suffix, T, 512)                                          \
  template [[host_name("attention_combine_" #suffix)]] [[kernel]] void attention_combine<T>( \
      GGML_EXT_ATTENTION_COMBINE_PARAMS(T));
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_ATTENTION, 0)
