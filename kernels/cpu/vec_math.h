// Vectorized exp, and the activations built on it (SiLU, tanh-approximated GELU, erf GELU, tanh), on the
// variant's float vectors. Written for float32 accuracy of a few ulps (docs/fused-ops.md has the measured
// errors), with every lane computed the same way so that a row's tail (padded into a vector) rounds exactly
// as its body does. No table, no branch on the data.
#pragma once
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {

typedef int32_t vi32 __attribute__((vector_size(kLanes * 4)));

// 2^n for integer-valued n in [-126, 127], from its exponent bits.
inline vf32 pow2_int(vf32 n) {
  const vi32 bits = (__builtin_convertvector(n, vi32) + 127) << 23;
  return (vf32)bits;
}

// e^x: x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, so r is exact enough), e^r by its degree-7 Taylor
// polynomial (truncation below 0.1 ulp), times 2^n applied as two factors so that n from -159 to 128 needs no
// special case: results past FLT_MAX become +inf, below the denormals 0. NaN stays NaN, -inf gives 0.
inline vf32 exp_v(vf32 x) {
  const vf32 lo = splat(-110.0f), hi = splat(89.0f);
  x = x < lo ? lo : x;  // a NaN compares false both times and stays
  x = x > hi ? hi : x;
  const vf32 n = round_to_nearest_even(x * 1.44269504088896341f);
  const vf32 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4
  vf32 p = splat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n = n1 + n2 with both halves inside the normal exponents
  const vf32 n1 = round_to_nearest_even(n * 0.5f - 0.25f);  // floor(n / 2) for integer n
  return p * pow2_int(n1) * pow2_int(n - n1);
}

// sigmoid(x) = 1 / (1 + e^-x), as t / (1 + t) with t = e^x for negative x: e^|x| never overflows, so the
// far negative tail keeps its tiny values instead of flushing them to zero.
inline vf32 sigmoid_v(vf32 x) {
  const vf32 t = exp_v(x < 0.0f ? x : -x);  // e^-|x|
  return (x < 0.0f ? t : splat(1.0f)) / (1.0f + t);
}

// SiLU: x sigmoid(x).
inline vf32 silu_v(vf32 x) { return x * sigmoid_v(x); }

// The tanh-approximated GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as
// x sigmoid(2u) (the same function), which has no cancellation for negative x where 1 + tanh(u) has.
inline vf32 gelu_tanh_v(vf32 x) {
  const vf32 two_u = x * (1.5957691216057308f + 0.0713548162726009f * (x * x));  // 2 sqrt(2/pi) (x + c x^3)
  return x * sigmoid_v(two_u);
}

// tanh(y) = sign(y) (1 - 2 / (1 + e^(2|y|))): absolute error of about one ulp of 1 (the softcap's use).
inline vf32 tanh_v(vf32 y) {
  const vf32 a = y < 0.0f ? -y : y;
  const vf32 t = 1.0f - 2.0f / (1.0f + exp_v(2.0f * a));
  return y < 0.0f ? -t : t;
}

// e^(-x^2 / 2) without the rounding of x^2 (whose relative error, multiplied by x^2 / 2, would cost tens of
// ulps in the tail): x = xh + xl with xh holding 12 significant bits, so xh^2 is exact, and
// x^2 = xh^2 + xl (x + xh), the second part small enough that its rounding does not matter.
inline vf32 exp_neg_half_square_v(vf32 x) {
  const vf32 xh = (vf32)((vu32)x & 0xfffff000u);
  const vf32 xl = x - xh;
  return exp_v(-0.5f * (xh * xh)) * exp_v(-0.5f * (xl * (x + xh)));
}

// The standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt(2)), for the erf GELU x Phi(x). With z = |x| / sqrt(2):
// z < 0.5: 0.5 + 0.5 erf(+-z), erf(z) = z P(z^2); z >= 0.5: erfc(z) = e^(-z^2) Q(1 / (1 + z)), which carries no
// cancellation into the negative tail: Phi(x) = 0.5 erfc(z) for x < 0, 1 - 0.5 erfc(z) for x > 0. P and Q are
// least-squares fits (relative, in float64, coefficients rounded to float) to erf(z)/z on [0, 1] and to
// erfc(z) e^(z^2) on [0.5, 10]; past z = 10 erfc underflows.
inline vf32 normal_cdf_v(vf32 x) {
  const vf32 ax = x < 0.0f ? -x : x;
  const vf32 z = ax * 0.70710678118654752f;
  const vf32 z2 = z * z;
  vf32 p = splat(7.971048762556165e-05f);
  p = p * z2 + -0.0008043373818509281f;
  p = p * z2 + 0.0051918332464993f;
  p = p * z2 + -0.026855509728193283f;
  p = p * z2 + 0.11283621937036514f;
  p = p * z2 + -0.3761262893676758f;
  p = p * z2 + 1.1283791065216064f;
  const vf32 erf_small = z * p;
  const vf32 t = 1.0f / (1.0f + z);
  vf32 q = splat(2.1681878566741943f);
  q = q * t + -6.983150482177734f;
  q = q * t + 7.181298732757568f;
  q = q * t + 1.065826416015625f;
  q = q * t + -8.479899406433105f;
  q = q * t + 7.071097373962402f;
  q = q * t + -1.6712571382522583f;
  q = q * t + -0.4480041563510895f;
  q = q * t + -0.30648842453956604f;
  q = q * t + 0.28291797637939453f;
  q = q * t + 0.5642560720443726f;
  q = q * t + 0.5641820430755615f;
  q = q * t + 2.1694391705295857e-07f;
  // past |x| = 15 the tail is 0 (clamped so that an infinite x gives 0, not inf - inf)
  const vf32 half_erfc = 0.5f * exp_neg_half_square_v(ax < 15.0f ? ax : splat(15.0f)) * q;
  const vf32 small = 0.5f + 0.5f * (x < 0.0f ? -erf_small : erf_small);
  const vf32 tail = x < 0.0f ? half_erfc : 1.0f - half_erfc;
  return z < 0.5f ? small : tail;
}

inline vf32 gelu_erf_v(vf32 x) { return x * normal_cdf_v(x); }

}  // namespace ggml_ext::cpu::GGML_EXT_ISA
