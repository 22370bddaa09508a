// The decode plans and kernels of ggml's formats of 32-element blocks (Q4_0 .. Q8_0, IQ4_NL, MXFP4).
// One translation unit per group of formats (matmul_decode_plans.cuh) so that the compiler takes them in parallel.
#include "kernels/cuda/matmul_decode_plans.cuh"

namespace ggml_ext::cuda {

QuantizedMatmulPlan decode_plan_blocks32(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  return group_plan<InBlocksOf32>(args, ggml_type, x_type);
}

}  // namespace ggml_ext::cuda
