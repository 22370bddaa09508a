// The MulMatId primitive (csrc/mul_mat_id.h), ggml's mul_mat_id: each (token, slot) pair p goes through the
// expert ids[p] chooses, read from its ggml blocks. A first correct version, the same design as the CUDA
// kernel (kernels/cuda/mul_mat_id.cu): the ids are read by the kernel (no host round trip), every weight row
// decoded 16 elements at a time by the shared decoders (kernels/common/ggml_blocks.h: every format read as the
// CPU reads it), float32 sums. It does not group pairs by expert: an expert chosen by P pairs is read P times.
//   mul_mat_id_<type>_<dtype>:   forward, out[p] = W[ids[p]] @ x[token, slot or 0]; a simdgroup per (pair,
//                                weight row), lane l taking the row's 16-element runs l, l + 32, ...; simd_sum.
//   mul_mat_id_t_<type>_<dtype>: transposed (x's gradient), out[p] = x[p] @ W[ids[p]]; a thread per (pair,
//                                16-element run of K), summing over the expert's N rows.
// An id outside [0, experts) gives its pair a row of NaN and the kernel reads nothing of the experts for it, so
// no id can address memory outside them (the op raises on such ids where it can see them first).
#include "kernels/metal/decoders.h"

enum {
  kIdSimdgroups = 4,  // forward: weight rows per threadgroup, one per simdgroup
  kIdThreads = 128,   // threads per threadgroup, both kernels
};

#define GGML_EXT_MUL_MAT_ID_PARAMS(T)                                                                      \
  device const T *x [[buffer(0)]], device const uchar *w [[buffer(1)]], device const int *ids [[buffer(2)]], \
      device T *out [[buffer(3)]], constant MulMatIdArgs &args [[buffer(4)]],                                \
      uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],                \
      uint lane [[thread_index_in_simdgroup]], uint simdgroup [[simdgroup_index_in_threadgroup]]

inline bool valid_expert(int id, uint experts) { return id >= 0 && uint(id) < experts; }

inline float quiet_nan() { return as_type<float>(0x7fc00000u); }

// Grid (x: N / kIdSimdgroups, y: pairs), kIdThreads threads.
template <typename D, typename T>
[[kernel]] void mul_mat_id(GGML_EXT_MUL_MAT_ID_PARAMS(T)) {
  const uint n = group.x * kIdSimdgroups + simdgroup;
  if (n >= args.N) return;  // the whole simdgroup: its simd_sum waits for no one else
  const uint p = group.y;
  const int id = ids[p];
  device T* y = out + size_t(p) * args.N + n;
  if (!valid_expert(id, args.experts)) {
    if (lane == 0) *y = FloatIO<T>::store(quiet_nan());
    return;
  }
  const uint token = p / args.n_used, slot = args.x_slots == 1 ? 0u : p % args.n_used;
  device const T* xr = x + (size_t(token) * args.x_slots + slot) * args.K;
  device const uchar* row = w + (size_t(id) * args.N + n) * args.row_bytes;
  const uint runs = (args.K + 15) / 16;  // float rows may end inside the last run: x reads stop at K
  float sum = 0.0f;
  for (uint run = lane; run < runs; run += 32) {
    float ws[16];
    D::row16(row, run, args.K, ws);
    float dot = 0.0f;
    for (uint j = 0; j < 16; ++j) {
      const uint k = 16 * run + j;
      dot += ws[j] * (k < args.K ? FloatIO<T>::load(xr[k]) : 0.0f);
    }
    sum += dot;
  }
  sum = simd_sum(sum);
  if (lane == 0) *y = FloatIO<T>::store(sum);
}

// Grid (x: runs of K / kIdThreads, y: pairs), kIdThreads threads.
template <typename D, typename T>
[[kernel]] void mul_mat_id_t(GGML_EXT_MUL_MAT_ID_PARAMS(T)) {
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

#define GGML_EXT_INSTANTIATE_MUL_MAT_ID(suffix, T, name)                                                         \
  template [[host_name("mul_mat_id_" #name "_" #suffix)]] [[kernel]] void mul_mat_id<decoder_##name, T>(        \
      GGML_EXT_MUL_MAT_ID_PARAMS(T));                                                                             \
  template [[host_name("mul_mat_id_t_" #name "_" #suffix)]] [[kernel]] void mul_mat_id_t<decoder_##name, T>(    \
      GGML_EXT_MUL_MAT_ID_PARAMS(T));
#define GGML_EXT_METAL_WEIGHT_X(name) GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_MUL_MAT_ID, name)
GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE
