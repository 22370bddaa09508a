// Decode: out = x W^T for M <= 8 rows of x (the QuantizedMatmul primitive, csrc/quantized_matmul.h), on
// the weight's ggml blocks. Sums in float32.
//   qmv_x1_<type>_<x dtype>: one row of x (M = 1), qmv_x4_...: 2-4 rows, qmv_x8_...: 5-8 rows. The x row
//   count is a template constant: its loops unroll, and rows past M are zeros staged once, never tested in
//   the main loop.
//
// Threadgroup (x: 4 * rows weight rows, y: XRows rows of x, z: batch), 4 simdgroups; the product itself
// (512-element steps staged in threadgroup memory by adjacent aligned words) is decode_rows.h's, which the
// grouped mul_mat_id shares.
#include "kernels/metal/decode_rows.h"
#include "kernels/metal/matmul_common.h"

template <typename D, typename T, int XRows>
[[kernel]] void qmv(GGML_EXT_MATMUL_PARAMS(T), threadgroup uchar* stage [[threadgroup(0)]]) {
  constexpr uint kRows = DecodeShape<D>::rows;
  const MatmulBatch at = matmul_batch(args, group.z, args.K, args.N);
  const uint n0 = (group.x * kDecodeSimdgroups + simdgroup) * kRows;
  const uint m0 = group.y * XRows;
  const uint x_row_bytes = args.K * sizeof(T);
  DecodeOperands<XRows> in;
  device const uchar* x_rows = (device const uchar*)(x + at.x) + size_t(m0) * x_row_bytes;
  for (int i = 0; i < XRows; ++i) in.x_row[i] = x_rows + size_t(i) * x_row_bytes;
  // The rows of this simdgroup / threadgroup that exist (the same for every lane: uniform branches).
  in.x_live = min(uint(XRows), args.M - m0);
  in.x_align = (args.x_line + uint(at.x * sizeof(T)) + m0 * x_row_bytes) | x_row_bytes;
  in.w_row = w + at.w + size_t(n0) * args.row_bytes;
  in.w_live = n0 < args.N ? min(kRows, args.N - n0) : 0u;
  in.w_line = (args.w_line + uint(at.w) + n0 * args.row_bytes) % 128u;
  in.K = args.K;
  in.row_bytes = args.row_bytes;
  float total[kRows][XRows];
  decode_product<D, T, XRows>(in, stage, lane, simdgroup, total);
  for (uint r = 0; r < in.w_live; ++r) {
    for (uint i = 0; i < in.x_live; ++i) {
      if (lane == 0) store_output(out, at.out + size_t(m0 + i) * args.N + n0 + r, args.out_type, total[r][i]);
    }
  }
}

#define GGML_EXT_INSTANTIATE_DECODE_ROWS(suffix, T, name, rows)                                                  \
  template [[host_name("qmv_x" #rows "_" #name "_" #suffix)]] [[kernel]] void qmv<decoder_##name, T, rows>(    \
      GGML_EXT_MATMUL_PARAMS(T), threadgroup uchar* stage [[threadgroup(0)]]);
#define GGML_EXT_INSTANTIATE_DECODE(suffix, T, name)   \
  GGML_EXT_INSTANTIATE_DECODE_ROWS(suffix, T, name, 1) \
  GGML_EXT_INSTANTIATE_DECODE_ROWS(suffix, T, name, 4) \
  GGML_EXT_INSTANTIATE_DECODE_ROWS(suffix, T, name, 8)
#define GGML_EXT_METAL_WEIGHT_X(name) GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_DECODE, name)
GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE
