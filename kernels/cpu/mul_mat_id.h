// ggml's mul_mat_id on the CPU: each token's chosen experts applied to its rows (csrc/mul_mat_id.h has the
// contract). The kernel groups the (token, slot) pairs by expert and runs the quantized matmul of matmul.h once
// per expert on that expert's rows gathered together, so an expert's blocks are read once per call however many
// tokens route to it.
#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

//   forward (transpose == false):   out[t, s, :] (N) = W[ids[t, s]] (N, K) @ x[t, s or 0, :] (K)
//   transposed (transpose == true): out[t, s, :] (K) = x[t, s, :] (N) @ W[ids[t, s]] (N, K)   (x's gradient)
// x: (T, x_slots, x_cols) with x_slots 1 (every slot reads the token's one row) or n_used; out: (T, n_used,
// out_cols); W: E matrices of N rows of row_bytes bytes of ggml type `w_type`, K elements per row. Every id must
// be in [0, E): the caller checks them first (first_bad_id).
struct MulMatIdArgs {
  const void* x;
  FloatType x_type;
  const void* w;
  int w_type;
  const int32_t* ids;
  void* out;
  FloatType out_type;
  int64_t T, n_used, x_slots, E, N, K, row_bytes;
  bool transpose;
  // T x n_used x (x_cols + out_cols) elements of scratch (x's and out's float types) for the gathered rows and
  // their results, or null for the kernel's own (MLX's allocator keeps freed buffers warm; a fresh one faults in).
  void* scratch;
};

void mul_mat_id(const MulMatIdArgs& args);

// Where the results start in the scratch (64-byte aligned), and its size.
inline int64_t mul_mat_id_results_offset(const MulMatIdArgs& a) {
  const int64_t x_cols = a.transpose ? a.N : a.K;
  return (a.T * a.n_used * x_cols * float_type_bytes(a.x_type) + 63) / 64 * 64;
}
inline int64_t mul_mat_id_scratch_bytes(const MulMatIdArgs& a) {
  const int64_t out_cols = a.transpose ? a.K : a.N;
  return mul_mat_id_results_offset(a) + a.T * a.n_used * out_cols * float_type_bytes(a.out_type);
}

// The flat index of the first id outside [0, E), or -1 when all are experts.
inline int64_t first_bad_id(const int32_t* ids, int64_t count, int64_t E) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= E) return i;
  }
  return -1;
}

}  // namespace ggml_ext::cpu
