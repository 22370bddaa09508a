// The argument blocks of the Metal kernels, shared by the kernels (MSL) and their host glue
// (csrc/backend/metal, C++): 32-bit fields only, so both sides lay them out alike. Passed with set_bytes
// as `constant ...& [[buffer(i)]]`.
#pragma once
#if !defined(__METAL_VERSION__)
#include <cstdint>
#endif

namespace ggml_ext_metal {

// rows of `dim` elements; row r uses weight row r / rows_per_weight when `weighted`. vec4: dim is a multiple
// of 4 and x, weight and y start on 4-element boundaries (the host knows their addresses): 4-element loads.
struct RmsNormArgs {
  uint32_t dim;
  uint32_t rows_per_weight;
  uint32_t weighted;
  float eps;
  uint32_t vec4;
};

// x (batches, tokens, heads, dim); the angle constants as in kernels/cpu/rope.h (RopeAngles), computed on
// the host for every backend; ramp: the YaRN mix per pair when has_ramp. vec4: 4-element loads and stores
// (launch_plans.h, rope_vec4_shape, and x and y starting on 4-element boundaries, which the host knows).
struct RopeArgs {
  uint32_t tokens, heads, dim, n_dims;
  uint32_t batches_per_positions_row;
  uint32_t batches_per_factors_row;
  uint32_t neox, has_factors, has_ramp;
  float theta_scale, freq_scale, mscale, sin_sign;
  uint32_t vec4;
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

}  // namespace ggml_ext_metal
