// The decode plans and kernels of the 256-element super-blocks read in place (the K-quants, IQ4_XS).
// One translation unit per group of formats (matmul_decode_plans.cuh) so that the compiler takes them in parallel.
#include "kernels/cuda/matmul_decode_plans.cuh"

namespace ggml_ext::cuda {

QuantizedMatmulPlan decode_plan_superblocks(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  return group_plan<InSuperBlocks>(args, ggml_type, x_type);
}

}  // namespace ggml_ext::cuda
