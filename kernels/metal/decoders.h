// Decoders of weight rows, for the dequantize and matmul kernels: runs of 16 consecutive elements decoded
// to float through the shared reference decoders (kernels/common/ggml_blocks.h), so every Metal kernel
// reads a format exactly as the CPU does.
#pragma once
#include "kernels/metal/common.h"

// decoder_<type>::row16(row, run, K, y): elements [16*run, 16*run + 16) of a row of K elements of that
// type, starting at byte `row`. Quantized types: K is a whole number of blocks. Float types: elements at
// K and beyond read as 0 (their rows need not be a whole number of runs).
// staged16(span, run, y): the same run from a row's bytes staged in threadgroup memory (the decode
// kernels); block_bytes: bytes per block_size elements; is_float: a float type (any K, tails zero-filled).
#define GGML_EXT_METAL_BLOCK_DECODER(NAME, name, id, qk, bytes)                                       \
  struct decoder_##name {                                                                             \
    typedef block_##name block;                                                                       \
    enum { block_size = qk, runs_per_block = qk / 16, block_bytes = bytes, is_float = 0 };            \
    template <typename Y>                                                                             \
    static void row16(device const uchar* row, uint run, uint, Y y) {                                 \
      device const block* b = (device const block*)(row + size_t(run / runs_per_block) * sizeof(block)); \
      ggml_ext_dequant16_##name(b, int(run % runs_per_block), y);                                     \
    }                                                                                                 \
    static void staged16(threadgroup const uchar* span, uint run, thread float* y) {                  \
      threadgroup const block* b = (threadgroup const block*)(span + (run / runs_per_block) * bytes); \
      ggml_ext_dequant16_##name(b, int(run % runs_per_block), y);                                     \
    }                                                                                                 \
  };
GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_METAL_BLOCK_DECODER)
#undef GGML_EXT_METAL_BLOCK_DECODER

template <typename S>
struct float_decoder {
  enum { block_size = 1, block_bytes = sizeof(S), is_float = 1 };
  static void staged16(threadgroup const uchar* span, uint run, thread float* y) {
    threadgroup const S* r = (threadgroup const S*)span + 16 * run;
    for (uint j = 0; j < 16; ++j) y[j] = FloatIO<S>::load(r[j]);
  }
  template <typename Y>
  static void row16(device const uchar* row, uint run, uint K, Y y) {
    device const S* r = (device const S*)row;
    for (uint j = 0; j < 16; ++j) {
      const uint k = 16 * run + j;
      y[j] = k < K ? FloatIO<S>::load(r[k]) : 0.0f;
    }
  }
};
typedef float_decoder<float> decoder_f32;
typedef float_decoder<half> decoder_f16;
typedef float_decoder<ushort> decoder_bf16;  // bfloat16 bits

// X(name, ...) for every weight type a matmul kernel reads: the quantized types and the float types.
#define GGML_EXT_METAL_QUANT_NAME(NAME, name, id, qk, bytes) GGML_EXT_METAL_WEIGHT_X(name)
#define GGML_EXT_METAL_FOR_EACH_WEIGHT_TYPE \
  GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_METAL_QUANT_NAME) \
  GGML_EXT_METAL_WEIGHT_X(f32) GGML_EXT_METAL_WEIGHT_X(f16) GGML_EXT_METAL_WEIGHT_X(bf16)
