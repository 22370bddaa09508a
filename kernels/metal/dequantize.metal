// dequantize: raw ggml blocks to float32/float16/bfloat16 (csrc/dequantize.h). Every value comes from the
// shared reference decoders of kernels/common/ggml_blocks.h, so float32 output has the same bits as the
// CPU kernels and gguf (those decoders keep ggml's products and sums in separate statements, which
// clang's default contraction, -ffp-contract=on, does not fuse). float16/bfloat16 round that float32 once.
#include "kernels/metal/decoders.h"

// One thread per run of 16 elements: decodes it into registers, then writes it.
#define GGML_EXT_DEQUANTIZE_PARAMS(T)                                                           \
  device const uchar *blocks [[buffer(0)]], device T *out [[buffer(1)]],                         \
      constant DequantizeArgs &args [[buffer(2)]], uint unit [[thread_position_in_grid]]

template <typename D, typename T>
[[kernel]] void dequantize_blocks(GGML_EXT_DEQUANTIZE_PARAMS(T)) {
  if (unit >= args.units) return;  // the last threadgroup's spare threads (no barrier follows)
  float values[16];
  D::row16(blocks, unit, 0, values);  // the blocks as one long row
  device T* y = out + size_t(unit) * 16;
  for (int j = 0; j < 16; ++j) y[j] = FloatIO<T>::store(values[j]);
}

// The float types: one element per thread, converted once.
template <typename S, typename T>
[[kernel]] void dequantize_floats(GGML_EXT_DEQUANTIZE_PARAMS(T)) {
  if (unit >= args.units) return;
  out[unit] = FloatIO<T>::store(FloatIO<S>::load(((device const S*)blocks)[unit]));
}

#define GGML_EXT_INSTANTIATE_DEQUANT_BLOCKS(suffix, T, name)                                        \
  template [[host_name("dequantize_" #name "_" #suffix)]] [[kernel]] void dequantize_blocks<decoder_##name, T>( \
      GGML_EXT_DEQUANTIZE_PARAMS(T));
#define GGML_EXT_DEQUANT_TYPE(NAME, name, id, qk, bytes) \
  GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_DEQUANT_BLOCKS, name)
GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_DEQUANT_TYPE)

#define GGML_EXT_INSTANTIATE_DEQUANT_FLOATS(suffix, T, source)                                      \
  template [[host_name("dequantize_" #source "_" #suffix)]] [[kernel]] void dequantize_floats<source##_storage, T>( \
      GGML_EXT_DEQUANTIZE_PARAMS(T));
typedef float f32_storage;
typedef half f16_storage;
typedef ushort bf16_storage;  // bfloat16 bits
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_DEQUANT_FLOATS, f32)
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_DEQUANT_FLOATS, f16)
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_DEQUANT_FLOATS, bf16)
