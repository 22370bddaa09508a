// Flash attention on CUDA: ggml's flash_attn_ext (GQA, additive mask, causal, softcap, sinks), float32 math.
//
// A block takes rows of one kv head's group: up to heads_per_block query heads times queries_per_block
// positions (every query head of the group at once where they fit, so each key and value row is read once
// for all of them), and walks its range of keys in tiles with the online softmax (running max m, sum l and
// unnormalized output O per row; no Tq x Tk matrix exists):
//   1. the key tile is staged in shared memory as floats (coalesced loads);
//   2. scores S[r][j] = q_r . k_j, queries pre-scaled in shared memory, a lane per key and a warp per group
//      of rows (the query reads are broadcasts); then softcap, mask and the causal limit;
//   3. a warp per row: the tile's max, p = exp(s - m_new), the new m and l, the factor that rescales O;
//   4. O[r][4c..4c+3] += sum_j p[r][j] v_j[4c..4c+3]: a thread holds four columns of several rows in
//      registers and reads each value row once from global memory for all of them.
// Decode (a few rows over many keys) splits the keys between blocks (grid.x) so that the GPU fills: each
// split writes its (m, l, O), and a second kernel combines them (and applies the sinks). With one split the
// first kernel normalizes and writes y itself: one launch.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRowsPerThread = 16;  // value accumulators: 16 rows x 4 columns in registers
constexpr int kCombineThreads = 128;

__device__ __forceinline__ float negative_infinity() { return -INFINITY; }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The factor that turns a row's unnormalized O into y: 1 / l, or 0 for a row that saw no key. A sink joins the
// denominator with exp(sink - m), the max taken over it too (when it exceeds m, O and l shrink by exp(m - sink),
// which is 0 for a row that saw no key: zeros again).
__device__ __forceinline__ float output_factor(float m, float l, float sink) {
  if (sink == negative_infinity()) return l > 0.0f ? 1.0f / l : 0.0f;
  if (sink > m) {
    const float shrink = expf(m - sink);
    return shrink / (l * shrink + 1.0f);
  }
  return 1.0f / (l + expf(sink - m));
}

__device__ __forceinline__ float sink_of(const AttentionArgs& a, int64_t b, int64_t h) {
  return a.sinks ? a.sinks[b * a.sinks_batch_stride + h] : negative_infinity();
}

__host__ __device__ inline int round_up4(int64_t n) { return static_cast<int>((n + 3) / 4 * 4); }
// Floats per staged query or key row: the head dim rounded to whole float4s, plus 4 when that would put the rows
// of eight consecutive lanes' float4 loads on the same banks (an odd number of float4s per row is conflict-free).
__host__ __device__ inline int row_stride(int64_t head_dim) {
  const int d = round_up4(head_dim);
  return (d / 4) % 2 == 1 ? d : d + 4;
}

// Shared memory (floats): queries rows x stride, keys key_tile x stride, scores rows x (key_tile + 1), m, l and
// the rescale factor per row.
struct SharedLayout {
  int rows, key_tile, stride;
  __host__ __device__ int q() const { return 0; }
  __host__ __device__ int k() const { return rows * stride; }
  __host__ __device__ int s() const { return k() + key_tile * stride; }
  __host__ __device__ int m() const { return s() + rows * (key_tile + 1); }
  __host__ __device__ int l() const { return m() + rows; }
  __host__ __device__ int alpha() const { return l() + rows; }
  __host__ __device__ int floats() const { return alpha() + rows; }
};

// Four consecutive elements (columns c..c+3 of a row) as floats, zeros past `n`.
template <typename T>
__device__ __forceinline__ void load4(const T* row, int64_t element_stride, int c, int64_t n, bool vectors,
                                      float (&f)[4]) {
  if (vectors && c + 4 <= n) {
    load<4>(row + c, f);
    return;
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) f[u] = c + u < n ? to_float(row[(c + u) * element_stride]) : 0.0f;
}

