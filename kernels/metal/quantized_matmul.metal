// The QuantizedMatmul primitive (csrc/quantized_matmul.h): x (B3, B2, M, Kx) times a weight stored as
// ggml blocks (A3, A2, N, row_bytes), computed on the blocks: the dequantized weight only ever exists in
// threadgroup tiles. Sums in float32. Decode (M <= 8) is in decode.metal.
//   qmm_<type>_<x dtype>:   prefill: out = x W^T on 64 x 32 output tiles with simdgroup matrices.
//   qmm_t_<type>_<x dtype>: the transposed product out = x W (x's gradient) on 64 x 256 output tiles
//                           (below, after qmm).
//
// qmm: threadgroup (x: 32 output columns, y: 64 rows of x, z: batch), 4 simdgroups; simdgroup s owns the
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
// the copy runs in aligned 16-byte words, plus up to 128 bytes staged ahead for the next stage).
// launch_plans.h (prefill_threadgroup_bytes) computes the same sizes.
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

// Copies the aligned 16-byte word at `at` (addresses here are relative: matrix_line + byte offset) to
// `slot`, whose first byte stands for address slot_at: whole when it lies inside the weight matrix
// [begin, end), otherwise byte by byte, only its bytes inside the matrix (the first row's first word and
// the last row's last, when the matrix is not 16-byte aligned): no load leaves the weight buffer.
inline void copy_word(threadgroup uchar* slot, size_t slot_at, device const uchar* matrix, size_t begin, size_t end,
                      size_t at) {
  if (at >= begin && at + 16 <= end) {
    *(threadgroup uint4*)(slot + (at - slot_at)) = *(device const uint4*)(matrix + (at - begin));
  } else {
    for (size_t j = max(at, begin); j < min(at + 16, end); ++j) slot[j - slot_at] = matrix[j - begin];
  }
}

// The forward product's row staging. Copies to a row's slot `dst` the 16-byte words that hold bytes
// [b0, b0 + n) of the weight matrix (`matrix`, `total` bytes long, whose first byte sits at address
// matrix_line modulo 128), word i by lane i % 32 (adjacent lanes, adjacent aligned words); byte b0 lands
// at dst + (matrix_line + b0) % 16. The stages take consecutive bytes of a row, so the copy runs on to the
// next 128-byte line boundary (or the row's end, row_end bytes into the matrix) and `copied_end`
// remembers where it stopped: the next stage moves those words (under 128 bytes) to the slot's front and
// starts after them, so each line of a row is requested once.
inline void stage_row(threadgroup uchar* dst, device const uchar* matrix, uint matrix_line, size_t total,
                      size_t b0, uint n, size_t row_end, thread size_t& slot_lo, thread size_t& copied_end,
                      uint lane) {
  const size_t begin = matrix_line, end = matrix_line + total;
  const size_t lo = (begin + b0) / 16 * 16;  // the first word needed
  const size_t need_end = (begin + b0 + n + 15) / 16 * 16;
  threadgroup uint4* words = (threadgroup uint4*)dst;
  size_t from = lo;
  if (copied_end > lo) {  // words [lo, copied_end) are staged already, at slot word lo - slot_lo
    const uint kept = uint(copied_end - lo) / 16, shift = uint(lo - slot_lo) / 16;  // kept <= 9 < 32
    uint4 word = uint4(0);
    if (lane < kept) word = words[lane + shift];
    simdgroup_barrier(mem_flags::mem_threadgroup);
    if (lane < kept) words[lane] = word;
    from = copied_end;
  }
  const size_t to = min((need_end + 127) / 128 * 128, (begin + row_end + 15) / 16 * 16);
  const uint count = uint((to - from) / 16);
  for (uint i = lane; i < count; i += 32) copy_word(dst, lo, matrix, begin, end, from + 16 * i);
  slot_lo = lo;
  copied_end = max(to, need_end);
}

// The transposed product's staging: copies the 16-byte words from the start of the 128-byte line that
// holds byte b0 of the weight matrix up to the word holding byte b0 + n - 1, word i (counted from that
// line's start) by thread `index` = i % threads, to dst + 16 i: a simdgroup's load takes whole lines
// (4 of them) and no line is split between two loads. Byte b0 lands at dst + (matrix_line + b0) % 128.
// Words before the matrix's first byte are skipped (a matrix that does not start on a line).
inline void stage_lines(threadgroup uchar* dst, device const uchar* matrix, uint matrix_line, size_t total, size_t b0,
                        uint n, uint index, uint threads) {
  const size_t begin = matrix_line, end = matrix_line + total;
  const size_t base = (begin + b0) / 128 * 128;
  const uint count = uint(((begin + b0 + n + 15) / 16 * 16 - base) / 16);
  for (uint i = index; i < count; i += threads) {
    if (base + 16 * i + 16 > begin) copy_word(dst, base, matrix, begin, end, base + 16 * i);
  }
}

