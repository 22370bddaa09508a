// ggml's GLU ops: y = act(gate) * up with act SiLU (swiglu), tanh GELU (geglu) or erf GELU (geglu_erf), and
// gpt-oss's clamped SwiGLU (swiglu_oai); float32 math, one rounding to T (csrc/glu.h). The same stable forms
// as the CPU kernels (kernels/cpu/vec_math.h): sigmoid from e^-|x|, the tanh GELU as x sigmoid(2u), the erf
// GELU through erfc in the negative tail. Metal has no erf, hence the fit below.
#include "kernels/metal/common.h"

// One thread per output element: threadgroups of up to 256 threads along a row (grid x), one grid row per
// output row (grid y); gate row r at r * in_stride, up `up_offset` elements further (its own buffer).
#define GGML_EXT_GLU_PARAMS(T)                                                                            \
  device const T *gate [[buffer(0)]], device const T *up [[buffer(1)]], device T *y [[buffer(2)]],        \
      constant GluArgs &args [[buffer(3)]], uint2 group [[threadgroup_position_in_grid]],                 \
      uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]]

inline float stable_sigmoid(float x) {
  const float t = precise::exp(-fabs(x));  // e^-|x|: no overflow, and the negative tail keeps its tiny values
  return (x < 0.0f ? t : 1.0f) / (1.0f + t);
}

// e^(-x^2 / 2) with x = xh + xl, xh holding 12 significant bits (xh^2 exact): the rounding of x^2 alone would
// cost tens of ulps in the tail.
inline float exp_neg_half_square(float x) {
  const float xh = as_type<float>(as_type<uint>(x) & 0xfffff000u);
  const float xl = x - xh;
  return precise::exp(-0.5f * (xh * xh)) * precise::exp(-0.5f * (xl * (x + xh)));
}

// Phi(x) = erfc(-x / sqrt 2) / 2, z = |x| / sqrt 2: z < 0.5 from erf(z) = z P(z^2); otherwise from
// erfc(z) = e^(-z^2) Q(1 / (1 + z)), without cancellation in the negative tail. P and Q: the CPU kernel's fits
// (kernels/cpu/vec_math.h, normal_cdf_v).
inline float normal_cdf(float x) {
  const float ax = fabs(x), z = ax * 0.70710678118654752f, z2 = z * z;
  float p = 7.971048762556165e-05f;
  p = p * z2 - 0.0008043373818509281f;
  p = p * z2 + 0.0051918332464993f;
  p = p * z2 - 0.026855509728193283f;
  p = p * z2 + 0.11283621937036514f;
  p = p * z2 - 0.3761262893676758f;
  p = p * z2 + 1.1283791065216064f;
  if (z < 0.5f) return 0.5f + 0.5f * (x < 0.0f ? -z * p : z * p);
  const float t = 1.0f / (1.0f + z);
  const float coefficients[13] = {2.1681878566741943f, -6.983150482177734f, 7.181298732757568f,
                                  1.065826416015625f, -8.479899406433105f, 7.071097373962402f,
                                  -1.6712571382522583f, -0.4480041563510895f, -0.30648842453956604f,
                                  0.28291797637939453f, 0.5642560720443726f, 0.5641820430755615f,
                                  2.1694391705295857e-07f};
  float q = coefficients[0];
  for (int i = 1; i < 13; ++i) q = q * t + coefficients[i];
  // past |x| = 15 the tail is 0 (clamped so that an infinite x gives 0, not inf - inf)
  const float half_erfc = 0.5f * exp_neg_half_square(min(ax, 15.0f)) * q;
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

enum { kSwiglu = 0, kGeglu = 1, kGegluErf = 2, kSwigluOai = 3 };

template <int kKind>
inline float gated(float g, float u, constant GluArgs& args) {
  if (kKind == kSwiglu) return g * stable_sigmoid(g) * u;
  if (kKind == kGeglu) return g * stable_sigmoid(g * (1.5957691216057308f + 0.0713548162726009f * (g * g))) * u;
  if (kKind == kGegluErf) return g * normal_cdf(g) * u;
  // swiglu_oai; comparisons that keep a NaN, as ggml's std::min / std::clamp
  const float x = g > args.limit ? args.limit : g;
  const float v = u > args.limit ? args.limit : (u < -args.limit ? -args.limit : u);
  return x * stable_sigmoid(args.alpha * x) * (v + 1.0f);
}

template <typename T, int kKind>
[[kernel]] void glu(GGML_EXT_GLU_PARAMS(T)) {
  const uint c = group.x * threads + tid;
  if (c >= args.cols) return;
  const size_t src = size_t(group.y) * args.in_stride + c;
  const float g = FloatIO<T>::load(gate[src]);
  const float u = FloatIO<T>::load(up[src + args.up_offset]);
  y[size_t(group.y) * args.cols + c] = FloatIO<T>::store(gated<kKind>(g, u, args));
}

#define GGML_EXT_INSTANTIATE_GLU_KIND(suffix, T, kind, id) \
  template [[host_name("glu_" #kind "_" #suffix)]] [[kernel]] void glu<T, id>(GGML_EXT_GLU_PARAMS(T));
#define GGML_EXT_INSTANTIATE_GLU(suffix, T, unused)            \
  GGML_EXT_INSTANTIATE_GLU_KIND(suffix, T, swiglu, 0)          \
  GGML_EXT_INSTANTIATE_GLU_KIND(suffix, T, geglu, 1)           \
  GGML_EXT_INSTANTIATE_GLU_KIND(suffix, T, geglu_erf, 2)       \
  GGML_EXT_INSTANTIATE_GLU_KIND(suffix, T, swiglu_oai, 3)
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_GLU, 0)