template <typename T>
class Block {
 public:
  __device__ Block(const AttentionArgs& a) : a_(a), t_(a.tiling) {
    const int64_t group = a.q_heads / a.kv_heads;
    const int head_chunk = static_cast<int>(blockIdx.y % t_.head_chunks);
    i0_ = static_cast<int64_t>(blockIdx.y / t_.head_chunks) * t_.queries_per_block;
    b_ = blockIdx.z / a.kv_heads;
    kvh_ = blockIdx.z % a.kv_heads;
    h0_ = kvh_ * group + static_cast<int64_t>(head_chunk) * t_.heads_per_block;
    const int64_t heads_left = group - static_cast<int64_t>(head_chunk) * t_.heads_per_block;
    heads_ = heads_left < t_.heads_per_block ? static_cast<int>(heads_left) : t_.heads_per_block;
    const int64_t queries_left = a.q_len - i0_;
    queries_ = queries_left < t_.queries_per_block ? static_cast<int>(queries_left) : t_.queries_per_block;
    rows_ = t_.heads_per_block * t_.queries_per_block;
    layout_ = SharedLayout{rows_, t_.key_tile, row_stride(a.head_dim)};
    j_begin_ = blockIdx.x * t_.keys_per_split;
    j_end_ = j_begin_ + t_.keys_per_split < a.kv_len ? j_begin_ + t_.keys_per_split : a.kv_len;
    if (a.causal) {  // no key past the last query's last visible one
      const int64_t last = i0_ + queries_ + (a.kv_len - a.q_len);
      if (last < j_end_) j_end_ = last;
    }
    shared_ = dynamic_shared_memory<float>();
  }

  void __device__ run() {
    load_queries();
    for (int r = threadIdx.x; r < rows_; r += kThreads) {
      shared_[layout_.m() + r] = negative_infinity();
      shared_[layout_.l() + r] = 0.0f;
    }
    ValueColumns cols(a_.v_dim, rows_);
    float acc[kMaxRowsPerThread][4] = {};
    for (int64_t jt = j_begin_; jt < j_end_; jt += t_.key_tile) {
      const int n = j_end_ - jt < t_.key_tile ? static_cast<int>(j_end_ - jt) : t_.key_tile;
      load_keys(jt, n);
      __syncthreads();
      scores(jt, n);
      __syncthreads();
      softmax();
      __syncthreads();
      if (cols.active) accumulate_values(cols, jt, n, acc);
    }
    __syncthreads();
    if (cols.active) write(cols, acc);
  }

 private:
  // Which value columns and rows a thread accumulates: columns 4c..4c+3 for c = thread % groups of four columns,
  // rows tr, tr + row_step, ... for tr = thread / groups.
  struct ValueColumns {
    int c, tr, row_step, rows_per_thread;
    bool active;
    __device__ ValueColumns(int64_t v_dim, int rows) {
      const int groups = round_up4(v_dim) / 4;
      row_step = kThreads / groups;
      c = threadIdx.x % groups;
      tr = threadIdx.x / groups;
      rows_per_thread = (rows + row_step - 1) / row_step;
      active = tr < row_step;
    }
  };

  __device__ bool valid(int r) const { return r / t_.queries_per_block < heads_ && r % t_.queries_per_block < queries_; }
  __device__ int64_t head(int r) const { return h0_ + r / t_.queries_per_block; }
  __device__ int64_t position(int r) const { return i0_ + r % t_.queries_per_block; }

  // Queries as floats times the scale (over the softcap, which then takes tanh of the dot product directly);
  // zeros in the padding and in rows past the group or the queries.
  __device__ void load_queries() {
    const float factor = a_.softcap > 0.0f ? a_.scale / a_.softcap : a_.scale;
    const int d_pad = round_up4(a_.head_dim);
    const T* q = static_cast<const T*>(a_.q);
    for (int e = threadIdx.x; e < rows_ * d_pad; e += kThreads) {
      const int r = e / d_pad, d = e % d_pad;
      float x = 0.0f;
      if (d < a_.head_dim && valid(r)) {
        x = to_float(q[b_ * a_.q_strides[0] + head(r) * a_.q_strides[1] + position(r) * a_.q_strides[2] +
                       d * a_.q_strides[3]]) * factor;
      }
      shared_[layout_.q() + r * layout_.stride + d] = x;
    }
  }

