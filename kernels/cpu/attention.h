#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// ggml's flash_attn_ext on (B, H, T, D) arrays: for each batch b, query head h and query i,
//   s_j = scale * q . k_j, then s_j = softcap * tanh(s_j / softcap) when softcap > 0, plus mask[b, h, i, j],
//   and -inf for j > i + (kv_len - q_len) when causal;
//   y = sum_j softmax(s)_j v_j (zeros when every s_j is -inf).
// With sinks, head h's logit sinks[h] joins each row's softmax denominator only (ggml's attention sinks):
//   y = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sinks[h] - m)), m the max of the s_j and sinks[h].
// Query head h reads kv head h / (q_heads / kv_heads). q, k, v and y share `type`; float32 math.
// q, k and v rows (the last axis) are contiguous; their batch, head and token axes step by the given strides
// (elements), so a KV cache's slice of a larger buffer is read in place. y is row-major.
struct AttentionArgs {
  const void* q;        // (batch, q_heads, q_len, head_dim)
  const void* k;        // (batch, kv_heads, kv_len, head_dim)
  const void* v;        // (batch, kv_heads, kv_len, v_dim)
  void* y;              // (batch, q_heads, q_len, v_dim)
  int64_t q_strides[3];  // batch, head, token
  int64_t k_strides[3];
  int64_t v_strides[3];
  const float* mask;    // additive, element [b, h, i, j] at b*s0 + h*s1 + i*s2 + j*s3 (0 strides broadcast), or null
  int64_t mask_strides[4];
  const float* sinks;   // per query head (element [b, h] at b * sinks_batch_stride + h), or null
  int64_t sinks_batch_stride;
  FloatType type;
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t q_len;
  int64_t kv_len;
  int64_t head_dim;
  int64_t v_dim;
  float scale;
  float softcap;  // 0: none
  bool causal;
};

void attention(const AttentionArgs& args);

}  // namespace ggml_ext::cpu
