#include "kernels/cpu/glu.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

// act(g) * up, or swiglu_oai's clamped form (alpha and limit from the arguments).
template <GluKind kKind>
struct Gated {
  float alpha, limit;
  vf32 operator()(vf32 g, vf32 u) const {
    if constexpr (kKind == GluKind::swiglu) return silu_v(g) * u;
    if constexpr (kKind == GluKind::geglu) return gelu_tanh_v(g) * u;
    if constexpr (kKind == GluKind::geglu_erf) return gelu_erf_v(g) * u;
    if constexpr (kKind == GluKind::swiglu_oai) {
      // Written as comparisons that keep a NaN (ggml's std::min / std::clamp keep it too).
      const vf32 x = g > limit ? splat(limit) : g;
      const vf32 y = u > limit ? splat(limit) : (u < -limit ? splat(-limit) : u);
      return x * sigmoid_v(alpha * x) * (y + 1.0f);
    }
  }
};

// Columns [begin, end) of one row. The tail goes through the same vector code, padded with zeros.
template <class Fmt, GluKind kKind>
void glu_span(const Gated<kKind>& gated, const typename Fmt::T* g, const typename Fmt::T* u, typename Fmt::T* y,
              int64_t begin, int64_t end) {
  int64_t c = begin;
  for (; c + kLanes <= end; c += kLanes) Fmt::store(y + c, gated(Fmt::load(g + c), Fmt::load(u + c)));
  if (c == end) return;
  vf32 gv = {}, uv = {};
  for (int64_t i = 0; c + i < end; ++i) {
    gv[i] = Fmt::to_f32(g[c + i]);
    uv[i] = Fmt::to_f32(u[c + i]);
  }
  const vf32 r = gated(gv, uv);
  for (int64_t i = 0; c + i < end; ++i) y[c + i] = Fmt::from_f32(r[i]);
}

template <class Fmt, GluKind kKind>
void glu_typed(const GluArgs& a) {
  using T = typename Fmt::T;
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* y = static_cast<T*>(a.y);
  const Gated<kKind> gated{a.alpha, a.limit};
  // Work in chunks of whole vectors so that threads split long rows too (one row in decode).
  constexpr int64_t kChunk = 512;
  const int64_t chunks_per_row = (a.cols + kChunk - 1) / kChunk;
  // 16 chunks (8K elements, some 20-40 vector operations each) per part: smaller parts do not pay for a wake-up.
  constexpr int64_t kGrain = 16;
  parallel_for(a.rows * chunks_per_row, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = i / chunks_per_row, c0 = (i % chunks_per_row) * kChunk;
      glu_span<Fmt, kKind>(gated, gate + r * a.in_stride, up + r * a.in_stride, y + r * a.cols, c0,
                           std::min(a.cols, c0 + kChunk));
    }
  });
}

}  // namespace

void glu(const GluArgs& a) {
  if (a.rows == 0 || a.cols == 0) return;
  switch (a.kind) {
    case GluKind::swiglu: GGML_EXT_FLOAT_SWITCH(a.type, Fmt, glu_typed<Fmt, GluKind::swiglu>(a)); break;
    case GluKind::geglu: GGML_EXT_FLOAT_SWITCH(a.type, Fmt, glu_typed<Fmt, GluKind::geglu>(a)); break;
    case GluKind::geglu_erf: GGML_EXT_FLOAT_SWITCH(a.type, Fmt, glu_typed<Fmt, GluKind::geglu_erf>(a)); break;
    case GluKind::swiglu_oai: GGML_EXT_FLOAT_SWITCH(a.type, Fmt, glu_typed<Fmt, GluKind::swiglu_oai>(a)); break;
  }
}

}  // namespace ggml_ext::cpu::GGML_EXT_ISA

namespace ggml_ext::cpu {
GGML_EXT_DISPATCH(glu, GluArgs)
}