  __device__ void load_keys(int64_t jt, int n) {
    const int groups = round_up4(a_.head_dim) / 4;
    const T* k = static_cast<const T*>(a_.k) + b_ * a_.k_strides[0] + kvh_ * a_.k_strides[1];
    for (int e = threadIdx.x; e < n * groups; e += kThreads) {
      const int jj = e / groups, c = 4 * (e % groups);
      float f[4];
      load4(k + (jt + jj) * a_.k_strides[2], a_.k_strides[3], c, a_.head_dim, t_.k_vectors, f);
      float* dst = shared_ + layout_.k() + jj * layout_.stride + c;
#pragma unroll
      for (int u = 0; u < 4; ++u) dst[u] = f[u];
    }
  }

  // S[r][jj] for the tile's n keys (-inf past them): lane jj % key_tile of row group threadIdx / key_tile takes
  // rows g, g + groups, ..., four at a time so that each key float4 serves four query float4s.
  __device__ void scores(int64_t jt, int n) {
    const int kt = t_.key_tile, groups = kThreads / kt;
    const int jj = threadIdx.x % kt, g = threadIdx.x / kt;
    const int d_pad = round_up4(a_.head_dim);
    const float* krow = shared_ + layout_.k() + jj * layout_.stride;
    for (int r0 = g; r0 < rows_; r0 += 4 * groups) {
      float acc[4] = {};
      const float* qrow[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u * groups < rows_ ? r0 + u * groups : r0;
        qrow[u] = shared_ + layout_.q() + r * layout_.stride;
      }
      if (jj < n) {
        for (int d = 0; d < d_pad; d += 4) {
          const float4 kv = *reinterpret_cast<const float4*>(krow + d);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float4 qv = *reinterpret_cast<const float4*>(qrow[u] + d);
            acc[u] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u * groups;
        if (r < rows_) shared_[layout_.s() + r * (kt + 1) + jj] = finish_score(acc[u], r, jt + jj, jj < n);
      }
    }
  }

  __device__ float finish_score(float s, int r, int64_t j, bool in_tile) const {
    if (!in_tile || !valid(r)) return negative_infinity();
    if (a_.softcap > 0.0f) s = a_.softcap * tanhf(s);
    if (a_.mask) {
      s += a_.mask[b_ * a_.mask_strides[0] + head(r) * a_.mask_strides[1] + position(r) * a_.mask_strides[2] +
                   j * a_.mask_strides[3]];
    }
    if (a_.causal && j > position(r) + (a_.kv_len - a_.q_len)) return negative_infinity();
    return s;
  }

  // A warp per row: the tile's probabilities replace its scores; m, l and O's rescale factor move on.
  __device__ void softmax() {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kt = t_.key_tile;
    for (int r = warp; r < rows_; r += kWarps) {
      float* s = shared_ + layout_.s() + r * (kt + 1);
      float tile_max = negative_infinity();
      for (int jj = lane; jj < kt; jj += 32) tile_max = fmaxf(tile_max, s[jj]);
      tile_max = warp_max(tile_max);
      const float m_old = shared_[layout_.m() + r];
      const float m_new = fmaxf(m_old, tile_max);
      const bool none = m_new == negative_infinity();  // nothing visible yet
      float sum = 0.0f;
      for (int jj = lane; jj < kt; jj += 32) {
        const float p = none ? 0.0f : expf(s[jj] - m_new);
        s[jj] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = none ? 1.0f : expf(m_old - m_new);  // 0 after nothing visible
        shared_[layout_.l() + r] = shared_[layout_.l() + r] * alpha + sum;
        shared_[layout_.m() + r] = m_new;
        shared_[layout_.alpha() + r] = alpha;
      }
    }
  }

  __device__ void accumulate_values(const ValueColumns& cols, int64_t jt, int n, float (&acc)[kMaxRowsPerThread][4]) {
    const int kt = t_.key_tile;
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      const int r = cols.tr + i * cols.row_step;
      if (i < cols.rows_per_thread && r < rows_) {
        const float alpha = shared_[layout_.alpha() + r];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[i][u] *= alpha;
      }
    }
    const T* v = static_cast<const T*>(a_.v) + b_ * a_.v_strides[0] + kvh_ * a_.v_strides[1];
    const float* p = shared_ + layout_.s();
#pragma unroll 2
    for (int jj = 0; jj < n; ++jj) {
      float vf[4];
      load4(v + (jt + jj) * a_.v_strides[2], a_.v_strides[3], 4 * cols.c, a_.v_dim, t_.v_vectors, vf);
#pragma unroll
      for (int i = 0; i < kMaxRowsPerThread; ++i) {
        const int r = cols.tr + i * cols.row_step;
        if (i < cols.rows_per_thread && r < rows_) {
          const float pj = p[r * (kt + 1) + jj];
#pragma unroll
          for (int u = 0; u < 4; ++u) acc[i][u] += pj * vf[u];
        }
      }
    }
  }

