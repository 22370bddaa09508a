// The decode plans and kernels of the grid and ternary formats (IQ1..IQ3, TQ1_0, TQ2_0), decoded to int8 codes.
// One translation unit per group of formats (matmul_decode_plans.cuh) so that the compiler takes them in parallel.
#include "kernels/cuda/matmul_decode_plans.cuh"

namespace ggml_ext::cuda {

QuantizedMatmulPlan decode_plan_decoded(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  return group_plan<IsDecoded>(args, ggml_type, x_type);
}

}  // namespace ggml_ext::cuda
