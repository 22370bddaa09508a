// ggml's ggml_mul_mat_id: a product with one of E expert matrices per (token, slot), the experts chosen by ids
// (the feed-forward of a mixture-of-experts model), computed on the experts' ggml blocks.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// w: E expert matrices of logical shape (E, N, K): ggml blocks (uint8, last axis row bytes, `ggml_type`) or a
// float array (ggml_type < 0: its dtype decides). x: (T, X, K) float32/float16/bfloat16 with X = n_used or 1 (one
// row per token, read by every slot); ids: integer (T, n_used), every entry in [0, E).
// Returns (T, n_used, N) in x's dtype: out[t, s] = W[ids[t, s]] @ x[t, s or 0] (float32 sums).
// Bad ids raise ValueError here when ids are already evaluated; otherwise the evaluation fails (mx.eval raises
// RuntimeError with the same message) before any weight is read.
mx::array mul_mat_id(const mx::array& w, int ggml_type, const mx::Shape& w_shape, const mx::array& x,
                     const mx::array& ids, mx::StreamOrDevice s = {});

// The primitive. Inputs, row-contiguous: x (T, X, Kx) float, w (E, N, row_bytes) uint8 with K elements per row,
// ids (T, n_used) int32.
// transpose == false: Kx == K, X in {1, n_used}, out (T, n_used, N)  (the forward product)
// transpose == true:  Kx == N, X == n_used,      out (T, n_used, K)  (x's gradient, before summing the slots of
//                                                                     a broadcast x)
class MulMatId : public mx::UnaryPrimitive {
 public:
  MulMatId(mx::Stream stream, int ggml_type, bool transpose)
      : mx::UnaryPrimitive(stream), type_(ggml_type), transpose_(transpose) {}

  MLX_GGML_EXT_EVAL_OVERRIDES
  // Differentiable in x (vjp and jvp: the products on the same blocks and ids); the weight's bytes and the ids
  // are not (clear errors). vmap maps x, ids and a batch of expert sets.
  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return transpose_ ? "GGMLExtMulMatIdT" : "GGMLExtMulMatId"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_;
  bool transpose_;
};

// The message for an id outside [0, E) at flat position `index` of ids (T, n_used).
std::string bad_id_message(int64_t index, int64_t id, int64_t n_used, int64_t E);

}  // namespace mlx_ggml_ext