  // One split: y = O times output_factor. Several: this split's m, l and O into the workspace, per output row
  // [split][m, l, O...] (the combine kernel's input).
  __device__ void write(const ValueColumns& cols, const float (&acc)[kMaxRowsPerThread][4]) {
    const int64_t dv = a_.v_dim;
    const int c = 4 * cols.c;
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      const int r = cols.tr + i * cols.row_step;
      if (!(i < cols.rows_per_thread && r < rows_ && valid(r))) continue;
      const int64_t out_row = (b_ * a_.q_heads + head(r)) * a_.q_len + position(r);
      const float m = shared_[layout_.m() + r], l = shared_[layout_.l() + r];
      if (t_.splits == 1) {
        const float f = output_factor(m, l, sink_of(a_, b_, head(r)));
        T* y = static_cast<T*>(a_.y) + out_row * dv;
        float o[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) o[u] = acc[i][u] * f;
        if (dv % 4 == 0) {
          store<4>(y + c, o);
        } else {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (c + u < dv) y[c + u] = from_float<T>(o[u]);
          }
        }
      } else {
        float* part = static_cast<float*>(a_.workspace) + (out_row * t_.splits + blockIdx.x) * (dv + 2);
        if (cols.c == 0) {
          part[0] = m;
          part[1] = l;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (c + u < dv) part[2 + c + u] = acc[i][u];
        }
      }
    }
  }

  const AttentionArgs& a_;
  const AttentionArgs::Tiling& t_;
  SharedLayout layout_;
  float* shared_;
  int64_t i0_, b_, kvh_, h0_, j_begin_, j_end_;
  int heads_, queries_, rows_;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  Block<T> block(a);
  block.run();
}

// One block per output row (grid-stride): the splits' (m, l, O) merged under their common max, then the sink.
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(AttentionArgs a) {
  const int splits = a.tiling.splits;
  const int64_t dv = a.v_dim, stride = dv + 2, rows = a.batch * a.q_heads * a.q_len;
  const float none = negative_infinity();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* part = static_cast<const float*>(a.workspace) + row * splits * stride;
    float m = none;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, part[s * stride]);
    float l = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (part[s * stride] != none) l += part[s * stride + 1] * expf(part[s * stride] - m);
    }
    const int64_t h = row / a.q_len % a.q_heads, b = row / (a.q_len * a.q_heads);
    const float f = output_factor(m, l, sink_of(a, b, h));
    T* y = static_cast<T*>(a.y) + row * dv;
    for (int64_t d = threadIdx.x; d < dv; d += kCombineThreads) {
      float o = 0.0f;
      for (int s = 0; s < splits; ++s) {
        if (part[s * stride] != none) o += part[s * stride + 2 + d] * expf(part[s * stride] - m);
      }
      y[d] = from_float<T>(o * f);
    }
  }
}

// Whether four elements at a time can be read as one aligned word: unit element stride, a head dim of whole
// fours, and every row starting at a multiple of four elements of an aligned base.
bool vectors_ok(const void* base, const int64_t (&strides)[4], int64_t dim, int element_bytes) {
  return strides[3] == 1 && dim % 4 == 0 && aligned(base, 4 * element_bytes) && strides[0] % 4 == 0 &&
         strides[1] % 4 == 0 && strides[2] % 4 == 0;
}

