// Decode (forward, m <= 8 rows of x): the weight is streamed once, at memory speed. The quantized formats'
// kernels and their plans are described in matmul_decode_plans.cuh and instantiated by group in
// matmul_decode_blocks32.cu, matmul_decode_superblocks.cu and matmul_decode_decoded.cu; here the type picks the
// group, and float weights (F32/F16/BF16) keep the float kernel (matmul_decode_float.cuh), which also takes every
// weight type where x stays float (precise_x: precise_decode_plan).
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_float.cuh"

namespace ggml_ext::cuda {
namespace {

template <typename T, typename Weights>
QuantizedMatmulPlan float_plan(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  l.kernel = reinterpret_cast<const void*>(&decode_float_kernel<Weights, T>);
  l.grid = dim3(ceil_div(a.n, kFloatRows), static_cast<unsigned>(a.batches));
  l.block = dim3(kFloatRows * 32);
  return p;
}

}  // namespace

QuantizedMatmulPlan decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  if (args.m < 1 || args.m > kDecodeMaxM) return {};
  // Quantized weights whose rows split into whole 32-element x-blocks: the integer dot products.
  if (args.k % 32 == 0 && args.k > 0 && args.n > 0) {
    for (auto group : {decode_plan_blocks32, decode_plan_superblocks, decode_plan_decoded}) {
      const QuantizedMatmulPlan p = group(args, ggml_type, x_type);
      if (p.steps[0].kernel) return p;
    }
  }
  // Float weights: the float kernel (quantized ones always take the path above: k is a multiple of 32).
  const bool float_weight =
      ggml_type == GGML_EXT_TYPE_F32 || ggml_type == GGML_EXT_TYPE_F16 || ggml_type == GGML_EXT_TYPE_BF16;
  return float_weight ? precise_decode_plan(args, ggml_type, x_type) : QuantizedMatmulPlan{};
}

// precise_x at decode (a model's output head by default): before it, the float32 FMA tiles took these products, 64
// rows of x per block of which one or a few were real, so a head of 32768 x 2048 did 64 times the FMAs it needed
// (an estimated 0.5 ms a token at the 17.7 TFLOP/s those tiles reached on an H200 at 512 rows). The float kernel
// reads the weight once, as the integer decode kernels do, with float32 FMAs per element of x.
QuantizedMatmulPlan precise_decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  if (args.m < 1 || args.m > kDecodeMaxM || args.n <= 0) return {};
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, {
    using T = typename Storage<kType>::type;
    return with_weights(ggml_type, [&](auto weights) { return float_plan<T, decltype(weights)>(args); });
  });
  return {};
}

}  // namespace ggml_ext::cuda
