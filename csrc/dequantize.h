// Dequantize raw ggml blocks to float32/float16/bfloat16.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// data: uint8 holding rows x row_bytes bytes (flat, or with a last axis of row_bytes) for a tensor of
// logical `shape` (last axis = ggml's ne0, rows = product of the others). Returns `shape` in `dtype`: float32
// bit-identical to gguf.quants.dequantize, float16/bfloat16 rounded once from it.
mx::array dequantize(const mx::array& data, int ggml_type, const mx::Shape& shape, mx::Dtype dtype,
                     mx::StreamOrDevice s = {});

// Best-of-`repeats` seconds of the CPU dequantize kernel alone (float32 output, preallocated and faulted-in
// buffers, no MLX graph): what the benchmark compares MLX's per-op cost against.
double time_dequantize_kernel(int ggml_type, int64_t n_blocks, int repeats);

// Input: blocks (..., row_bytes) uint8, row-contiguous. Output: (..., row_bytes / type_size * block_size).
// The public op has one leading axis (rows); vmap adds more.
class Dequantize : public mx::UnaryPrimitive {
 public:
  Dequantize(mx::Stream stream, int ggml_type, mx::Dtype dtype)
      : mx::UnaryPrimitive(stream), type_(ggml_type), dtype_(dtype) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  // The input is raw bytes: no derivative exists; both raise a ValueError naming the op.
  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtDequantize"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  int ggml_type() const { return type_; }

 private:
  int type_;
  mx::Dtype dtype_;  // the output's, kept for vmap
};

}  // namespace mlx_ggml_ext