// Stages x's rows [m0, m0 + Rows), elements [r0, r0 + Cols) as float, by Threads threads; zeros past M and
// past the row length. vec4: rows of a multiple of 4 elements starting on 4-element boundaries (4-element
// loads, adjacent threads reading adjacent vectors).
template <uint Rows, uint Cols, uint Threads, typename T>
inline void stage_x(threadgroup float* x_tile, device const T* x, constant MatmulArgs& args, uint m0, uint r0,
                    uint row_len, bool vec4, uint tid) {
  if (vec4) {
    typedef typename Vec4<T>::type V;
    for (uint e = tid; e < Rows * Cols / 4; e += Threads) {
      const uint m = m0 + e / (Cols / 4), r = r0 + 4 * (e % (Cols / 4));
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
    for (uint e = tid; e < Rows * Cols; e += Threads) {
      const uint m = m0 + e / Cols, r = r0 + e % Cols;
      x_tile[e] = m < args.M && r < row_len ? FloatIO<T>::load(x[size_t(m) * row_len + r]) : 0.0f;
    }
  }
}

// Whether x's rows (row_len elements, batch offset x_at) allow 4-element vector loads.
template <typename T>
inline bool x_rows_vec4(constant MatmulArgs& args, size_t x_at, uint row_len) {
  return row_len % 4 == 0 && (args.x_line + uint(x_at % 32) * sizeof(T)) % (4 * sizeof(T)) == 0;
}

// Forward (out = x W^T): output columns are weight rows n, the reduction runs along k; a stage holds 256
// (quantized) or 64 (float) elements of k of the tile's 32 weight rows, consumed in steps of 32.
template <typename D, typename T>
[[kernel]] void qmm(GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]) {
  typedef PrefillShape<D> S;
  const MatmulBatch at = matmul_batch(args, group.z, args.K, args.N);
  const uint m0 = group.y * kTileM, c0 = group.x * kTileN;
  threadgroup float* x_tile = tiles;                                         // [m][k]
  threadgroup float* w_tile = tiles + S::x_tile;                             // [n][k]
  threadgroup uchar* w_raw = (threadgroup uchar*)(w_tile + S::w_tile);       // [n][row_stage]
  const uint sub_m = (simdgroup / 2) * 32, sub_c = (simdgroup % 2) * 16;
  const bool vec4 = x_rows_vec4<T>(args, at.x, args.K);
  device const T* x_batch = x + at.x;
  device const uchar* w_batch = w + at.w;
  const uint matrix_line = (args.w_line + uint(at.w % 128)) % 128u;
  size_t slot_lo[kTileN / 4], copied_end[kTileN / 4];  // stage_row's carry, per staged row
  for (uint i = 0; i < kTileN / 4; ++i) copied_end[i] = slot_lo[i] = 0;
  const size_t matrix_bytes = size_t(args.N) * args.row_bytes;
  simdgroup_float8x8 acc[4][2];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (uint s0 = 0; s0 < args.K; s0 += S::stage) {
    const uint last = min(s0 + uint(S::stage), args.K);
    const uint span = ((last - s0 + D::block_size - 1) / D::block_size) * D::block_bytes;
    const size_t first_byte = size_t(s0 / D::block_size) * D::block_bytes;
    for (uint row = simdgroup; row < kTileN; row += 4) {  // simdgroup s stages rows s, s + 4, ...
      const uint n = c0 + row;
      if (n < args.N) {
        stage_row(w_raw + row * S::row_stage, w_batch, matrix_line, matrix_bytes,
                  size_t(n) * args.row_bytes + first_byte, span, size_t(n + 1) * args.row_bytes, slot_lo[row / 4],
                  copied_end[row / 4], lane);
      }
    }
    const uint steps = (last - s0 + kTileK - 1) / kTileK;
    for (uint step = 0; step < steps; ++step) {
      const uint r0 = s0 + step * kTileK;
      stage_x<kTileM, kTileK, kTileThreads>(x_tile, x_batch, args, m0, r0, args.K, vec4, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);  // raw weights staged (and x)
      if (tid < 2 * kTileN) {  // decode: thread t, weight row t / 2, 16 elements of k at 16 * (t % 2)
        const uint row = tid / 2, half_row = tid % 2;
        const uint n = c0 + row, k = r0 + 16 * half_row;
        float values[16];
        if (n < args.N && k < args.K) {
          const uint mod16 = uint((matrix_line + size_t(n) * args.row_bytes + first_byte) % 16);
          D::staged16(w_raw + row * S::row_stage + mod16, (k - s0) / 16, values);
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
          simdgroup_load(b[j], w_tile + (sub_c + 8 * j) * kTileK + kk, kTileK, ulong2(0), true);
        }
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
    }
  }
  // The tile goes out through threadgroup memory (the x tile's place), cut to M x N.
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      simdgroup_store(acc[i][j], x_tile + (sub_m + 8 * i) * kTileN + sub_c + 8 * j, kTileN);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < kTileM * kTileN; e += kTileThreads) {
    const uint m = m0 + e / kTileN, c = c0 + e % kTileN;
    if (m < args.M && c < args.N) store_output(out, at.out + size_t(m) * args.N + c, args.out_type, x_tile[e]);
  }
}

