// rope: ggml's rope_ext on x (batches, tokens, heads, dim), NORMAL or NEOX, partial rotation, YaRN,
// freq_factors (csrc/rope.h; the formula in SPEC.md). The per-op constants (theta_scale, mscale, the
// YaRN mix of each pair) come from the host, computed there once for every backend.
#include "kernels/metal/common.h"

// One threadgroup per (token, batch): its threads first compute the cos/sin table of the token's
// n_dims/2 pairs into threadgroup memory (pair i: the iterated product pos * theta_scale^i, i float
// multiplications as ggml does, not a pow), then rotate every head with it and copy dims n_dims.. dim.
#define GGML_EXT_ROPE_PARAMS(T)                                                                        \
  device const T *x [[buffer(0)]], device T *y [[buffer(1)]], device const int *positions [[buffer(2)]], \
      device const float *freq_factors [[buffer(3)]], device const float *ramp [[buffer(4)]],             \
      constant RopeArgs &args [[buffer(5)]], threadgroup float *table [[threadgroup(0)]],                  \
      uint2 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],              \
      uint threads [[threads_per_threadgroup]]

template <typename T>
[[kernel]] void rope(GGML_EXT_ROPE_PARAMS(T)) {
  const uint token = group.x, batch = group.y;
  const uint pairs = args.n_dims / 2;
  const float position = float(positions[size_t(batch / args.batches_per_positions_row) * args.tokens + token]);
  device const float* factors = freq_factors + size_t(batch / args.batches_per_factors_row) * pairs;
  threadgroup float* cos_table = table;
  threadgroup float* sin_table = table + pairs;
  const float sin_scale = args.mscale * args.sin_sign;
  for (uint i = tid; i < pairs; i += threads) {
    float theta = position;
    for (uint k = 0; k < i; ++k) theta *= args.theta_scale;
    const float extrap = args.has_factors ? theta / factors[i] : theta;
    const float interp = extrap * args.freq_scale;
    float angle = interp;
    if (args.has_ramp) {
      // ti*(1-r) + te*r with each product rounded (separate statements: no fused multiply-add).
      const float kept = interp * (1.0f - ramp[i]);
      const float mixed = extrap * ramp[i];
      angle = kept + mixed;
    }
    cos_table[i] = precise::cos(angle) * args.mscale;
    sin_table[i] = precise::sin(angle) * sin_scale;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  const size_t token_base = (size_t(batch) * args.tokens + token) * args.heads * args.dim;
  for (uint e = tid; e < args.heads * pairs; e += threads) {
    const uint head = e / pairs, i = e % pairs;
    const size_t row = token_base + size_t(head) * args.dim;
    // NORMAL rotates (2i, 2i+1), NEOX (i, i + n_dims/2).
    const size_t i0 = row + (args.neox ? i : 2 * i);
    const size_t i1 = row + (args.neox ? i + pairs : 2 * i + 1);
    const float x0 = FloatIO<T>::load(x[i0]), x1 = FloatIO<T>::load(x[i1]);
    const float c = cos_table[i], s = sin_table[i];
    y[i0] = FloatIO<T>::store(x0 * c - x1 * s);
    y[i1] = FloatIO<T>::store(x0 * s + x1 * c);
  }
  const uint rest = args.dim - args.n_dims;
  for (uint e = tid; e < args.heads * rest; e += threads) {
    const size_t at = token_base + size_t(e / rest) * args.dim + args.n_dims + e % rest;
    y[at] = x[at];
  }
}

#define GGML_EXT_INSTANTIATE_ROPE(suffix, T, unused) \
  template [[host_name("rope_" #suffix)]] [[kernel]] void rope<T>(GGML_EXT_ROPE_PARAMS(T));
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_ROPE, 0)
