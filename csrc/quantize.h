// Quantize float tensors to ggml blocks.
#pragma once
#include <optional>

#include "csrc/utils.h"

namespace mlx_ggml_ext {

// w: float32/float16/bfloat16 (..., K), K a multiple of the type's block size. Returns uint8
// (rows, bytes_per_row), rows = the product of w's leading axes (1 for a vector). Types: F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 (byte-identical to gguf.quants.quantize for finite input), Q4_K, Q5_K,
// Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS; others raise not_implemented_error. NaN/inf: see kernels/cpu/quantize.h.
// imatrix (optional, float32 (K,), >= 0): per-column weights of the squared error that the scale searches
// minimize (Q2_K .. Q6_K, IQ4_NL, IQ4_XS; the byte-exact types reject it). The op's second input.
mx::array quantize(const mx::array& w, int ggml_type, const std::optional<mx::array>& imatrix = std::nullopt,
                   mx::StreamOrDevice s = {});

// Inputs: w (..., K), row-contiguous, and the optional imatrix (K,). Output: uint8 (..., K / block_size * type_size).
class Quantize : public mx::UnaryPrimitive {
 public:
  Quantize(mx::Stream stream, int ggml_type) : mx::UnaryPrimitive(stream), type_(ggml_type) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  // Rounding to a grid is piecewise constant: no useful derivative; both raise a ValueError naming the op.
  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtQuantize"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  int ggml_type() const { return type_; }

 private:
  int type_;
};

}  // namespace mlx_ggml_ext