// ---------------------------------------------------------------------------------------------------
// The transposed product (qmm_t, x's gradient): out (M x K) = x (M x N) W (N x K). The reduction runs
// along weight rows n; a threadgroup's output columns are a whole 256 columns of k (one K-quant block, 8
// blocks of 32, 256 float elements), so each weight byte under them is staged and decoded once per
// threadgroup, for all the columns it covers (a 32-column tile restaged a 256-element block 8 times).
//
// Threadgroup (x: 256 output columns, y: 64 rows of x, z: batch) of 16 simdgroups; simdgroup s owns the
// 32 x 32 sub-tile at rows 32 * (s / 8), columns 32 * (s % 8): 4 x 4 accumulators of 8 x 8. Per stage of
// 32 weight rows, the x tile (64 x 32 floats); per step of `rows` weight rows (16; 8 for float types, whose
// rows are wider): the rows' bytes under the tile, then the decoded tile (rows x 256 floats), then 2 (1)
// k-slices of products. The rows' bytes go by whole 128-byte lines (stage_lines): one range for the step
// when the tile covers whole rows (K <= 256: the step's rows are adjacent in memory, each line requested
// once), else one row per simdgroup. Simdgroups whose sub-tile lies past M or K skip the products.
// ---------------------------------------------------------------------------------------------------
enum {
  kTransTileM = 64,      // rows of x per threadgroup
  kTransTileC = 256,     // output columns (elements of k) per threadgroup
  kTransStageN = 32,     // weight rows (x columns) per x stage
  kTransThreads = 512,   // 16 simdgroups of 32 x 32
  kTransSlotMax = 512,   // the widest row slot that keeps 16 rows per step under 32 KiB
};

// Threadgroup memory of qmm_t (launch_plans.h, transposed_threadgroup_bytes, computes the same): the x
// tile, the decoded tile, and per row of a step a slot for its bytes under the tile from the start of
// their first 128-byte line (up to 127 bytes before them, 15 after).
template <typename D>
struct TransposedShape {
  enum {
    span = (kTransTileC / D::block_size) * D::block_bytes,  // a row's bytes under a full tile
    slot = (span + 127 + 15) / 16 * 16,
    rows = slot <= kTransSlotMax ? 16 : 8,
    x_tile = kTransTileM * kTransStageN,  // floats
    w_tile = rows * kTransTileC,          // floats
    bytes = (x_tile + w_tile) * 4 + rows * slot,
  };
};

