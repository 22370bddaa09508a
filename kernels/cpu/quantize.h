#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// Quantizes n_blocks * block_size consecutive values of in_type into n_blocks blocks of ggml type `type`
// (a ggml_ext_type_id: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q2_K .. Q6_K, IQ4_NL, IQ4_XS).
//
// F32/F16/BF16 and the legacy types and MXFP4: byte-identical to gguf.quants.quantize for finite input.
// Q2_K .. Q6_K, IQ4_NL, IQ4_XS: a least-squares search of sub-block scales (see quantize_search.h); with
// `imatrix` (row_length floats, one per column, >= 0) the squared error of each element is weighted by its
// column's entry.
// A block holding NaN or +-inf is stored so that every element decodes non-finite: NaN float16 scales, or
// for MXFP4 (whose E8M0 scale has no NaN in ggml) scale 0xFF with the code for 12, which decodes to +inf.
struct QuantizeArgs {
  const void* x;
  FloatType in_type;
  void* blocks;
  int type;
  int64_t n_blocks;
  const float* imatrix = nullptr;  // optional; only the weighted types above read it
  int64_t row_length = 0;          // elements per row (the imatrix's length)
};

void quantize(const QuantizeArgs& args);

}  // namespace ggml_ext::cpu
