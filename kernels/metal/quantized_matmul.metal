// The QuantizedMatmul primitive (csrc/quantized_matmul.h): x (B3, B2, M, Kx) times a weight stored as
// ggml blocks (A3, A2, N, row_bytes), computed on the blocks: the dequantized weight only ever exists in
// threadgroup tiles. Sums in float32. Decode (M <= 8) is in decode.metal.
//   qmm_<type>_<x dtype>:   prefill: out = x W^T on 64 x 32 output tiles with simdgroup matrices.
//   qmm_t_<type>_<x dtype>: the transposed product out = x W (x's gradient), the same tiles.
//
// Threadgroup (x: 32 output columns, y: 64 rows of x, z: batch), 4 simdgroups; simdgroup s owns the
// 32 x 16 sub-tile at rows 32 * (s / 2), columns 16 * (s % 2): 4 x 2 accumulators of 8 x 8
// (simdgroup_float8x8). The reduction runs in steps of 32; per step, in threadgroup memory:
//   - the x tile, 64 rows x 32 elements, as float: read as 4-element vectors (float4, half4, ushort4 for
//     bfloat16) by adjacent lanes when x's rows allow, element by element otherwise;
//   - the weight tile, 32 weight rows x 32 elements, decoded to float once per threadgroup (64 runs of 16
//     by the shared decoders, kernels/common/ggml_blocks.h: every format read as the CPU reads it) from
//   - the weight rows' raw bytes, staged once per stage of 256 elements (quantized types: one K-quant
//     block or 8 blocks of 32; 64 elements for float types) with 16-byte words read by adjacent lanes, so
//     each weight byte is requested once per row tile of x.
// Each simdgroup then multiplies its sub-tile: 4 k-slices of 8, simdgroup_load / multiply_accumulate.
// Edges: rows past M and elements past the reduction are staged as zeros (the products add nothing), and
// the output goes out through threadgroup memory with guarded stores, so no test sits in the inner loop.
#include "kernels/metal/matmul_common.h"

enum {
  kTileM = 64,          // rows of x per threadgroup
  kTileN = 32,          // output columns per threadgroup
  kTileK = 32,          // reduction elements per step
  kTileThreads = 128,   // 4 simdgroups of 32 x 16
  kQuantStage = 256,    // raw weight elements staged at once: quantized types,
  kFloatStage = 64,     // float types (a 128-byte line of float16 / bfloat16)
};

// The raw weight stage of a weight type: elements per stage and the threadgroup bytes per weight row (its
// bytes of a stage plus up to 15 bytes of alignment pad, so a byte keeps its device address modulo 16 and
// the copy runs in aligned 16-byte words, plus up to 128 bytes staged ahead for the next stage). launch_plans.h (plan_matmul) computes the same sizes.
template <typename D>
struct PrefillShape {
  enum {
    stage = D::is_float ? kFloatStage : kQuantStage,
    span = (stage / D::block_size) * D::block_bytes,
    row_stage = (span + 15 + 15) / 16 * 16 + 128,  // + the words carried to the next stage
    x_tile = kTileM * kTileK,  // floats
    w_tile = kTileN * kTileK,  // floats
  };
};

// Copies to a row's slot `dst` the 16-byte words that hold bytes [b0, b0 + n) of the weight matrix
// (`matrix`, `total` bytes long, whose first byte sits at address matrix_line modulo 128), word i by lane
// i % 32 (adjacent lanes, adjacent aligned words); byte b0 lands at dst + (matrix_line + b0) % 16.
// Addresses below are relative: matrix_line + byte offset. With `carry` (the forward product, whose stages
// take consecutive bytes of a row), the copy runs on to the next 128-byte line boundary (or the row's
// end, row_end bytes into the matrix) and `copied_end`
// remembers where it stopped: the next stage moves those words (under 128 bytes) to the slot's front and
// starts after them, so each line of a row is requested once. A word reaching outside the matrix (the
// first row's first word, the last row's last, when the matrix is not 16-byte aligned) is copied byte by
// byte, only its bytes inside the matrix: no load leaves the weight buffer.
inline void stage_row(threadgroup uchar* dst, device const uchar* matrix, uint matrix_line, size_t total,
                      size_t b0, uint n, size_t row_end, bool carry, thread size_t& slot_lo,
                      thread size_t& copied_end, uint lane) {
  const size_t begin = matrix_line, end = matrix_line + total;
  const size_t lo = (begin + b0) / 16 * 16;  // the first word needed
  const size_t need_end = (begin + b0 + n + 15) / 16 * 16;
  threadgroup uint4* words = (threadgroup uint4*)dst;
  size_t from = lo;
  if (carry && copied_end > lo) {  // words [lo, copied_end) are staged already, at slot word lo - slot_lo
    const uint kept = uint(copied_end - lo) / 16, shift = uint(lo - slot_lo) / 16;  // kept <= 9 < 32
    uint4 word = uint4(0);
    if (lane < kept) word = words[lane + shift];
    simdgroup_barrier(mem_flags::mem_threadgroup);
    if (lane < kept) words[lane] = word;
    from = copied_end;
  }
  const size_t to = carry ? min((need_end + 127) / 128 * 128, (begin + row_end + 15) / 16 * 16) : need_end;
  const uint count = uint((to - from) / 16);
  for (uint i = lane; i < count; i += 32) {
    const size_t at = from + 16 * i;
    if (at >= begin && at + 16 <= end) {
      words[(at - lo) / 16] = *(device const uint4*)(matrix + (at - begin));
    } else {
      for (size_t j = max(at, begin); j < min(at + 16, end); ++j) dst[j - lo] = matrix[j - begin];
    }
  }
  slot_lo = lo;
  copied_end = max(to, need_end);
}

