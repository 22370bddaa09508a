// A strided (batch, heads, rows, dim) array copied into rows of a row-major (batch, heads, dst_rows, dim) buffer,
// as a key/value cache update writes new rows (csrc/kv_cache.h). One description for the CPU loop and the CUDA
// kernel. Plain C++: no MLX, no CUDA.
#pragma once
#include <cstdint>

namespace ggml_ext {

// dst[((b * heads + h) * dst_rows + row0 + r) * dim + d] = src[b * strides[0] + h * strides[1] + r * strides[2] +
// d * strides[3]], strides in elements of `element_bytes` (2 or 4) each; row0 + rows <= dst_rows.
struct RowsCopyArgs {
  const void* src;
  void* dst;
  int64_t batch, heads, rows, dim;
  int64_t strides[4];
  int64_t dst_rows, row0;
  int element_bytes;
  int input;  // which of the op's inputs src is (0: the cache, 1: the new rows): Metal binds it by index
};

// The copies one CUDA launch makes (an append's kept rows into a new buffer and its new rows: one launch, not two);
// the same element size.
struct RowsCopies {
  static constexpr int kMax = 2;
  RowsCopyArgs copy[kMax];
  int count;
};

}  // namespace ggml_ext
