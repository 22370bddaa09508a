// The CUDA kernels' host-side interface: argument structs and, per op, the kernel to launch with its
// grid. Pure C++ plus the CUDA runtime's types (no MLX here): the .cu files implement it and the eval_gpu
// glue in csrc/backend/cuda launches what it returns through MLX's command encoder.
//
// Every kernel takes exactly one parameter, its argument struct, by value.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/rows_copy.h"
#include "kernels/cpu/types.h"

namespace ggml_ext::cuda {

using FloatType = ggml_ext::cpu::FloatType;

// A kernel symbol (the address of a __global__ function in this library) and how to launch it.
struct KernelLaunch {
  const void* kernel = nullptr;
  dim3 grid;
  dim3 block;
  unsigned shared_bytes = 0;
};

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight[r / rows_per_weight]; x, weight and y share `type`.
struct RmsNormArgs {
  const void* x;
  const void* weight;  // null: no weight
  void* y;
  int64_t rows;
  int64_t dim;
  int64_t rows_per_weight;
  float eps;
  // The fused residual add (ggml_ext::cpu::RmsNormArgs has the meaning): sum = x + residual rounded to T, written,
  // and y the norm of it. Null: plain rms_norm.
  const void* residual = nullptr;
  void* sum = nullptr;
};
KernelLaunch rms_norm_launch(const RmsNormArgs& args, FloatType type);

// y[r, c] = act(gate[r * in_stride + c]) * up[r * in_stride + c], y rows of `cols`; the same meaning as
// ggml_ext::cpu::GluArgs. kind: 0 swiglu, 1 geglu (tanh GELU), 2 geglu_erf, 3 swiglu_oai (alpha, limit).
struct GluArgs {
  const void* gate;
  const void* up;
  void* y;
  int64_t rows;
  int64_t cols;
  int64_t in_stride;
  float alpha, limit;
};
// kernel == nullptr for an unknown kind.
KernelLaunch glu_launch(const GluArgs& args, FloatType type, int kind);

// ggml's rope_ext on x (batches, tokens, heads, dim); the same meaning as ggml_ext::cpu::RopeArgs.
struct RopeArgs {
  const void* x;
  void* y;
  const int32_t* positions;    // rows of `tokens`
  const float* freq_factors;   // rows of n_dims/2, or null
  const float* ramp;           // n_dims/2 YaRN mixes (device memory), or null
  int64_t batches;
  int64_t tokens;
  int64_t heads;
  int64_t dim;
  int64_t n_dims;
  int64_t batches_per_positions_row;
  int64_t batches_per_factors_row;
  float theta_scale;
  float freq_scale;
  float mscale;
  float sin_sign;
  int64_t copied_heads = 0;  // the last heads of each token, copied unrotated (csrc/rope_qkv.h)
  // Optional per-head rms norms before the rotation, as ggml_ext::cpu::RopeArgs's (device pointers).
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  int64_t q_heads = 0;
  float norm_eps = 0.0f;
};
KernelLaunch rope_launch(const RopeArgs& args, FloatType type, bool neox);

// Raw ggml blocks (any type of kernels/common/ggml_blocks.h) to floats of `out_type`.
struct DequantizeArgs {
  const void* blocks;
  void* y;
  int64_t n_blocks;  // blocks of the type (elements, for F32/F16/BF16)
};
// kernel == nullptr for a type id the kernels do not know.
KernelLaunch dequantize_launch(const DequantizeArgs& args, int ggml_type, FloatType out_type);

// The product of x with a weight of ggml blocks (csrc/quantized_matmul.h): per batch z of x (z = b3 * B2 + b2),
// the weight batch (b3 / ratio3) * A2 + b2 / ratio2, N rows of row_bytes bytes holding K elements each.
//   forward:    x (M, K) -> y (M, N), y[m, n] = sum_k x[m, k] * W[n, k]
//   transposed: x (M, N) -> y (M, K), y[m, k] = sum_n x[m, n] * W[n, k]
// x has `x_type`; y has x's type, or float32 when out_f32.
struct QuantizedMatmulArgs {
  const void* x;
  const void* w;
  void* y;
  void* workspace;  // QuantizedMatmulPlan::workspace_bytes of device scratch (set by the caller), or null
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t row_bytes;
  int64_t batches;  // B3 * B2
  int64_t b2;
  int64_t a2;
  int64_t ratio2;
  int64_t ratio3;
  bool out_f32;
};
// What to run for one product: the steps in order on one stream, each with the same argument struct, after
// the caller has pointed args.workspace at workspace_bytes of device memory (e.g. x quantized by step 0 for
// the dot products of step 1). steps[0].kernel == nullptr for a type id the kernels do not know.
struct QuantizedMatmulPlan {
  static constexpr int kMaxSteps = 2;
  KernelLaunch steps[kMaxSteps];
  int64_t workspace_bytes = 0;
};
// float_x: x stays float (the tiles), never quantized to int8 (the decode route) nor rounded to bfloat16 (float32 x
// on the tensor-core tiles).
QuantizedMatmulPlan quantized_matmul_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type,
                                          bool transpose, bool float_x = false);

