// Dequantize: one thread per 16-element chunk of a block, decoded by the shared reference decoders of
// kernels/common/ggml_blocks.h, so the layouts live in one place. This file is compiled with -fmad=false:
// ggml rounds d*q and then adds or subtracts the offset, and a fused multiply-add would round once, breaking
// bit-identity with gguf.
#include "kernels/cuda/weights.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Decoder, typename Out>
__global__ void __launch_bounds__(kThreads) dequantize_blocks_kernel(DequantizeArgs a) {
  // A warp's 32 chunks are whole blocks (kChunks divides 32). The warp copies their bytes to shared memory in the
  // widest words the address allows (the decoders then read bytes from there, not one global load per byte), and
  // stores its outputs through shared memory too, so that each 16-byte store instruction writes 512 consecutive
  // bytes (lane by lane a chunk apart, they wrote partial sectors of 8 lines).
  using Block = typename Decoder::Block;
  static_assert(32 % Decoder::kChunks == 0, "a warp's chunks are whole blocks");
  constexpr int kInBytes = 32 / Decoder::kChunks * static_cast<int>(sizeof(Block));
  constexpr int kWords = 16 * static_cast<int>(sizeof(Out)) / 16;  // 16-byte words of one chunk's output
  __shared__ uint4 staged_in[kThreads / 32][(kInBytes + 15) / 16];
  __shared__ uint4 staged_out[kThreads / 32][32 * kWords];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t total = a.n_blocks * Decoder::kChunks;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + warp * 32;  // the warp's first chunk
  const int64_t chunk = first + lane;
  if (first >= total) return;  // the whole warp
  float v[16];
  if (first + 32 <= total) {
    const uint8_t* src = static_cast<const uint8_t*>(a.blocks) + first / Decoder::kChunks * sizeof(Block);
    uint8_t* in = reinterpret_cast<uint8_t*>(staged_in[warp]);
    warp_copy(src, in, kInBytes, copy_width(reinterpret_cast<uintptr_t>(src), kInBytes), lane);
    __syncwarp();
    Decoder::block_chunk(reinterpret_cast<const Block*>(in) + lane / Decoder::kChunks, lane % Decoder::kChunks, v);
    Out* mine = reinterpret_cast<Out*>(staged_out[warp] + lane * kWords);
#pragma unroll
    for (int j = 0; j < 16; ++j) mine[j] = from_float<Out>(v[j]);
    __syncwarp();
    uint4* y = reinterpret_cast<uint4*>(static_cast<Out*>(a.y) + first * 16);  // 16-byte aligned
#pragma unroll
    for (int i = 0; i < kWords; ++i) y[32 * i + lane] = staged_out[warp][32 * i + lane];
    return;
  }
  if (chunk >= total) return;
  // The last warp's chunks, straight from global memory: four stores of four each.
  Decoder::block_chunk(static_cast<const Block*>(a.blocks) + chunk / Decoder::kChunks,
                       static_cast<int>(chunk % Decoder::kChunks), v);
  Out* y = static_cast<Out*>(a.y) + chunk * 16;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float part[4] = {v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]};
    store(y + 4 * q, part);
  }
}

// F32/F16/BF16 storage: four elements per thread (the tail one at a time).
template <typename Raw, float (*kValue)(Raw), typename Out, bool kVector>
__global__ void __launch_bounds__(kThreads) convert_kernel(DequantizeArgs a) {
  constexpr int kPack = 4;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPack;
  if (first >= a.n_blocks) return;
  const auto* in = static_cast<const Raw*>(a.blocks) + first;
  Out* y = static_cast<Out*>(a.y) + first;
  if (kVector && first + kPack <= a.n_blocks) {
    Raw raw[kPack];
    using W = typename Word<kPack * sizeof(Raw)>::type;
    *reinterpret_cast<W*>(raw) = *reinterpret_cast<const W*>(in);
    float v[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) v[j] = kValue(raw[j]);
    store(y, v);
  } else {
    for (int64_t j = 0; first + j < a.n_blocks; ++j) y[j] = from_float<Out>(kValue(in[j]));
  }
}

template <typename Raw, float (*kValue)(Raw), typename Out>
const void* convert_kernel_for(const DequantizeArgs& a) {
  return aligned(a.blocks, 4 * sizeof(Raw)) ? reinterpret_cast<const void*>(&convert_kernel<Raw, kValue, Out, true>)
                                            : reinterpret_cast<const void*>(&convert_kernel<Raw, kValue, Out, false>);
}

template <typename Out>
KernelLaunch dequantize_launch_typed(const DequantizeArgs& a, int type) {
  KernelLaunch l;
  l.block = dim3(kThreads);
  switch (type) {
#define GGML_EXT_CUDA_QUANT_CASE(NAME, name, id, qk, bytes)                                         \
  case GGML_EXT_TYPE_##NAME:                                                                       \
    l.kernel = reinterpret_cast<const void*>(&dequantize_blocks_kernel<Weights_##name, Out>);      \
    l.grid = dim3(ceil_div(a.n_blocks * Weights_##name::kChunks, kThreads));                       \
    return l;
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_CUDA_QUANT_CASE)
#undef GGML_EXT_CUDA_QUANT_CASE
    case GGML_EXT_TYPE_F32:
      l.kernel = convert_kernel_for<uint32_t, f32_bits_value, Out>(a);
      break;
    case GGML_EXT_TYPE_F16:
      l.kernel = convert_kernel_for<uint16_t, f16_bits_value, Out>(a);
      break;
    case GGML_EXT_TYPE_BF16:
      l.kernel = convert_kernel_for<uint16_t, bf16_bits_value, Out>(a);
      break;
    default:
      return {};
  }
  l.grid = dim3(ceil_div(a.n_blocks, 4 * kThreads));
  return l;
}

}  // namespace

KernelLaunch dequantize_launch(const DequantizeArgs& args, int ggml_type, FloatType out_type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(out_type, kType,
                             return dequantize_launch_typed<typename Storage<kType>::type>(args, ggml_type));
  return {};
}

}  // namespace ggml_ext::cuda
