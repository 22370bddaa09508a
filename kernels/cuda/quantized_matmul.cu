// Products with weights kept as ggml blocks (the dequantized matrix never exists in global memory): the
// decode kernels (matmul_decode.cu) for the forward product of a few rows of x, the int8 tiles
// (matmul_int8_tiles.cu) for the forward product of more rows on the formats with tensor-core fragments, the
// tiles (matmul_tiles.cu) for the rest. float_x (the op's precise_x) keeps x as floats: the float decode kernel
// for a few rows, else the tiles.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/matmul_common.cuh"

namespace ggml_ext::cuda {
namespace {

// MLX_GGML_EXT_CUDA_INT8_TILES=0 sends the forward product of m > kDecodeMaxM rows back to the WMMA tiles (an A/B
// on the device); read once per process.
bool int8_tiles_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MLX_GGML_EXT_CUDA_INT8_TILES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace

QuantizedMatmulPlan quantized_matmul_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type,
                                          bool transpose, bool float_x) {
  if (!transpose && args.m <= kDecodeMaxM) {
    const QuantizedMatmulPlan p =
        float_x ? precise_decode_plan(args, ggml_type, x_type) : decode_plan(args, ggml_type, x_type);
    if (p.steps[0].kernel) return p;
  }
  if (!transpose && !float_x && args.m > kDecodeMaxM && int8_tiles_enabled()) {
    const QuantizedMatmulPlan p = int8_tiles_plan(args, ggml_type, x_type);
    if (p.steps[0].kernel) return p;
  }
  return tiles_plan(args, ggml_type, x_type, transpose, float_x);
}

}  // namespace ggml_ext::cuda
