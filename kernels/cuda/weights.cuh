// Reading ggml weights on the GPU: per type, 16 consecutive elements (a "chunk") of a row of blocks, decoded
// by the shared reference decoders of kernels/common/ggml_blocks.h (so the layouts live in one place), and
// the X-macro that turns a runtime type id into a compile-time decoder.
#pragma once
#include "kernels/common/ggml_blocks.h"
#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {

// A block type: chunk c (0 .. kChunks-1) of a block.
#define GGML_EXT_CUDA_BLOCK_DECODER(NAME, name, id, qk, bytes)                    \
  struct Weights_##name {                                                        \
    using Block = block_##name;                                                  \
    static constexpr int kChunks = (qk) / 16;                                    \
    __device__ static void block_chunk(const Block* b, int c, float (&y)[16]) {  \
      ggml_ext_dequant16_##name(b, c, y);                                        \
    }                                                                            \
    /* chunk `chunk` of a row of k elements (k is a multiple of qk) */           \
    __device__ static void row_chunk(const uint8_t* row, int64_t chunk, int64_t, float (&y)[16]) { \
      block_chunk(reinterpret_cast<const Block*>(row) + chunk / kChunks, static_cast<int>(chunk % kChunks), y); \
    }                                                                            \
  };
GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_CUDA_BLOCK_DECODER)
#undef GGML_EXT_CUDA_BLOCK_DECODER

// Float weights (a row of k elements, k any length): elements past k read as zero.
template <typename Raw, float (*kValue)(Raw)>
struct FloatWeights {
  __device__ static void row_chunk(const uint8_t* row, int64_t chunk, int64_t k, float (&y)[16]) {
    const Raw* r = reinterpret_cast<const Raw*>(row) + chunk * 16;
    const int64_t valid = k - chunk * 16;
#pragma unroll
    for (int j = 0; j < 16; ++j) y[j] = j < valid ? kValue(r[j]) : 0.0f;
  }
};
__device__ inline float f32_bits_value(uint32_t r) { return __uint_as_float(r); }
__device__ inline float f16_bits_value(uint16_t r) { return __half2float(__ushort_as_half(r)); }
__device__ inline float bf16_bits_value(uint16_t r) { return __uint_as_float(static_cast<uint32_t>(r) << 16); }
using Weights_f32 = FloatWeights<uint32_t, f32_bits_value>;
using Weights_f16 = FloatWeights<uint16_t, f16_bits_value>;
using Weights_bf16 = FloatWeights<uint16_t, bf16_bits_value>;

// make(Weights_<type>{}) for ggml type id `type`: a kernel choice per weight type, from the one type list.
template <typename Make>
auto with_weights(int type, Make&& make) -> decltype(make(Weights_f32{})) {
  switch (type) {
#define GGML_EXT_CUDA_WEIGHTS_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME:                                 \
    return make(Weights_##name{});
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_CUDA_WEIGHTS_CASE)
#undef GGML_EXT_CUDA_WEIGHTS_CASE
    case GGML_EXT_TYPE_F32:
      return make(Weights_f32{});
    case GGML_EXT_TYPE_F16:
      return make(Weights_f16{});
    case GGML_EXT_TYPE_BF16:
      return make(Weights_bf16{});
    default:
      return {};
  }
}

}  // namespace ggml_ext::cuda
