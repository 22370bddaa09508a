// The MulMatId primitive (csrc/mul_mat_id.h), ggml's mul_mat_id: each (token, slot) pair p goes through the
// expert ids[p] chooses, read from its ggml blocks; float32 sums, output in x's dtype.
//   mul_mat_id_x1/x8_<type>_<dtype>: forward, out[p] = W[ids[p]] @ x[token, slot or 0], grouped by expert.
//     It runs after mul_mat_id_group (mul_mat_id_groups.metal), which sorted the pairs by expert on the GPU.
//     Grid (weight-row tiles, experts + 1): a threadgroup owns a tile of one expert's rows (4 simdgroups of
//     DecodeShape::rows rows, as the decode kernels) and walks that expert's pairs in chunks of XRows, the
//     chunk's rows of x gathered through the sorted pair list into the decode product (decode_rows.h: the
//     weight rows' bytes staged by whole 128-byte lines of adjacent aligned words, decoded once per chunk for
//     all its x rows). XRows is 1 for one token, else 8 (launch_plans.h; no x4 as decode has: each
//     specialization is another 72 kernels to compile): a top-k router gives an expert at most T pairs, so
//     for T <= 8 each chosen expert's rows are read once per call. Threadgroups of
//     experts nobody chose exit at once; the last bucket (ids outside [0, experts)) writes NaN rows.
//   mul_mat_id_t_<type>_<dtype>: transposed (x's gradient), out[p] = x[p] @ W[ids[p]]; a thread per (pair,
//     16-element run of K), summing over the expert's N rows (not grouped).
// An id outside [0, experts) gives its pair a row of NaN and the kernels read nothing of the experts for it, so
// no id can address memory outside them (the op raises on such ids where it can see them first).
#include "kernels/metal/decode_rows.h"
#include "kernels/metal/mul_mat_id_groups.h"

enum {
  kIdThreads = 128,  // threads per threadgroup, both kernels
};

inline float quiet_nan() { return as_type<float>(0x7fc00000u); }

#define GGML_EXT_MUL_MAT_ID_PARAMS(T)                                                                          \
  device const T *x [[buffer(0)]], device const uchar *w [[buffer(1)]], device T *out [[buffer(3)]],          \
      constant MulMatIdArgs &args [[buffer(4)]], device const int *scratch [[buffer(5)]],                      \
      threadgroup uchar *stage [[threadgroup(0)]], uint3 group [[threadgroup_position_in_grid]],               \
      uint lane [[thread_index_in_simdgroup]], uint simdgroup [[simdgroup_index_in_threadgroup]]

// Grid (x: row tiles of kDecodeSimdgroups * DecodeShape::rows, y: experts + 1), kIdThreads threads.
template <typename D, typename T, int XRows>
[[kernel]] void mul_mat_id(GGML_EXT_MUL_MAT_ID_PARAMS(T)) {
  constexpr uint kRows = DecodeShape<D>::rows;
  const uint bucket = group.y;  // the same for the whole threadgroup: its returns are uniform
  device const int* offsets = scratch;
  device const int* sorted = scratch + sorted_part(args);
  const uint first = uint(offsets[bucket]), count = uint(offsets[bucket + 1]) - first;
  if (count == 0) return;  // an expert no pair chose
  const uint n0 = (group.x * kDecodeSimdgroups + simdgroup) * kRows;
  const uint w_live = n0 < args.N ? min(kRows, args.N - n0) : 0u;
  if (bucket == args.experts) {  // the pairs of bad ids: NaN in this tile's rows, no weight addressed
    for (uint i = lane; i < count * w_live; i += 32) {
      out[size_t(sorted[first + i / w_live]) * args.N + n0 + i % w_live] = FloatIO<T>::store(quiet_nan());
    }
    return;
  }
  const uint x_row_bytes = args.K * sizeof(T);
  DecodeOperands<XRows> in;
  in.x_align = args.x_line | x_row_bytes;  // every row starts a multiple of the row length past x
  const size_t w_first = (size_t(bucket) * args.N + n0) * args.row_bytes;
  in.w_row = w + w_first;
  in.w_live = w_live;
  in.w_line = (args.w_line + uint(w_first % 128u)) % 128u;
  in.K = args.K;
  in.row_bytes = args.row_bytes;
  for (uint c = 0; c < count; c += XRows) {  // chunks of the expert's pairs
    in.x_live = min(uint(XRows), count - c);
    uint pair[XRows];
    for (uint i = 0; i < uint(XRows); ++i) {
      pair[i] = i < in.x_live ? uint(sorted[first + c + i]) : 0u;
      const uint x_row = args.x_slots == 1 ? pair[i] / args.n_used : pair[i];  // (token, slot) or (token, 0)
      in.x_row[i] = (device const uchar*)x + size_t(x_row) * x_row_bytes;
    }
    float total[kRows][XRows];
    decode_product<D, T, XRows>(in, stage, lane, simdgroup, total);
    for (uint r = 0; r < w_live; ++r) {
      for (uint i = 0; i < in.x_live; ++i) {
        if (lane == 0) out[size_t(pair[i]) * args.N + n0 + r] = FloatIO<T>::store(total[r][i]);
      }
    }
  }
}