template <typename D, typename T>
[[kernel, max_total_threads_per_threadgroup(kTransThreads)]] void qmm_t(
    GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]) {
  typedef TransposedShape<D> S;
  static_assert(S::bytes <= 32768, "qmm_t's threadgroup memory exceeds Metal's 32 KiB");
  const MatmulBatch at = matmul_batch(args, group.z, args.N, args.K);
  const uint m0 = group.y * kTransTileM, c0 = group.x * kTransTileC;
  threadgroup float* x_tile = tiles;                                    // [m][n]
  threadgroup float* w_tile = tiles + S::x_tile;                        // [n][k]
  threadgroup uchar* w_raw = (threadgroup uchar*)(w_tile + S::w_tile);  // [row][slot], or one range
  const uint sub_m = (simdgroup / 8) * 32, sub_c = (simdgroup % 8) * 32;
  const bool active = m0 + sub_m < args.M && c0 + sub_c < args.K;  // the sub-tile holds outputs
  const bool vec4 = x_rows_vec4<T>(args, at.x, args.N);
  device const T* x_batch = x + at.x;
  device const uchar* w_batch = w + at.w;
  const uint matrix_line = (args.w_line + uint(at.w % 128)) % 128u;
  const size_t matrix_bytes = size_t(args.N) * args.row_bytes;
  // c0 is a multiple of 256, so of every block size: the tile's bytes of a row start on a block.
  const uint blocks = (min(uint(kTransTileC), args.K - c0) + D::block_size - 1) / D::block_size;
  const uint span = blocks * D::block_bytes;
  const size_t first_byte = size_t(c0 / D::block_size) * D::block_bytes;
  const bool whole_rows = first_byte == 0 && span == args.row_bytes;
  simdgroup_float8x8 acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (uint n_x = 0; n_x < args.N; n_x += kTransStageN) {
    stage_x<kTransTileM, kTransStageN, kTransThreads>(x_tile, x_batch, args, m0, n_x, args.N, vec4, tid);
    for (uint sub = 0; sub < kTransStageN && n_x + sub < args.N; sub += S::rows) {
      const uint n0 = n_x + sub, rows = min(uint(S::rows), args.N - n0);
      if (whole_rows) {  // rows n0 .. n0 + rows - 1 are one range of bytes
        stage_lines(w_raw, w_batch, matrix_line, matrix_bytes, size_t(n0) * args.row_bytes, rows * args.row_bytes,
                    tid, kTransThreads);
      } else if (simdgroup < rows) {
        stage_lines(w_raw + simdgroup * S::slot, w_batch, matrix_line, matrix_bytes,
                    size_t(n0 + simdgroup) * args.row_bytes + first_byte, span, lane, 32);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // raw weights staged (and x)
      if (tid < S::rows * 16) {  // decode: thread t, row t / 16, columns c0 + 16 (t % 16) ... + 15
        const uint row = tid / 16, run = tid % 16, k = c0 + 16 * run;
        float values[16];
        if (row < rows && k < args.K) {
          const size_t row_at = matrix_line + size_t(n0 + row) * args.row_bytes + first_byte;
          threadgroup const uchar* bytes =
              whole_rows ? w_raw + (matrix_line + size_t(n0) * args.row_bytes) % 128 + row * args.row_bytes
                         : w_raw + row * S::slot + row_at % 128;
          D::staged16(bytes, run, values);
          if (D::is_float) {  // a float row's last run may end past K: those elements are zeros
            for (uint j = 0; j < 16; ++j) values[j] = k + j < args.K ? values[j] : 0.0f;
          }
        } else {
          for (int j = 0; j < 16; ++j) values[j] = 0.0f;
        }
        threadgroup float* dst = w_tile + row * kTransTileC + 16 * run;
        for (int j = 0; j < 16; ++j) dst[j] = values[j];
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the decoded tile ready
      if (active) {
        for (uint kk = 0; kk < uint(S::rows); kk += 8) {
          simdgroup_float8x8 a[4], b[4];
          for (int i = 0; i < 4; ++i)
            simdgroup_load(a[i], x_tile + (sub_m + 8 * i) * kTransStageN + sub + kk, kTransStageN);
          for (int j = 0; j < 4; ++j) simdgroup_load(b[j], w_tile + kk * kTransTileC + sub_c + 8 * j, kTransTileC);
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
    }
  }
  // Out through threadgroup memory, 8 rows at a time: simdgroup s's 8 x 32 floats at tiles + 256 s (16 KiB
  // in all, inside the x and decoded tiles), then lane l stores column l of each row (guarded, cut to M x K).
  threadgroup float* rows8 = tiles + simdgroup * 8 * 32;
  if (active) {
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) simdgroup_store(acc[i][j], rows8 + 8 * j, 32);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      const uint c = c0 + sub_c + lane;
      for (uint r = 0; r < 8; ++r) {
        const uint m = m0 + sub_m + 8 * i + r;
        if (m < args.M && c < args.K) {
          store_output(out, at.out + size_t(m) * args.K + c, args.out_type, rows8[32 * r + lane]);
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}

#define GGML_EXT_INSTANTIATE_MATMUL(suffix, T, name)                                                          \
  template [[host_name("qmm_" #name "_" #suffix)]] [[kernel]] void qmm<decoder_##name, T>(                       \
      GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]);                                  \
  template [[host_name("qmm_t_" #name "_" #suffix)]] [[kernel]] void qmm_t<decoder_##name, T>(                   \
      GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]);
#define GGML_EXT_METAL_WEIGHT_X(name) GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_MATMUL, name)
GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE
