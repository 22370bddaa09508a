// What the matmul kernels share (decode.metal, quantized_matmul.metal): the batch offsets, the output
// store in the output's dtype, and the parameter list.
#pragma once
#include "kernels/metal/decoders.h"

struct MatmulBatch {
  size_t x, w, out;  // element / byte / element offsets of batch z
};

// ggml's broadcasting: batch z = b3 * B2 + b2 of x uses the weight batch (b3 / r3) * A2 + b2 / r2.
inline MatmulBatch matmul_batch(constant MatmulArgs& a, uint z, uint x_cols, uint out_cols) {
  const uint b3 = z / a.B2, b2 = z % a.B2;
  MatmulBatch at;
  at.x = size_t(z) * a.M * x_cols;
  at.w = (size_t(b3 / a.r3) * a.A2 + b2 / a.r2) * a.N * a.row_bytes;
  at.out = size_t(z) * a.M * out_cols;
  return at;
}

inline void store_output(device uchar* out, size_t i, uint out_type, float v) {
  if (out_type == kMatmulOutF32) {
    ((device float*)out)[i] = v;
  } else if (out_type == kMatmulOutF16) {
    ((device half*)out)[i] = FloatIO<half>::store(v);
  } else {
    ((device ushort*)out)[i] = FloatIO<ushort>::store(v);
  }
}

#define GGML_EXT_MATMUL_PARAMS(T)                                                                     \
  device const T *x [[buffer(0)]], device const uchar *w [[buffer(1)]], device uchar *out [[buffer(2)]], \
      constant MatmulArgs &args [[buffer(3)]], uint3 group [[threadgroup_position_in_grid]],             \
      uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],                 \
      uint simdgroup [[simdgroup_index_in_threadgroup]]