// ggml's mul_mat_id (csrc/mul_mat_id.h): pair p = token * n_used + slot uses expert ids[p] of `e` matrices of n rows
// of row_bytes bytes holding k elements each.
//   forward:    x (t, x_slots, k) -> y (t, n_used, n), y[p] = W[ids[p]] @ x[token, x_slots == 1 ? 0 : slot]
//   transposed: x (t, n_used, n) -> y (t, n_used, k), y[p] = x[p] @ W[ids[p]]
// y has x's type. An id outside [0, e) gives its pair a row of NaN (nothing outside the experts is read).
struct MulMatIdArgs {
  const void* x;
  const void* w;
  const int32_t* ids;
  void* y;
  void* workspace;  // MulMatIdPlan::workspace_bytes of device scratch (set by the caller), or null
  int64_t t;
  int64_t n_used;
  int64_t x_slots;
  int64_t e;
  int64_t n;
  int64_t k;
  int64_t row_bytes;
};
// What to run, in order on one stream, each step with args, after the caller has pointed args.workspace at
// workspace_bytes of device memory: the forward product groups the pairs by expert on the device (step 0, which
// may also quantize x), then multiplies each expert's group (step 1); the transposed product is one step.
// steps[0].kernel == nullptr for a type id the kernels do not know.
struct MulMatIdPlan {
  static constexpr int kMaxSteps = 2;
  KernelLaunch steps[kMaxSteps];
  int64_t workspace_bytes = 0;
};
MulMatIdPlan mul_mat_id_plan(const MulMatIdArgs& args, int ggml_type, FloatType x_type, bool transpose);

// ggml's flash_attn_ext (the same meaning as ggml_ext::cpu::AttentionArgs, sinks included) on
// q (batch, q_heads, q_len, head_dim), k (batch, kv_heads, kv_len, head_dim), v (batch, kv_heads, kv_len, v_dim),
// each read through its four strides (elements: batch, head, token, element); y (batch, q_heads, q_len, v_dim)
// row-major. head_dim and v_dim at most kAttentionMaxHeadDim.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* y;
  const float* mask;   // additive, element [b, h, i, j] at the dot product with mask_strides (0: broadcast), or null
  const float* sinks;  // per query head, element [b, h] at b * sinks_batch_stride + h, or null
  void* workspace;     // AttentionPlan::workspace_bytes of device scratch (set by the caller), or null
  int64_t q_strides[4];
  int64_t k_strides[4];
  int64_t v_strides[4];
  int64_t mask_strides[4];
  int64_t sinks_batch_stride;
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_dim;  // the extents named above
  float scale, softcap;  // softcap 0: none
  bool causal;
  // How the work is cut, written by attention_plan (the kernels read it).
  struct Tiling {
    int heads_per_block;    // query heads of one kv head's group per block
    int queries_per_block;  // query positions per block
    int head_chunks;        // ceil(group / heads_per_block)
    int key_tile;           // keys per step (32, 64 or 128)
    int splits;             // key ranges per (batch, kv head, rows); > 1: partial results, then a combine
    int64_t keys_per_split;
    bool k_vectors, v_vectors;  // 4-element vector loads of k / v rows allowed (unit element stride, aligned)
  } tiling;
};
constexpr int kAttentionMaxHeadDim = 512;
// What to run, in order on one stream, each step with args, after the caller has pointed args.workspace at
// workspace_bytes of device memory: the attention (step 0), and when the keys are split, the combine of the
// splits' partial results (step 1). Fills args.tiling.
struct AttentionPlan {
  static constexpr int kMaxSteps = 2;
  KernelLaunch steps[kMaxSteps];
  int64_t workspace_bytes = 0;
};
AttentionPlan attention_plan(AttentionArgs& args, FloatType type);

// A key/value cache's rows written (kernels/common/rows_copy.h), copy[i] by the blocks of grid.y == i;
// kernel == nullptr for an element size other than 2 or 4 bytes.
KernelLaunch rows_copy_launch(const ggml_ext::RowsCopies& args);

}  // namespace ggml_ext::cuda