template <FloatType kType>
AttentionPlan attention_plan_typed(AttentionArgs& a) {
  using T = typename Storage<kType>::type;
  AttentionPlan plan;
  auto& t = a.tiling;
  if (a.head_dim < 1 || a.v_dim < 1 || a.head_dim > kAttentionMaxHeadDim || a.v_dim > kAttentionMaxHeadDim ||
      a.kv_heads < 1 || a.q_heads % a.kv_heads != 0) {
    return plan;
  }
  const int64_t group = a.q_heads / a.kv_heads;
  const int value_groups = round_up4(a.v_dim) / 4;  // at most 128 = kThreads
  const int row_step = kThreads / value_groups;
  // Rows per block: as many as the registers of the value accumulators and the shared tiles allow.
  int max_rows = round_up4(a.head_dim) <= 128 && round_up4(a.v_dim) <= 128 ? 64 : a.head_dim <= 256 ? 32 : 16;
  if (max_rows > kMaxRowsPerThread * row_step) max_rows = kMaxRowsPerThread * row_step;
  t.heads_per_block = static_cast<int>(group < max_rows ? group : max_rows);
  const int64_t queries = max_rows / t.heads_per_block;
  t.queries_per_block = static_cast<int>(a.q_len < queries ? (a.q_len > 0 ? a.q_len : 1) : queries);
  t.head_chunks = static_cast<int>((group + t.heads_per_block - 1) / t.heads_per_block);
  const int rows = t.heads_per_block * t.queries_per_block;
  // Few rows (decode): long key tiles keep every lane of the score step busy; the staged keys stay within about
  // 40 KB, so that several blocks share a multiprocessor and hide each other's loads.
  t.key_tile = rows <= 8 ? 128 : rows <= 16 ? 64 : 32;
  while (t.key_tile > 32 && t.key_tile * row_stride(a.head_dim) * 4 > 40 * 1024) t.key_tile /= 2;
  auto shared_bytes = [&] { return 4 * SharedLayout{rows, t.key_tile, row_stride(a.head_dim)}.floats(); };
  // Split the keys until the GPU has about three blocks per multiprocessor, each split at least two key tiles
  // (a split's fixed costs: its queries, its partial results).
  const int64_t q_chunks = (a.q_len + t.queries_per_block - 1) / t.queries_per_block;
  const int64_t blocks = a.batch * a.kv_heads * t.head_chunks * q_chunks;
  const int sms = multiprocessor_count();
  const int64_t target = 3 * static_cast<int64_t>(sms > 0 ? sms : 132);
  const int64_t tiles = (a.kv_len + t.key_tile - 1) / t.key_tile;
  int64_t splits = blocks >= target ? 1 : (target + blocks - 1) / blocks;
  if (splits > tiles / 2) splits = tiles / 2 > 0 ? tiles / 2 : 1;
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  t.keys_per_split = (tiles_per_split > 0 ? tiles_per_split : 1) * t.key_tile;
  t.splits = static_cast<int>(splits > 1 ? (a.kv_len + t.keys_per_split - 1) / t.keys_per_split : 1);
  t.k_vectors = vectors_ok(a.k, a.k_strides, a.head_dim, sizeof(T));
  t.v_vectors = vectors_ok(a.v, a.v_strides, a.v_dim, sizeof(T));
  const int64_t grid_y = q_chunks * t.head_chunks, grid_z = a.batch * a.kv_heads;
  if (grid_y > 65535 || grid_z > 65535) return plan;  // beyond the grid's y and z limits
  KernelLaunch& main = plan.steps[0];
  main.kernel = reinterpret_cast<const void*>(&attention_kernel<T>);
  main.grid = dim3(t.splits, static_cast<unsigned>(grid_y), static_cast<unsigned>(grid_z));
  main.block = dim3(kThreads);
  main.shared_bytes = shared_bytes();
  if (t.splits > 1) {
    const int64_t out_rows = a.batch * a.q_heads * a.q_len;
    plan.workspace_bytes = out_rows * t.splits * (a.v_dim + 2) * static_cast<int64_t>(sizeof(float));
    KernelLaunch& combine = plan.steps[1];
    combine.kernel = reinterpret_cast<const void*>(&combine_kernel<T>);
    combine.grid = dim3(static_cast<unsigned>(out_rows < (1 << 20) ? out_rows : (1 << 20)));
    combine.block = dim3(kCombineThreads);
  }
  return plan;
}

}  // namespace

AttentionPlan attention_plan(AttentionArgs& args, FloatType type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(type, kType, return attention_plan_typed<kType>(args));
  return {};
}

}  // namespace ggml_ext::cuda