// Stages x's rows [m0, m0 + 64), elements [r0, r0 + 32) as float; zeros past M and past the row length.
// vec4: rows of a multiple of 4 elements starting on 4-element boundaries (4-element loads).
template <typename T>
inline void stage_x(threadgroup float* x_tile, device const T* x, constant MatmulArgs& args, uint m0, uint r0,
                    uint row_len, bool vec4, uint tid) {
  if (vec4) {
    typedef typename Vec4<T>::type V;
    for (uint e = tid; e < kTileM * kTileK / 4; e += kTileThreads) {  // 8 vectors per row
      const uint m = m0 + e / (kTileK / 4), r = r0 + 4 * (e % (kTileK / 4));
      threadgroup float* dst = x_tile + 4 * e;
      if (m < args.M && r < row_len) {
        const V raw = *(device const V*)(x + size_t(m) * row_len + r);
        dst[0] = FloatIO<T>::load(raw.x);
        dst[1] = FloatIO<T>::load(raw.y);
        dst[2] = FloatIO<T>::load(raw.z);
        dst[3] = FloatIO<T>::load(raw.w);
      } else {
        for (int j = 0; j < 4; ++j) dst[j] = 0.0f;
      }
    }
  } else {
    for (uint e = tid; e < kTileM * kTileK; e += kTileThreads) {
      const uint m = m0 + e / kTileK, r = r0 + e % kTileK;
      x_tile[e] = m < args.M && r < row_len ? FloatIO<T>::load(x[size_t(m) * row_len + r]) : 0.0f;
    }
  }
}