#define GGML_EXT_MUL_MAT_ID_T_PARAMS(T)                                                                       \
  device const T *x [[buffer(0)]], device const uchar *w [[buffer(1)]], device const int *ids [[buffer(2)]], \
      device T *out [[buffer(3)]], constant MulMatIdArgs &args [[buffer(4)]],                                \
      uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]

// Grid (x: runs of K / kIdThreads, y: pairs), kIdThreads threads.
template <typename D, typename T>
[[kernel]] void mul_mat_id_t(GGML_EXT_MUL_MAT_ID_T_PARAMS(T)) {
  const uint run = group.x * kIdThreads + tid;
  if (run * 16 >= args.K) return;  // no barrier or collective follows
  const uint p = group.y;
  const int id = ids[p];
  float acc[16];
  for (uint j = 0; j < 16; ++j) acc[j] = 0.0f;
  if (valid_expert(id, args.experts)) {
    device const T* xr = x + size_t(p) * args.N;
    device const uchar* rows = w + size_t(id) * args.N * args.row_bytes;
    for (uint n = 0; n < args.N; ++n) {
      float ws[16];
      D::row16(rows + size_t(n) * args.row_bytes, run, args.K, ws);
      const float xn = FloatIO<T>::load(xr[n]);
      for (uint j = 0; j < 16; ++j) acc[j] += xn * ws[j];
    }
  } else {
    for (uint j = 0; j < 16; ++j) acc[j] = quiet_nan();
  }
  device T* y = out + size_t(p) * args.K + 16 * run;
  const uint valid = min(16u, args.K - 16 * run);  // a float row's last run may be partial
  for (uint j = 0; j < valid; ++j) y[j] = FloatIO<T>::store(acc[j]);
}

#define GGML_EXT_INSTANTIATE_MUL_MAT_ID_ROWS(suffix, T, name, rows)                                              \
  template [[host_name("mul_mat_id_x" #rows "_" #name "_" #suffix)]] [[kernel]] void                           \
  mul_mat_id<decoder_##name, T, rows>(GGML_EXT_MUL_MAT_ID_PARAMS(T));
#define GGML_EXT_INSTANTIATE_MUL_MAT_ID(suffix, T, name)                                                         \
  GGML_EXT_INSTANTIATE_MUL_MAT_ID_ROWS(suffix, T, name, 1)                                                       \
  GGML_EXT_INSTANTIATE_MUL_MAT_ID_ROWS(suffix, T, name, 8)                                                       \
  template [[host_name("mul_mat_id_t_" #name "_" #suffix)]] [[kernel]] void mul_mat_id_t<decoder_##name, T>(    \
      GGML_EXT_MUL_MAT_ID_T_PARAMS(T));
#define GGML_EXT_METAL_WEIGHT_X(name) GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_MUL_MAT_ID, name)
GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE
