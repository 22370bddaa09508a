// The QuantizedMatmul primitive (csrc/quantized_matmul.h): x (B3, B2, M, Kx) times a weight stored as
// ggml blocks (A3, A2, N, row_bytes), computed on the blocks: the dequantized weight only ever exists in
// registers and threadgroup tiles. Sums in float32. Decode (small M) is in decode.metal.
//   qmm_<type>_<x dtype>:   prefill: out = x W^T on 32x32 tiles with simdgroup matrices.
//   qmm_t_<type>_<x dtype>: the transposed product out = x W (x's gradient), same tiles.
#include "kernels/metal/matmul_common.h"

enum {
  kTile = 32,                   // prefill: output tile kTile x kTile, reduction step kTile
  kTileThreads = 128,           // 4 simdgroups, each a 16 x 16 quarter of the tile
};

// Prefill. Threadgroup (x: output column tile, y: x row tile, z: batch) computes a kTile x kTile output
// tile; per reduction step it stages x (kTile x kTile, float) and the dequantized weight tile (kTile rows
// of kTile elements: 64 runs, one per thread of the first two simdgroups) in threadgroup memory, then each
// simdgroup multiplies its 16 x 16 quarter with 8x8 simdgroup matrices.
// Forward: output columns are weight rows n, the reduction runs along k (B = weight tile transposed).
// Transposed: output columns are k, the reduction runs along weight rows n (B = weight tile as stored).
template <typename D, typename T, bool kTransposed>
[[kernel]] void qmm(GGML_EXT_MATMUL_PARAMS(T), threadgroup float* tiles [[threadgroup(0)]]) {
  const uint out_cols = kTransposed ? args.K : args.N;
  const uint reduction = kTransposed ? args.N : args.K;  // also x's row length
  const MatmulBatch at = matmul_batch(args, group.z, reduction, out_cols);
  const uint m0 = group.y * kTile, c0 = group.x * kTile;
  threadgroup float* x_tile = tiles;                  // [m][r]
  threadgroup float* w_tile = tiles + kTile * kTile;  // [n][k]
  const uint quarter_m = (simdgroup / 2) * 16, quarter_c = (simdgroup % 2) * 16;
  simdgroup_float8x8 acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (uint r0 = 0; r0 < reduction; r0 += kTile) {
    for (uint e = tid; e < kTile * kTile; e += kTileThreads) {
      const uint m = m0 + e / kTile, r = r0 + e % kTile;
      x_tile[e] = m < args.M && r < reduction ? FloatIO<T>::load(x[at.x + size_t(m) * reduction + r]) : 0.0f;
    }
    if (tid < 2 * kTile) {
      const uint row = tid / 2, half_row = tid % 2;
      const uint n = (kTransposed ? r0 : c0) + row;
      const uint k = (kTransposed ? c0 : r0) + 16 * half_row;
      float values[16];
      if (n < args.N && k < args.K) {
        D::row16(w + at.w + size_t(n) * args.row_bytes, k / 16, args.K, values);
      } else {
        for (int j = 0; j < 16; ++j) values[j] = 0.0f;
      }
      for (int j = 0; j < 16; ++j) w_tile[row * kTile + 16 * half_row + j] = values[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint kk = 0; kk < kTile; kk += 8) {
      simdgroup_float8x8 a[2], b[2];
      for (int i = 0; i < 2; ++i) simdgroup_load(a[i], x_tile + (quarter_m + 8 * i) * kTile + kk, kTile);
      for (int j = 0; j < 2; ++j) {
        if (kTransposed) {
          simdgroup_load(b[j], w_tile + kk * kTile + quarter_c + 8 * j, kTile);
        } else {
          simdgroup_load(b[j], w_tile + (quarter_c + 8 * j) * kTile + kk, kTile, ulong2(0), true);
        }
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
  }
  // The tile goes out through threadgroup memory, so edge tiles are cut to M x out_cols element-wise.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      simdgroup_store(acc[i][j], x_tile + (quarter_m + 8 * i) * kTile + quarter_c + 8 * j, kTile);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < kTile * kTile; e += kTileThreads) {
    const uint m = m0 + e / kTile, c = c0 + e % kTile;
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
