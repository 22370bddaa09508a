// Products with a weight stored as ggml blocks (csrc/quantized_matmul.h has the contract).
#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// One batch of the product; the glue loops over ggml's broadcast batches.
//   forward (transpose == false): out (M, N) = x (M, K) @ W (N, K)^T
//   transposed (transpose == true): out (M, K) = x (M, N) @ W (N, K)
// W: N rows of row_bytes bytes of ggml type `w_type` (F32/F16/BF16 included), K = the elements of a row.
// x and out are row-contiguous in their float formats; sums in float32. Quantized weights in the forward
// product meet x quantized to int8 per 32 elements, as ggml's CPU does (see matmul.cpp); everything else is
// float32 arithmetic on the decoded values.
struct MatmulArgs {
  const void* x;
  FloatType x_type;
  const void* w;
  int w_type;
  void* out;
  FloatType out_type;
  int64_t M, N, K;
  bool transpose;
  // Forward product on quantized weights: x in two int8 passes (its codes, then its rounding residual's), about
  // 1/254 of the rounding error of ggml's one pass, for more integer work (a row of x costs what two do).
  bool precise_x = false;
};

void quantized_matmul(const MatmulArgs& args);

}  // namespace ggml_ext::cpu
