// Products with a weight stored as ggml blocks, computed on the blocks (the dequantized matrix is never
// materialized, but for the CUDA dense route of quantized_matmul.cpp: many rows of half-precision x):
// quantized_matmul (x @ W^T, MLX layout) and mul_mat (ggml's ggml_mul_mat, ggml layout).
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// x: (..., K) float32/float16/bfloat16; w_blocks: uint8 (N, row_bytes) raw blocks of a ggml type (float
// types included) for a weight of logical shape (N, K). Returns (..., N) in x's dtype, float32 accumulation.
// precise_x: x enters the integer products in two int8 passes on the CPU (its codes, then those of their rounding
// residual) and as floats on the GPU, instead of ggml's one int8 pass (see kernels/cpu/matmul.h).
mx::array quantized_matmul(const mx::array& x, const mx::array& w_blocks, int ggml_type, mx::StreamOrDevice s = {},
                           bool precise_x = false);

// ggml_mul_mat in MLX order: a (A3, A2, M, K) as ggml blocks (uint8, last axis row bytes, `ggml_type`) or
// a float array (ggml_type < 0: its dtype decides), b (B3, B2, N, K) float; fewer leading axes allowed.
// Returns float32 (B3, B2, N, M) = b @ a^T with b's batch i2 using a's batch i2 / (B2 / A2) (same for i3).
mx::array mul_mat(const mx::array& a, int ggml_type, const mx::Shape& a_shape, const mx::array& b,
                  mx::StreamOrDevice s = {});

// A float weight's ggml type (from its dtype) and its bytes as uint8 rows; raw blocks pass through (shared with
// mul_mat_id).
struct WeightBytes {
  mx::array bytes;
  int type;
};
WeightBytes weight_bytes(const mx::array& w, int ggml_type, const char* op, const char* arg, mx::StreamOrDevice s);
// The bytes of a K-long row: a clear error when K does not fill whole blocks of the type.
int64_t checked_row_bytes(int type, int64_t K, const char* op);

// The primitive behind both. Inputs, both row-contiguous:
//   x: (B3, B2, M, Kx) float32/float16/bfloat16; against an unbatched weight (A3 = A2 = 1) any (..., Kx),
//      every leading axis being rows (the output keeps x's leading shape)
//   w: (A3, A2, N, row_bytes) uint8, each row N_i holding K = row_bytes / type_size * block_size elements of
//      `ggml_type` (F32/F16/BF16 as their raw bytes too), with B2 % A2 == 0 and B3 % A3 == 0; batch (b3, b2)
//      of x uses w's batch (b3 / (B3 / A3), b2 / (B2 / A2)): ggml's broadcasting.
// transpose == false: Kx == K, out (..., N)[m, n] = sum_k x[m, k] * W[n, k]      (the forward product)
// transpose == true:  Kx == N, out (..., K)[m, k] = sum_n x[m, n] * W[n, k]      (x's gradient)
// out has dtype `out_dtype` (x's for quantized_matmul, float32 for mul_mat); sums in float32 or better.
class QuantizedMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, int ggml_type, bool transpose, mx::Dtype out_dtype, bool precise_x = false)
      : mx::UnaryPrimitive(stream), type_(ggml_type), transpose_(transpose), out_dtype_(out_dtype),
        precise_x_(precise_x) {}

  MLX_GGML_EXT_EVAL_OVERRIDES
  // x is differentiable (vjp: the transposed product on the same blocks); the weight's bytes are not (a clear
  // error). vmap maps x's axes and a batch of weights.
  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return transpose_ ? "GGMLExtQuantizedMatmulT" : "GGMLExtQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  int ggml_type() const { return type_; }
  bool transpose() const { return transpose_; }
  bool precise_x() const { return precise_x_; }

 private:
  int type_;
  bool transpose_;
  mx::Dtype out_dtype_;
  bool precise_x_;  // x in two int8 passes (CPU) / as floats (GPU): quantized_matmul's precise_x
};

}  // namespace mlx_ggml_ext
