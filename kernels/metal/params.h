// The argument blocks of the Metal kernels, shared by the kernels (MSL) and their host glue
// (csrc/backend/metal, C++): 32-bit fields only, so both sides lay them out alike. Passed with set_bytes
// as `constant ...& [[buffer(i)]]`.
#pragma once
#if !defined(__METAL_VERSION__)
#include <cstdint>
#endif

namespace ggml_ext_metal {

// rows of `dim` elements; row r uses weight row r / rows_per_weight when `weighted`. vec4: dim is a multiple
// of 4 and x, weight and y (and residual and sum) start on 4-element boundaries (the host knows their
// addresses): 4-element loads. residual: the fused residual add (add_rms_norm): sum = x + residual, rounded to
// the dtype, is written and normed in x's place.
struct RmsNormArgs {
  uint32_t dim;
  uint32_t rows_per_weight;
  uint32_t weighted;
  float eps;
  uint32_t vec4;
  uint32_t residual;
};

// x (batches, tokens, heads, dim); the angle constants as in kernels/cpu/rope.h (RopeAngles), computed on
// the host for every backend; ramp: the YaRN mix per pair when has_ramp. vec4: 4-element loads and stores
// (launch_plans.h, rope_vec4_shape, and x and y starting on 4-element boundaries, which the host knows).
// rope_qkv (csrc/rope_qkv.h): the last copied_heads heads of each token copied unrotated (a fused row's v heads);
// with has_norm every rotated head is first rms-normed over its dim elements (norm_eps) and multiplied by q_norm
// (heads < q_heads) or k_norm, float32 (dim) each (Qwen 3's and Gemma 3's per-head norms).
struct RopeArgs {
  uint32_t tokens, heads, dim, n_dims;
  uint32_t batches_per_positions_row;
  uint32_t batches_per_factors_row;
  uint32_t neox, has_factors, has_ramp;
  float theta_scale, freq_scale, mscale, sin_sign;
  uint32_t vec4;
  uint32_t copied_heads, has_norm, q_heads;
  float norm_eps;
};

// rows of `cols` outputs; gate row r at r * in_stride, up `up_offset` elements further in its buffer (the same
// buffer in ggml's fused layout). alpha, limit: swiglu_oai's constants.
struct GluArgs {
  uint32_t rows, cols, in_stride, up_offset;
  float alpha, limit;
};

// `units` runs of 16 output elements (quantized types) or single elements (float types).
struct DequantizeArgs {
  uint32_t units;
};

// The QuantizedMatmul primitive (csrc/quantized_matmul.h): x (B3, B2, M, Kx), w (A3, A2, N, row_bytes) of
// K elements per row. Forward: out (B3, B2, M, N) = x W^T (Kx = K); transposed: out (B3, B2, M, K) = x W
// (Kx = N). Batch z = b3 * B2 + b2 of x uses w's batch (b3 / r3) * A2 + b2 / r2. out_type: the output's
// dtype (kMatmulOutF32/F16/BF16), chosen at run time since only the final stores depend on it.
// w_line, x_line: the weight's and x's first byte's address modulo 128 (the host knows the arrays'
// offsets): where the 128-byte memory lines start, and so the decode kernels' widest aligned loads.
enum { kMatmulOutF32 = 0, kMatmulOutF16 = 1, kMatmulOutBF16 = 2 };
struct MatmulArgs {
  uint32_t M, N, K;
  uint32_t row_bytes;
  uint32_t B2, A2, r2, r3;
  uint32_t out_type;
  uint32_t w_line, x_line;
};

// The MulMatId primitive (csrc/mul_mat_id.h): ids (tokens, n_used) int32 choose, per (token, slot) pair p,
// one of `experts` weight matrices (experts, N, row_bytes) of K elements per row. Forward: x (tokens,
// x_slots, K) with x_slots 1 or n_used, out (tokens, n_used, N); transposed: x (tokens, n_used, N), out
// (tokens, n_used, K). x and out share a dtype (the kernels' suffix). w_line, x_line: as MatmulArgs'.
struct MulMatIdArgs {
  uint32_t tokens, n_used, x_slots, experts;
  uint32_t N, K, row_bytes;
  uint32_t w_line, x_line;
};

// The Attention primitive (csrc/attention.h; kernels/metal/attention.metal): q (batch, q_heads, q_len,
// head_dim), k (batch, kv_heads, kv_len, head_dim), v (batch, kv_heads, kv_len, v_dim), each read through its
// element strides (batch, head, token, element; signed: any view MLX makes); y (batch, q_heads, q_len, v_dim)
// row-major. mask: additive float32 with element strides (0 on a broadcast axis), when has_mask; sinks: one
// float32 logit per (batch, query head) at b * sinks_batch_stride + h, when has_sinks. softcap 0: none.
// The tiling (launch_plans.h, plan_attention): a threadgroup takes heads_per_group query heads of one kv
// head's group times queries_per_group positions, over keys_per_split keys; splits > 1: per-split partial
// results, then attention_combine.
enum {
  kAttentionThreads = 128,      // 4 simdgroups
  kAttentionKeyTile = 32,       // keys per step: a lane per key in the scores
  kAttentionChunk = 64,         // head-dim elements of k (or columns of v) staged at a time
  kAttentionMaxHeadDim = 512,   // head_dim and v_dim
};
struct AttentionArgs {
  uint32_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_dim;
  int32_t q_strides[4], k_strides[4], v_strides[4];
  uint32_t mask_strides[4];
  uint32_t has_mask, has_sinks, sinks_batch_stride;
  float scale, softcap;
  uint32_t causal;
  uint32_t heads_per_group, queries_per_group, head_chunks, splits, keys_per_split;
  uint32_t k_vec4, v_vec4;  // 4-element loads of k / v rows (launch_plans.h's attention_vec4)
};
// Rows (query head x position) per threadgroup for the kernel of head dims up to max_dim (128, 256 or 512):
// the queries stay in threadgroup memory as floats (rows x max_dim x 4 bytes: 16 KiB at most).
constexpr uint32_t attention_rows(uint32_t max_dim) { return max_dim <= 256 ? 16 : 8; }

// The KVCacheAppend primitive's copies (csrc/kv_cache.h; kernels/common/rows_copy.h has the CPU and CUDA form):
// src (batch, heads, rows, dim) read through its element strides, written into rows row0.. of the row-major
// (batch, heads, dst_rows, dim) dst, as 16- or 32-bit words (the kernel's suffix: the copy converts nothing).
struct RowsCopyArgs {
  uint32_t batch, heads, rows, dim;
  int32_t strides[4];
  uint32_t dst_rows, row0;
};

}  // namespace ggml_ext_metal
