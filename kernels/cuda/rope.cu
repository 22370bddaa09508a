// ggml's rope_ext: one block per (batch, token). The block first builds the token's cos/sin table in
// shared memory (pair i's angle is the position times theta_scale multiplied i times, the SPEC's iterated
// product, so each thread repeats the same i float multiplications), then rotates every head but the last
// copied_heads, which it copies.
#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 256;

// kPairs rotated pairs per step: 4 when rows and pointers allow vector access, else 1.
template <typename T, bool kNeox, int kPairs>
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeArgs a) {
  const int64_t half = a.n_dims / 2;
  float* cos_tab = dynamic_shared_memory<float>();  // cos[half], then sin[half], then each head's norm scale
  float* sin_tab = cos_tab + half;
  float* head_scale = sin_tab + half;
  const int64_t bt = blockIdx.x;  // batch * tokens + token
  const int64_t batch = bt / a.tokens, token = bt % a.tokens;

  const float position =
      static_cast<float>(a.positions[(batch / a.batches_per_positions_row) * a.tokens + token]);
  const float* factors = a.freq_factors ? a.freq_factors + (batch / a.batches_per_factors_row) * half : nullptr;
  const float sin_scale = a.mscale * a.sin_sign;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = position;
    for (int64_t k = 0; k < i; ++k) theta = __fmul_rn(theta, a.theta_scale);
    const float extrap = factors ? __fdiv_rn(theta, factors[i]) : theta;
    const float interp = __fmul_rn(extrap, a.freq_scale);
    float angle = interp;
    if (a.ramp) {
      const float r = a.ramp[i];
      angle = __fadd_rn(__fmul_rn(interp, __fsub_rn(1.0f, r)), __fmul_rn(extrap, r));
    }
    float s, c;
    sincosf(angle, &s, &c);
    cos_tab[i] = c * a.mscale;
    sin_tab[i] = s * sin_scale;
  }
  const T* x = static_cast<const T*>(a.x) + bt * a.heads * a.dim;
  T* y = static_cast<T*>(a.y) + bt * a.heads * a.dim;
  const int64_t rotated = a.heads - a.copied_heads;
  if (a.q_norm) {  // one warp per head: 1 / rms of its dim elements
    const int lane = threadIdx.x % 32;
    for (int64_t h = threadIdx.x / 32; h < rotated; h += blockDim.x / 32) {
      float sum = 0.0f;
      for (int64_t k = lane; k < a.dim; k += 32) {
        const float v = to_float(x[h * a.dim + k]);
        sum += v * v;
      }
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) head_scale[h] = 1.0f / sqrtf(sum / static_cast<float>(a.dim) + a.norm_eps);
    }
  }
  __syncthreads();

  const int64_t steps_per_head = half / kPairs;
  for (int64_t u = threadIdx.x; u < rotated * steps_per_head; u += blockDim.x) {
    const int64_t row = (u / steps_per_head) * a.dim;
    const int64_t i0 = (u % steps_per_head) * kPairs;
    float first[kPairs], second[kPairs];
    if constexpr (kNeox) {
      load(x + row + i0, first);
      load(x + row + i0 + half, second);
    } else {
      float both[2 * kPairs];
      load(x + row + 2 * i0, both);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) first[j] = both[2 * j], second[j] = both[2 * j + 1];
    }
    if (a.q_norm) {
      const int64_t h = u / steps_per_head;
      const float* w = h < a.q_heads ? a.q_norm : a.k_norm;
      const float scale = head_scale[h];
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int64_t e0 = kNeox ? i0 + j : 2 * (i0 + j), e1 = kNeox ? i0 + j + half : 2 * (i0 + j) + 1;
        first[j] = first[j] * scale * w[e0];
        second[j] = second[j] * scale * w[e1];
      }
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float c = cos_tab[i0 + j], s = sin_tab[i0 + j];
      const float x0 = first[j], x1 = second[j];
      first[j] = x0 * c - x1 * s;
      second[j] = x0 * s + x1 * c;
    }
    if constexpr (kNeox) {
      store(y + row + i0, first);
      store(y + row + i0 + half, second);
    } else {
      float both[2 * kPairs];
#pragma unroll
      for (int j = 0; j < kPairs; ++j) both[2 * j] = first[j], both[2 * j + 1] = second[j];
      store(y + row + 2 * i0, both);
    }
  }
  // Dimensions [n_dims, dim) pass through (partial rotation), normed where the heads are, and the copied heads
  // whole.
  const int64_t rest = a.dim - a.n_dims;
  if (rest > 0 && (x != y || a.q_norm)) {
    for (int64_t e = threadIdx.x; e < rotated * rest; e += blockDim.x) {
      const int64_t h = e / rest, k = a.n_dims + e % rest, at = h * a.dim + k;
      if (a.q_norm) {
        y[at] = from_float<T>(to_float(x[at]) * head_scale[h] * (h < a.q_heads ? a.q_norm : a.k_norm)[k]);
      } else {
        y[at] = x[at];
      }
    }
  }
  if (x == y) return;
  for (int64_t e = rotated * a.dim + threadIdx.x; e < a.heads * a.dim; e += blockDim.x) y[e] = x[e];
}

template <FloatType kType, bool kNeox>
KernelLaunch rope_launch_typed(const RopeArgs& a) {
  using T = typename Storage<kType>::type;
  constexpr int kPairs = 4;
  const bool vector = a.dim % (2 * kPairs) == 0 && a.n_dims % (2 * kPairs) == 0 &&
                      aligned(a.x, 2 * kPairs * sizeof(T)) && aligned(a.y, 2 * kPairs * sizeof(T));
  KernelLaunch l;
  l.kernel = vector ? reinterpret_cast<const void*>(&rope_kernel<T, kNeox, kPairs>)
                    : reinterpret_cast<const void*>(&rope_kernel<T, kNeox, 1>);
  l.grid = dim3(static_cast<unsigned>(a.batches * a.tokens));
  l.block = dim3(kThreads);
  l.shared_bytes = static_cast<unsigned>((a.n_dims + (a.q_norm ? a.heads - a.copied_heads : 0)) * sizeof(float));
  return l;
}

}  // namespace

KernelLaunch rope_launch(const RopeArgs& args, FloatType type, bool neox) {
  GGML_EXT_CUDA_FLOAT_SWITCH(type, kType,
                             return neox ? rope_launch_typed<kType, true>(args) : rope_launch_typed<kType, false>(args));
  return {};
}

}  // namespace ggml_ext::cuda
