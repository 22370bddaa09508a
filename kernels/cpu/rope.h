#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// The per-op constants of ggml's rope_ext angle formula (SPEC, rope_ext), computed
// once on the host.
struct RopeAngles {
  float theta_scale;  // powf(freq_base, -2/n_dims): the iterated per-pair factor
  float freq_scale;
  float mscale;       // attn_factor, times YaRN's magnitude correction when ext_factor != 0
  float sin_sign;     // +1, or -1 for the inverse rotation (the vjp)
};

// Rotates x (batches, tokens, heads, dim) into y (may alias x), rows of `dim`
// contiguous elements of `type`; elements [n_dims, dim) are copied. Batch b uses
// positions row b / batches_per_positions_row (rows of `tokens` int32) and
// freq_factors row b / batches_per_factors_row (rows of n_dims/2 floats, or null).
// ramp: null when ext_factor == 0, else the YaRN mix r of each of the n_dims/2
// pairs: angle = ti*(1-r) + te*r. The last `copied_heads` heads of every token are
// copied unrotated (a fused q/k/v row: its v heads; csrc/rope_qkv.h).
struct RopeArgs {
  const void* x;
  void* y;
  FloatType type;
  const int32_t* positions;
  const float* freq_factors;
  const float* ramp;
  int64_t batches;
  int64_t tokens;
  int64_t heads;
  int64_t dim;
  int64_t n_dims;
  int64_t batches_per_positions_row;
  int64_t batches_per_factors_row;
  bool neox;
  RopeAngles angles;
  int64_t copied_heads = 0;
  // With q_norm and k_norm (float32, dim each): every rotated head is first rms-normed over its dim elements and
  // multiplied by the weight, q_norm for heads [0, q_heads) and k_norm for the others (Qwen 3's and Gemma 3's
  // per-head q/k norms).
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  int64_t q_heads = 0;
  float norm_eps = 0.0f;
};

void rope(const RopeArgs& args);

}  // namespace ggml_ext::cpu
