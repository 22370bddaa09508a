// Products with weights kept as ggml blocks (the dequantized matrix never exists in global memory): the
// decode kernels (matmul_decode.cu) for the forward product of a few rows of x, the tiles (matmul_tiles.cu)
// for the rest.
#include "kernels/cuda/matmul_common.cuh"

namespace ggml_ext::cuda {

QuantizedMatmulPlan quantized_matmul_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type,
                                          bool transpose, bool float_x) {
  if (!transpose && !float_x && args.m <= kDecodeMaxM) {
    QuantizedMatmulPlan p = decode_plan(args, ggml_type, x_type);
    if (p.steps[0].kernel) return p;
  }
  return tiles_plan(args, ggml_type, x_type, transpose, float_x);
}

}  // namespace ggml_ext::cuda