// Forward: output columns are weight rows n, the reduction runs along k (B = weight tile transposed); a
// stage holds 256 (quantized) or 32 (float) elements of k of the tile's 32 weight rows.
// Transposed: output columns are k, the reduction runs along weight rows n (B = weight tile as stored); a
// stage holds the blocks covering the tile's 32 columns of k of the step's 32 weight rows.
template <typename D, typename T, bool kTransposed>
[[kernel]] void qmm(GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]) {
  typedef PrefillShape<D> S;
  const uint out_cols = kTransposed ? args.K : args.N;
  const uint reduction = kTransposed ? args.N : args.K;  // also x's row length
  const MatmulBatch at = matmul_batch(args, group.z, reduction, out_cols);
  const uint m0 = group.y * kTileM, c0 = group.x * kTileN;
  threadgroup float* x_tile = tiles;                                         // [m][r]
  threadgroup float* w_tile = tiles + S::x_tile;                             // [n][k]
  threadgroup uchar* w_raw = (threadgroup uchar*)(w_tile + S::w_tile);       // [n][row_stage]
  const uint sub_m = (simdgroup / 2) * 32, sub_c = (simdgroup % 2) * 16;
  const bool vec4 = reduction % 4 == 0 && (args.x_line + uint(at.x % 32) * sizeof(T)) % (4 * sizeof(T)) == 0;
  device const T* x_batch = x + at.x;
  device const uchar* w_batch = w + at.w;
  const uint matrix_line = (args.w_line + uint(at.w % 128)) % 128u;
  size_t slot_lo[kTileN / 4], copied_end[kTileN / 4];  // stage_row's carry, per staged row
  for (uint i = 0; i < kTileN / 4; ++i) copied_end[i] = slot_lo[i] = 0;
  const size_t matrix_bytes = size_t(args.N) * args.row_bytes;
  simdgroup_float8x8 acc[4][2];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  // The first element of a stage's raw span: forward, the stage start; transposed, the block holding c0.
  const uint t_first = c0 - c0 % D::block_size;
  const uint stage_len = kTransposed ? uint(kTileN) : uint(S::stage);
  for (uint s0 = 0; s0 < reduction; s0 += stage_len) {
    const uint first = kTransposed ? t_first : s0;                       // element of the span's start
    const uint last = kTransposed ? min(c0 + kTileN, args.K) : min(s0 + stage_len, args.K);
    const uint span = ((last - first + D::block_size - 1) / D::block_size) * D::block_bytes;
    const size_t first_byte = size_t(first / D::block_size) * D::block_bytes;
    for (uint row = simdgroup; row < kTileN; row += 4) {  // simdgroup s stages rows s, s + 4, ...
      const uint n = (kTransposed ? s0 : c0) + row;
      if (n < args.N) {
        stage_row(w_raw + row * S::row_stage, w_batch, matrix_line, matrix_bytes,
                  size_t(n) * args.row_bytes + first_byte, span, size_t(n + 1) * args.row_bytes, !kTransposed,
                  slot_lo[row / 4], copied_end[row / 4], lane);
      }
    }
    const uint steps = kTransposed ? 1u : (min(stage_len, reduction - s0) + kTileK - 1) / kTileK;
    for (uint step = 0; step < steps; ++step) {
      const uint r0 = s0 + step * kTileK;
      stage_x(x_tile, x_batch, args, m0, r0, reduction, vec4, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);  // raw weights staged (and x)
      if (tid < 2 * kTileN) {  // decode: thread t, weight row t / 2, 16 elements of k at 16 * (t % 2)
        const uint row = tid / 2, half_row = tid % 2;
        const uint n = (kTransposed ? r0 : c0) + row;
        const uint k = (kTransposed ? c0 : r0) + 16 * half_row;
        float values[16];
        if (n < args.N && k < args.K) {
          const uint mod16 = uint((matrix_line + size_t(n) * args.row_bytes + first_byte) % 16);
          D::staged16(w_raw + row * S::row_stage + mod16, (k - first) / 16, values);
          if (D::is_float) {  // a float row's last run may end past K: those elements are zeros
            for (uint j = 0; j < 16; ++j) values[j] = k + j < args.K ? values[j] : 0.0f;
          }
        } else {
          for (int j = 0; j < 16; ++j) values[j] = 0.0f;
        }
        threadgroup float* dst = w_tile + row * kTileK + 16 * half_row;
        for (int j = 0; j < 16; ++j) dst[j] = values[j];
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // both tiles ready
      for (uint kk = 0; kk < kTileK; kk += 8) {
        simdgroup_float8x8 a[4], b[2];
        for (int i = 0; i < 4; ++i) simdgroup_load(a[i], x_tile + (sub_m + 8 * i) * kTileK + kk, kTileK);
        for (int j = 0; j < 2; ++j) {
          if (kTransposed) {
            simdgroup_load(b[j], w_tile + kk * kTileK + sub_c + 8 * j, kTileK);
          } else {
            simdgroup_load(b[j], w_tile + (sub_c + 8 * j) * kTileK + kk, kTileK, ulong2(0), true);
          }
        }
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
    }
  }
  // The tile goes out through threadgroup memory (the x tile's place), cut to M x out_cols.
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      simdgroup_store(acc[i][j], x_tile + (sub_m + 8 * i) * kTileN + sub_c + 8 * j, kTileN);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < kTileM * kTileN; e += kTileThreads) {
    const uint m = m0 + e / kTileN, c = c0 + e % kTileN;
    if (m < args.M && c < out_cols) store_output(out, at.out + size_t(m) * out_cols + c, args.out_type, x_tile[e]);
  }
}

#define GGML_EXT_INSTANTIATE_MATMUL(suffix, T, name)                                                          \
  template [[host_name("qmm_" #name "_" #suffix)]] [[kernel]] void qmm<decoder_##name, T, false>(                \
      GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]);                                  \
  template [[host_name("qmm_t_" #name "_" #suffix)]] [[kernel]] void qmm<decoder_##name, T, true>(               \
      GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]);
#define GGML_EXT_METAL_WEIGHT_X(name) GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_MATMUL, name)
GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE
