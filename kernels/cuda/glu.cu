// ggml's GLU ops (swiglu, geglu, geglu_erf; swiglu_oai with its clamps): y = act(gate) * up, one element per
// thread in a grid-stride loop, float32 math with the stable forms of kernels/cpu/vec_math.h: sigmoid from
// e^-|x| (no overflow in the negative tail), the tanh GELU as x sigmoid(2u), the erf GELU as x erfc(-x / sqrt 2)
// / 2.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float x) {
  const float t = expf(-fabsf(x));
  return (x < 0.0f ? t : 1.0f) / (1.0f + t);
}

// x Phi(x) = x erfc(z) / 2 with z = -x / sqrt 2. In the negative tail erfc is ill-conditioned (d ln erfc / dz is
// about -2z), so the rounding of z alone would cost up to ~2z^2 / 2 ulps (80 ulps at x = -10, seen on an H100):
// z's rounding error dz (exact by an FMA, plus the float 1/sqrt 2's own error) is applied to first order.
__device__ __forceinline__ float gelu_erf(float g) {
  constexpr float kHi = 0.70710678118654752f, kLo = 1.2101617e-8f;  // 1/sqrt 2 = kHi + kLo
  const float z = -kHi * g;
  const float dz = fmaf(-kHi, g, -z) - kLo * g;
  const float e = erfcf(z);
  const float dlog = e > 0.0f ? -1.1283791670955126f * expf(-z * z) / e : 0.0f;  // d ln erfc(z) / dz
  // Not finite only for an infinite x, where there is nothing to correct (a NaN fails the comparison too).
  const float correction = dlog * dz;
  return 0.5f * g * e * (1.0f + (fabsf(correction) <= 3.402823466e38f ? correction : 0.0f));
}

template <int kKind>
__device__ __forceinline__ float activation(float g) {
  if constexpr (kKind == 0) return g * sigmoid(g);
  if constexpr (kKind == 1) return g * sigmoid(g * (1.5957691216057308f + 0.0713548162726009f * (g * g)));
  return gelu_erf(g);
}

// act(g) * u; swiglu_oai: min(g, limit) sigmoid(alpha min(g, limit)) (clamp(u, -limit, limit) + 1), the
// comparisons keeping a NaN as ggml's std::min / std::clamp do.
template <int kKind>
__device__ __forceinline__ float gated(float g, float u, float alpha, float limit) {
  if constexpr (kKind == 3) {
    const float x = g > limit ? limit : g;
    const float y = u > limit ? limit : (u < -limit ? -limit : u);
    return x * sigmoid(alpha * x) * (y + 1.0f);
  } else {
    return activation<kKind>(g) * u;
  }
}

template <typename T, int kKind>
__global__ void __launch_bounds__(kThreads) glu_kernel(GluArgs a) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* y = static_cast<T*>(a.y);
  const int64_t n = a.rows * a.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t src = (i / a.cols) * a.in_stride + i % a.cols;
    y[i] = from_float<T>(gated<kKind>(to_float(gate[src]), to_float(up[src]), a.alpha, a.limit));
  }
}

template <FloatType kType>
KernelLaunch glu_launch_typed(const GluArgs& a, int kind) {
  using T = typename Storage<kType>::type;
  KernelLaunch l;
  switch (kind) {
    case 0: l.kernel = reinterpret_cast<const void*>(&glu_kernel<T, 0>); break;
    case 1: l.kernel = reinterpret_cast<const void*>(&glu_kernel<T, 1>); break;
    case 2: l.kernel = reinterpret_cast<const void*>(&glu_kernel<T, 2>); break;
    case 3: l.kernel = reinterpret_cast<const void*>(&glu_kernel<T, 3>); break;
    default: return l;
  }
  // Enough blocks to fill any GPU many times over; the loop covers the rest.
  l.grid = dim3(std::max(1u, std::min(ceil_div(a.rows * a.cols, kThreads), 1u << 16)));
  l.block = dim3(kThreads);
  return l;
}

}  // namespace

KernelLaunch glu_launch(const GluArgs& args, FloatType type, int kind) {
  GGML_EXT_CUDA_FLOAT_SWITCH(type, kType, return glu_launch_typed<kType>(args, kind));
  return {};
}

}  // namespace ggml_ext::cuda
