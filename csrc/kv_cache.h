// A key/value cache's append as one node: out = concatenate([cache[:, :, :offset], rows], axis=2), written into the
// cache's own buffer where it has room, so that a decode token's update of one cache is one node where mlx-lm's
// KVCache builds two (a slice update and a slice), and copies nothing but the new rows. A decode token's time on a
// GPU is mostly per-node host time, and every layer updates its two caches once a token.
//
// One output only: MLX gives every output of a primitive its own copy of the input list, so an input of a
// multi-output primitive is held more than once and never donatable (measured: rope_qkv never reuses qkv).
//
// The output is a view of the first offset + T rows of a (B, H, capacity, D) buffer: the cache's own when MLX lets
// it be donated (nothing else holds it or shares its memory), its layout is that and its buffer has room for
// offset + T rows; else a new one of offset + T rows rounded up to `step`. Passing the output back as the next
// call's cache (with offset = its rows) writes the next rows in place.
#pragma once
#include <vector>

#include "csrc/utils.h"
#include "kernels/common/rows_copy.h"

namespace mlx_ggml_ext {

// cache (B, H, R, D), rows (B, H, T, D) converted to the cache's dtype, 0 <= offset <= R, step > 0 ->
// (B, H, offset + T, D).
mx::array kv_cache_append(const mx::array& cache, const mx::array& rows, int offset, int step,
                          mx::StreamOrDevice s = {});

// Inputs: cache, rows, in any strides (the kernels read them as they are: a row_contiguous copy node would cost
// what the op saves). Its transformations are those of the unfused graph (slice, concatenate).
class KVCacheAppend : public mx::UnaryPrimitive {
 public:
  KVCacheAppend(mx::Stream stream, int offset, int step) : mx::UnaryPrimitive(stream), offset_(offset), step_(step) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtKVCacheAppend"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  // Re-checks the shapes, which mx.compile(shapeless=True) may change after the op's checks.
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  // For every backend's eval: gives `out` its memory (the cache's buffer or MLX's allocator's, which MLX may
  // donate again next call) and returns the copies to make, in any order (they write disjoint rows).
  std::vector<ggml_ext::RowsCopyArgs> place(const std::vector<mx::array>& inputs, mx::array& out,
                                            void* (*data)(const mx::array&)) const;

  int offset_;
  int step_;
};

}  // namespace mlx_ggml_ext
