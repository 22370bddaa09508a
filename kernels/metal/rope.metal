// rope: ggml's rope_ext on x (batches, tokens, heads, dim), NORMAL or NEOX, partial rotation, YaRN,
// freq_factors (csrc/rope.h; the formula in SPEC.md). The per-op constants (theta_scale, mscale, the
// YaRN mix of each pair) come from the host, computed there once for every backend. rope_qkv's extras
// (csrc/rope_qkv.h; RopeArgs in params.h): the last copied_heads heads of a token copied unrotated, and per-head
// rms norms of the rotated heads before the rotation.
#include "kernels/metal/common.h"

// One threadgroup per (token, batch): its threads first compute the cos/sin table of the token's
// n_dims/2 pairs into threadgroup memory (pair i: the iterated product pos * theta_scale^i, i float
// multiplications as ggml does, not a pow), then rotate every head with it and copy dims n_dims.. dim.
// With args.vec4 (the host's word: rows of a multiple of 4, n_dims of 4 (NORMAL) or 8 (NEOX), x and y on
// 4-element boundaries) a thread takes 4-element vectors (float4, half4, ushort4 for bfloat16), adjacent
// threads adjacent vectors: NORMAL, one vector of 2 pairs; NEOX, a vector from each half, 4 pairs. Each
// element is computed as in the element-wise path (the same statements, the same roundings). With has_norm
// (never with vec4: the host's choice) a simdgroup per rotated head first sums its squares into a scale kept
// after the table.
#define GGML_EXT_ROPE_PARAMS(T)                                                                        \
  device const T *x [[buffer(0)]], device T *y [[buffer(1)]], device const int *positions [[buffer(2)]], \
      device const float *freq_factors [[buffer(3)]], device const float *ramp [[buffer(4)]],             \
      constant RopeArgs &args [[buffer(5)]], device const float *q_norm [[buffer(6)]],                     \
      device const float *k_norm [[buffer(7)]], threadgroup float *table [[threadgroup(0)]],               \
      uint2 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],              \
      uint threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],                   \
      uint simd_group [[simdgroup_index_in_threadgroup]], uint simd_groups [[simdgroups_per_threadgroup]]

// One pair rotated: (x0, x1) -> (x0 c - x1 s, x0 s + x1 c).
inline float2 rotated(float x0, float x1, float c, float s) {
  float2 r;
  r.x = x0 * c - x1 * s;
  r.y = x0 * s + x1 * c;
  return r;
}

