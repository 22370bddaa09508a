// The transposed product out (M, K) = x (M, N) @ W (N, K) (x's gradient): float32 arithmetic on the decoded
// weights, a strip of the output per thread.
#pragma once
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

// The transposed product out (M, K) = x (M, N) @ W (N, K): threads own strips of whole blocks of K; each
// decodes its strip of every weight row once and adds it, times x[:, n], into an accumulator strip.
template <class DecodeStrip>
void transposed(const MatmulArgs& a, int64_t block, DecodeStrip&& decode) {
  std::vector<float> xt(a.N * a.M);  // x transposed: column n of x is contiguous
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    for (int64_t m = 0; m < a.M; ++m) {
      for (int64_t n = 0; n < a.N; ++n) xt[n * a.M + m] = In::to_f32(x[m * a.N + n]);
    }
  });
  const int64_t n_blocks = a.K / block;
  // Strips of at most ~128 KB of accumulators.
  const int64_t strip_blocks =
      std::max<int64_t>(1, std::min<int64_t>(n_blocks, (int64_t(32) << 10) / std::max<int64_t>(1, a.M * block)));
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(n_blocks, strip_blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t s0 = b0; s0 < b1; s0 += strip_blocks) {
        const int64_t s1 = std::min(b1, s0 + strip_blocks), width = (s1 - s0) * block;
        std::vector<float> acc(a.M * width, 0.0f), w(width);
        for (int64_t n = 0; n < a.N; ++n) {
          decode(n, s0, s1, w.data());
          const float* xn = xt.data() + n * a.M;
          for (int64_t m = 0; m < a.M; ++m) {
            const vf32 c = splat(xn[m]);
            float* dst = acc.data() + m * width;
            int64_t k = 0;
            for (; k + kLanes <= width; k += kLanes) F32::store(dst + k, F32::load(dst + k) + c * F32::load(w.data() + k));
            for (; k < width; ++k) dst[k] += xn[m] * w[k];
          }
        }
        for (int64_t m = 0; m < a.M; ++m) {
          for (int64_t k = 0; k < width; ++k) out[m * a.K + s0 * block + k] = Out::from_f32(acc[m * width + k]);
        }
      }
    });
  });
}

inline void store_values16(float* y, const vf32x16& v) { std::memcpy(y, &v, sizeof v); }

template <class Q>
void transposed_quantized(const MatmulArgs& a) {
  using B = typename Q::B;
  const int64_t row_bytes = a.K / Q::kQK * sizeof(B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  const vi8x16 table = codebook_table(Q::layout(0).codebook);
  transposed(a, Q::kQK, [&](int64_t n, int64_t b0, int64_t b1, float* dst) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const uint8_t* p = w + n * row_bytes + blk * sizeof(B);
      float* y = dst + (blk - b0) * Q::kQK;
      [&]<int... C>(std::integer_sequence<int, C...>) {
        (store_values16(y + 16 * C, values16(codes16(p, Q::layout(C), table), Q::scale(reinterpret_cast<const B*>(p), C))),
         ...);
      }(std::make_integer_sequence<int, Q::kQK / 16>{});
    }
  });
}

template <class WFmt>
void transposed_float(const MatmulArgs& a) {
  const auto* w = static_cast<const typename WFmt::T*>(a.w);
  transposed(a, 1, [&](int64_t n, int64_t k0, int64_t k1, float* dst) {
    const auto* src = w + n * a.K;
    for (int64_t k = k0; k < k1; ++k) dst[k - k0] = WFmt::to_f32(src[k]);
  });
}

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
