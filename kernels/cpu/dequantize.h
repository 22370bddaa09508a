#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// out[i * block_size + e] = element e of block i, for n_blocks consecutive blocks of ggml type `type`
// (a ggml_ext_type_id; F32/F16/BF16 are blocks of one element), rounded once to out_type. float32 output is
// bit-identical to the shared decoders of kernels/common/ggml_blocks.h (and to gguf.quants.dequantize).
struct DequantizeArgs {
  const void* blocks;
  void* out;
  int type;
  FloatType out_type;
  int64_t n_blocks;
};

void dequantize(const DequantizeArgs& args);

}  // namespace ggml_ext::cpu