// The rotated heads of one token by 4-element vectors (args.vec4), then their copied dims n_dims.. dim and the
// copied heads.
template <typename T>
inline void rope_vec4(device const T* x, device T* y, constant RopeArgs& args, threadgroup const float* cos_table,
                      threadgroup const float* sin_table, size_t token_base, uint tid, uint threads) {
  typedef typename Vec4<T>::type V;
  const uint pairs = args.n_dims / 2;
  const uint rotated_heads = args.heads - args.copied_heads;
  const uint per_head = args.neox ? pairs / 4 : pairs / 2;  // vectors (NEOX: vector pairs) per head
  for (uint e = tid; e < rotated_heads * per_head; e += threads) {
    const uint head = e / per_head, j = e % per_head;
    const size_t row = token_base + size_t(head) * args.dim;
    if (args.neox) {  // elements 4j.. 4j+3 of each half: pairs 4j.. 4j+3
      device const V* lo = (device const V*)(x + row + 4 * j);
      device const V* hi = (device const V*)(x + row + pairs + 4 * j);
      V a = *lo, b = *hi;
      for (int q = 0; q < 4; ++q) {
        const float2 r = rotated(FloatIO<T>::load(a[q]), FloatIO<T>::load(b[q]), cos_table[4 * j + q],
                                 sin_table[4 * j + q]);
        a[q] = FloatIO<T>::store(r.x);
        b[q] = FloatIO<T>::store(r.y);
      }
      *(device V*)(y + row + 4 * j) = a;
      *(device V*)(y + row + pairs + 4 * j) = b;
    } else {  // elements 4j.. 4j+3: pairs 2j and 2j + 1
      V a = *(device const V*)(x + row + 4 * j);
      for (int q = 0; q < 2; ++q) {
        const float2 r = rotated(FloatIO<T>::load(a[2 * q]), FloatIO<T>::load(a[2 * q + 1]), cos_table[2 * j + q],
                                 sin_table[2 * j + q]);
        a[2 * q] = FloatIO<T>::store(r.x);
        a[2 * q + 1] = FloatIO<T>::store(r.y);
      }
      *(device V*)(y + row + 4 * j) = a;
    }
  }
  const uint rest = (args.dim - args.n_dims) / 4;  // vectors per head
  for (uint e = tid; e < rotated_heads * rest; e += threads) {
    const size_t at = token_base + size_t(e / rest) * args.dim + args.n_dims + 4 * (e % rest);
    *(device V*)(y + at) = *(device const V*)(x + at);
  }
  const uint row = args.dim / 4;
  for (uint e = rotated_heads * row + tid; e < args.heads * row; e += threads) {
    *(device V*)(y + token_base + 4 * size_t(e)) = *(device const V*)(x + token_base + 4 * size_t(e));
  }
}

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
  const size_t token_base = (size_t(batch) * args.tokens + token) * args.heads * args.dim;
  const uint rotated_heads = args.heads - args.copied_heads;
  threadgroup float* head_scale = table + 2 * pairs;  // with has_norm: 1 / rms of each rotated head
  if (args.has_norm) {
    for (uint h = simd_group; h < rotated_heads; h += simd_groups) {
      float sum = 0.0f;
      for (uint k = lane; k < args.dim; k += 32) {
        const float v = FloatIO<T>::load(x[token_base + size_t(h) * args.dim + k]);
        sum += v * v;
      }
      sum = simd_sum(sum);
      if (lane == 0) head_scale[h] = 1.0f / precise::sqrt(sum / float(args.dim) + args.norm_eps);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  if (args.vec4) {
    rope_vec4(x, y, args, cos_table, sin_table, token_base, tid, threads);
    return;
  }
  for (uint e = tid; e < rotated_heads * pairs; e += threads) {
    const uint head = e / pairs, i = e % pairs;
    const size_t row = token_base + size_t(head) * args.dim;
    // NORMAL rotates (2i, 2i+1), NEOX (i, i + n_dims/2).
    const uint k0 = args.neox ? i : 2 * i, k1 = args.neox ? i + pairs : 2 * i + 1;
    float x0 = FloatIO<T>::load(x[row + k0]), x1 = FloatIO<T>::load(x[row + k1]);
    if (args.has_norm) {
      device const float* w = head < args.q_heads ? q_norm : k_norm;
      x0 = x0 * head_scale[head] * w[k0];
      x1 = x1 * head_scale[head] * w[k1];
    }
    const float2 r = rotated(x0, x1, cos_table[i], sin_table[i]);
    y[row + k0] = FloatIO<T>::store(r.x);
    y[row + k1] = FloatIO<T>::store(r.y);
  }
  const uint rest = args.dim - args.n_dims;
  for (uint e = tid; e < rotated_heads * rest; e += threads) {
    const uint head = e / rest, k = args.n_dims + e % rest;
    const size_t at = token_base + size_t(head) * args.dim + k;
    if (args.has_norm) {
      device const float* w = head < args.q_heads ? q_norm : k_norm;
      y[at] = FloatIO<T>::store(FloatIO<T>::load(x[at]) * head_scale[head] * w[k]);
    } else {
      y[at] = x[at];
    }
  }
  for (uint e = rotated_heads * args.dim + tid; e < args.heads * args.dim; e += threads) {
    y[token_base + e] = x[token_base + e];  // the copied heads
  }
}

#define GGML_EXT_INSTANTIATE_ROPE(suffix, T, unused) \
  template [[host_name("rope_" #suffix)]] [[kernel]] void rope<T>(GGML_EXT_ROPE_PARAMS(T));
GGML_EXT_FOR_EACH_DTYPE(GGML_EXT_INSTANTIATE_ROPE, 0)
