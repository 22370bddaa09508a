// Launch plans of the Metal kernels (kernels/metal): from the shapes, the kernel's host name, its argument
// block, the grid and the threadgroup memory. Host C++ only (no MLX, no Metal): csrc/backend/metal builds
// its dispatches from these, and the emulator tests (tests/metal_emu/plan.cpp) dispatch the same plans, so
// what is tested is what eval_gpu encodes, argument bytes included.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/common/ggml_blocks.h"
#include "kernels/metal/params.h"

namespace ggml_ext_metal {

struct Grid {
  uint32_t groups[3];          // threadgroups per grid
  uint32_t threads;            // threads per threadgroup (1-D)
  uint32_t threadgroup_bytes;  // [[threadgroup(0)]], a multiple of 16; 0: none
};

template <typename Args>
struct Plan {
  std::string kernel;
  Args args;
  Grid grid;
};

inline uint32_t ceil_div_u32(uint64_t n, uint64_t d) { return static_cast<uint32_t>((n + d - 1) / d); }
inline uint32_t round_up_16(uint64_t bytes) { return static_cast<uint32_t>((bytes + 15) / 16 * 16); }

// dtype suffixes: "f32", "f16", "bf16"; type names as the kernels spell them: "q4_k", "f32".

// One threadgroup per row, one simdgroup per 128 elements of it (1 to 8); a partial sum per simdgroup.
inline Plan<RmsNormArgs> plan_rms_norm(const std::string& dtype, uint32_t rows, const RmsNormArgs& args) {
  const uint32_t threads = std::clamp<uint32_t>(ceil_div_u32(args.dim, 128) * 32, 32, 256);
  return {"rms_norm_" + dtype, args, {{rows, 1, 1}, threads, 32 * sizeof(float)}};
}

// Whether rope's rows allow 4-element vectors (RopeArgs::vec4, with x and y on 4-element boundaries): rows of
// a multiple of 4 elements; NORMAL: a vector holds 2 pairs (n_dims a multiple of 4); NEOX: a vector of each
// half holds 4 pairs (n_dims a multiple of 8).
inline bool rope_vec4_shape(uint32_t dim, uint32_t n_dims, bool neox) {
  return dim % 4 == 0 && n_dims % (neox ? 8 : 4) == 0;
}

// One threadgroup per (token, batch), holding the cos and sin of the token's n_dims/2 pairs (and with has_norm
// each rotated head's norm scale).
inline Plan<RopeArgs> plan_rope(const std::string& dtype, uint32_t batches, const RopeArgs& args) {
  const uint32_t pairs = args.n_dims / 2;
  const uint32_t threads = std::clamp<uint32_t>(ceil_div_u32(uint64_t(args.heads) * pairs, 32) * 32, 32, 256);
  const uint64_t scales = args.has_norm ? args.heads - args.copied_heads : 0;
  const uint32_t table_bytes = round_up_16((2 * pairs + scales) * sizeof(float));
  return {"rope_" + dtype, args, {{args.tokens, batches, 1}, threads, table_bytes}};
}

// glu: a thread per output element, threadgroups of up to 256 along a row, one grid row per output row;
// kind: "swiglu", "geglu", "geglu_erf" or "swiglu_oai".
inline Plan<GluArgs> plan_glu(const std::string& kind, const std::string& dtype, const GluArgs& args) {
  const uint32_t threads = std::clamp<uint32_t>(ceil_div_u32(args.cols, 32) * 32, 32, 256);
  return {"glu_" + kind + "_" + dtype, args, {{ceil_div_u32(args.cols, threads), args.rows, 1}, threads, 0}};
}

// rows_copy: a thread per element of a (batch, head)'s rows (threadgroups of 256 along them, grid x), one grid row
// per (batch, head); element_bytes 2 or 4.
inline Plan<RowsCopyArgs> plan_rows_copy(uint32_t element_bytes, const RowsCopyArgs& args) {
  const uint64_t per_head = uint64_t(args.rows) * args.dim;
  return {element_bytes == 2 ? "rows_copy_u16" : "rows_copy_u32", args,
          {{ceil_div_u32(per_head, 256), args.batch * args.heads, 1}, 256, 0}};
}

// Quantized types: a thread per run of 16 elements; float types (block_size 1): a thread per element.
inline Plan<DequantizeArgs> plan_dequantize(const std::string& type_name, uint32_t block_size, const std::string& dtype,
                                            uint64_t n_blocks) {
  const uint64_t units = block_size > 1 ? n_blocks * (block_size / 16) : n_blocks;
  DequantizeArgs args{static_cast<uint32_t>(units)};
  return {"dequantize_" + type_name + "_" + dtype, args, {{ceil_div_u32(units, 256), 1, 1}, 256, 0}};
}

// Elements and bytes per block of a type named as the kernels spell it ("q4_k", "f16"); {0, 0} if unknown.
struct BlockShape {
  uint32_t elements, bytes;
};
inline BlockShape block_shape(const std::string& type_name) {
#define GGML_EXT_PLAN_QUANT_SHAPE(NAME, name, id, qk, bytes) \
  if (type_name == #name) return {qk, bytes};
  GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_PLAN_QUANT_SHAPE)
#undef GGML_EXT_PLAN_QUANT_SHAPE
  if (type_name == "f32") return {1, 4};
  if (type_name == "f16" || type_name == "bf16") return {1, 2};
  return {0, 0};
}

inline uint32_t dtype_bytes(const std::string& dtype) { return dtype == "f32" ? 4 : 2; }

// An address modulo 128 (MatmulArgs::w_line, x_line).
inline uint32_t line_offset(const void* p) { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) % 128); }

// Up to kDecodeMaxRows rows of x: qmv_x1 (M = 1), qmv_x4 (2-4), qmv_x8 (5-8), decode.metal: threadgroups
// of 4 simdgroups, each owning `rows` weight rows (4; 2 for float16/bfloat16 weights, 1 for float32), the
// x rows and the weight rows' bytes of a 512-element step staged in threadgroup memory. Otherwise
// (prefill) 64 x 32 output tiles, quantized_matmul.metal (qmm): the x tile (64 x 32 floats), the decoded
// weight tile (32 x 32 floats) and the raw bytes of 32 weight rows for a stage of 256 elements (quantized
// types) or 64 (float types), each row's share padded by up to 15 bytes to keep its device address modulo
// 16 and followed by up to 128 bytes staged ahead (quantized_matmul.metal's PrefillShape). The transposed
// product, any M: 64 x 256 output tiles of 512 threads (qmm_t): the x tile (64 x 32 floats), the decoded
// tile (`rows` x 256 floats) and a slot per row for its bytes under the tile from their first 128-byte
// line (quantized_matmul.metal's TransposedShape; 16 rows, 8 when a slot exceeds 512 bytes).
constexpr uint32_t kDecodeMaxRows = 8;
constexpr uint32_t kDecodeStep = 512;
constexpr uint32_t kPrefillTileM = 64, kPrefillTileN = 32, kPrefillTileK = 32;
constexpr uint32_t kPrefillQuantStage = 256, kPrefillFloatStage = 64;
constexpr uint32_t kTransposedTileM = 64, kTransposedTileCols = 256, kTransposedStageN = 32;
constexpr uint32_t kTransposedThreads = 512, kTransposedSlotMax = 512;
// The decode product (decode_rows.h): x rows per threadgroup for M rows (1, 4 or 8), weight rows per
// threadgroup (4 simdgroups of DecodeShape::rows), threadgroup bytes (decode_stage_bytes).
inline uint32_t decode_x_rows(uint32_t m) { return m <= 1 ? 1 : m <= 4 ? 4 : 8; }
inline uint32_t decode_tile_rows(const BlockShape& b) { return 4 * (b.elements > 1 ? 4 : b.bytes == 4 ? 1 : 2); }
inline uint32_t decode_threadgroup_bytes(const BlockShape& b, uint32_t x_rows, const std::string& x_dtype) {
  const uint32_t span = b.elements ? kDecodeStep / b.elements * b.bytes : 0;
  const uint32_t row_stage = (span + 16 + 128 + 15) / 16 * 16;  // DecodeShape::row_stage
  return round_up_16(x_rows * kDecodeStep * dtype_bytes(x_dtype) + decode_tile_rows(b) * row_stage);
}
inline uint32_t prefill_threadgroup_bytes(const BlockShape& b) {
  const uint32_t stage = b.elements > 1 ? kPrefillQuantStage : kPrefillFloatStage;
  const uint32_t span = b.elements ? stage / b.elements * b.bytes : 0;
  const uint32_t row_stage = (span + 15 + 15) / 16 * 16 + 128;
  return (kPrefillTileM + kPrefillTileN) * kPrefillTileK * sizeof(float) + kPrefillTileN * row_stage;
}
inline uint32_t transposed_threadgroup_bytes(const BlockShape& b) {
  const uint32_t span = b.elements ? kTransposedTileCols / b.elements * b.bytes : 0;
  const uint32_t slot = (span + 127 + 15) / 16 * 16;
  const uint32_t rows = slot <= kTransposedSlotMax ? 16 : 8;
  return (kTransposedTileM * kTransposedStageN + rows * kTransposedTileCols) * sizeof(float) + rows * slot;
}
inline Plan<MatmulArgs> plan_matmul(const std::string& type_name, const std::string& x_dtype, bool transposed,
                                    uint32_t batches, const MatmulArgs& args) {
  const std::string suffix = type_name + "_" + x_dtype;
  const BlockShape b = block_shape(type_name);
  if (transposed) {
    return {"qmm_t_" + suffix, args,
            {{ceil_div_u32(args.K, kTransposedTileCols), ceil_div_u32(args.M, kTransposedTileM), batches},
             kTransposedThreads, transposed_threadgroup_bytes(b)}};
  }
  if (args.M <= kDecodeMaxRows) {
    const uint32_t x_rows = decode_x_rows(args.M);
    return {"qmv_x" + std::to_string(x_rows) + "_" + suffix, args,
            {{ceil_div_u32(args.N, decode_tile_rows(b)), ceil_div_u32(args.M, x_rows), batches}, 128,
             decode_threadgroup_bytes(b, x_rows, x_dtype)}};
  }
  return {"qmm_" + suffix, args,
          {{ceil_div_u32(args.N, kPrefillTileN), ceil_div_u32(args.M, kPrefillTileM), batches}, 128,
           prefill_threadgroup_bytes(b)}};
}

// mul_mat_id. Forward: two dispatches on an int32 scratch buffer (kernels/metal/mul_mat_id_groups.h): the
// pairs grouped by expert (mul_mat_id_group, one threadgroup of 256 threads), then the grouped product
// (mul_mat_id_x<R>, grid: weight-row tiles of the decode product, experts + 1 buckets), R = 1 (one token) or 8
// x rows per chunk of an expert's pairs (an expert gets at most `tokens` pairs from a top-k router).
// Transposed: one dispatch, 128 runs of 16 elements of K per threadgroup (a thread each), a row per pair.
struct MulMatIdPlan {
  Plan<MulMatIdArgs> group;  // kernel "" when there is none (the transposed product)
  Plan<MulMatIdArgs> product;
  uint64_t scratch_bytes;  // offsets, cursors, sorted pairs; 0 without grouping
};
constexpr uint32_t kMulMatIdGroupThreads = 256;
inline uint64_t round_up_4(uint64_t n) { return (n + 3) / 4 * 4; }
inline uint64_t mul_mat_id_scratch_bytes(const MulMatIdArgs& a) {
  return 4 * (round_up_4(uint64_t(a.experts) + 2) + round_up_4(uint64_t(a.experts) + 1) + uint64_t(a.tokens) * a.n_used);
}
inline MulMatIdPlan plan_mul_mat_id(const std::string& type_name, const std::string& dtype, bool transposed,
                                    const MulMatIdArgs& args) {
  const uint32_t pairs = args.tokens * args.n_used;  // the host checks that it fits
  const std::string suffix = type_name + "_" + dtype;
  if (transposed) {
    return {{"", args, {{0, 0, 0}, 0, 0}},
            {"mul_mat_id_t_" + suffix, args, {{ceil_div_u32(ceil_div_u32(args.K, 16), 128), pairs, 1}, 128, 0}},
            0};
  }
  const BlockShape b = block_shape(type_name);
  const uint32_t x_rows = args.tokens <= 1 ? 1 : 8;  // mul_mat_id_x1 / _x8 (no x4: fewer kernels)
  return {{"mul_mat_id_group", args, {{1, 1, 1}, kMulMatIdGroupThreads, 2 * kMulMatIdGroupThreads * 4}},
          {"mul_mat_id_x" + std::to_string(x_rows) + "_" + suffix, args,
           {{ceil_div_u32(args.N, decode_tile_rows(b)), args.experts + 1, 1}, 128,
            decode_threadgroup_bytes(b, x_rows, dtype)}},
          mul_mat_id_scratch_bytes(args)};
}

// attention (kernels/metal/attention.metal): attention_d<128|256|512>_<dtype> by the larger head dim, a
// threadgroup of kAttentionThreads per (key split, query block x head chunk, batch x kv head); when the keys
// are split, attention_combine_<dtype> (a threadgroup per output row) merges the splits' partial results from
// a float32 buffer of partials_bytes. The args' shape fields come from the host; the tiling fields and the
// vector-load flags are set here.
// Kernel "" (no plan): a head dim past kAttentionMaxHeadDim, no kv heads (the op checks both first), or a grid
// past 32-bit counts.
struct AttentionPlan {
  Plan<AttentionArgs> main;
  Plan<AttentionArgs> combine;  // kernel "" with one split
  uint64_t partials_bytes;      // (rows, splits, v_dim + 2) floats; 0 with one split
};
// Threadgroups the key splits aim for: a few per GPU core on the larger M-series parts (a guess: nothing here
// has been timed on a Mac).
constexpr uint32_t kAttentionTargetThreadgroups = 128;
inline uint32_t attention_max_dim(uint32_t head_dim, uint32_t v_dim) {
  const uint32_t d = std::max(head_dim, v_dim);
  return d <= 128 ? 128 : d <= 256 ? 256 : 512;
}
inline uint32_t attention_threadgroup_bytes(uint32_t max_dim, uint32_t head_dim) {
  const uint32_t rows = attention_rows(max_dim);
  const uint32_t dq = ceil_div_u32(head_dim, kAttentionChunk) * kAttentionChunk;  // staged queries' row
  return round_up_16(4ull * (rows * dq + kAttentionKeyTile * (kAttentionChunk + 1) + rows * kAttentionKeyTile));
}
// Whether a k or v view allows 4-element vector loads of its rows: unit element stride, whole vectors per row,
// and every row on a 4-element boundary (line: the view's first byte's address modulo 128, which the host knows).
inline bool attention_vec4(uint32_t line, const int32_t (&strides)[4], uint32_t dim, uint32_t element_bytes) {
  return strides[3] == 1 && dim % 4 == 0 && line % (4 * element_bytes) == 0 && strides[0] % 4 == 0 &&
         strides[1] % 4 == 0 && strides[2] % 4 == 0;
}
inline AttentionPlan plan_attention(const std::string& dtype, AttentionArgs a, uint32_t k_line, uint32_t v_line) {
  AttentionPlan plan{{"", a, {{0, 0, 0}, 0, 0}}, {"", a, {{0, 0, 0}, 0, 0}}, 0};
  if (a.head_dim < 1 || a.v_dim < 1 || a.head_dim > kAttentionMaxHeadDim || a.v_dim > kAttentionMaxHeadDim ||
      a.kv_heads < 1 || a.q_heads % a.kv_heads != 0) {
    return plan;
  }
  const uint32_t max_dim = attention_max_dim(a.head_dim, a.v_dim), rows = attention_rows(max_dim);
  const uint32_t group = a.q_heads / a.kv_heads;
  a.heads_per_group = std::min(group, rows);
  a.queries_per_group = std::max(1u, std::min(a.q_len, rows / a.heads_per_group));
  a.head_chunks = ceil_div_u32(group, a.heads_per_group);
  const uint64_t q_blocks = ceil_div_u32(a.q_len, a.queries_per_group);
  const uint64_t groups = q_blocks * a.head_chunks * uint64_t(a.batch) * a.kv_heads;
  const uint64_t out_rows = uint64_t(a.batch) * a.q_heads * a.q_len;
  if (q_blocks * a.head_chunks > UINT32_MAX || uint64_t(a.batch) * a.kv_heads > UINT32_MAX || out_rows > UINT32_MAX) {
    return plan;
  }
  // Split the keys until about kAttentionTargetThreadgroups exist, each split at least two key tiles (a split's
  // fixed costs: its queries, its partial results).
  const uint64_t tiles = ceil_div_u32(a.kv_len, kAttentionKeyTile);
  uint64_t splits = groups >= kAttentionTargetThreadgroups ? 1 : ceil_div_u32(kAttentionTargetThreadgroups, groups);
  splits = std::max<uint64_t>(1, std::min(splits, tiles / 2));
  const uint64_t tiles_per_split = std::max<uint64_t>(1, ceil_div_u32(tiles, splits));
  a.keys_per_split = static_cast<uint32_t>(tiles_per_split * kAttentionKeyTile);
  a.splits = splits > 1 ? ceil_div_u32(a.kv_len, a.keys_per_split) : 1;
  a.k_vec4 = attention_vec4(k_line, a.k_strides, a.head_dim, dtype_bytes(dtype));
  a.v_vec4 = attention_vec4(v_line, a.v_strides, a.v_dim, dtype_bytes(dtype));
  plan.main = {"attention_d" + std::to_string(max_dim) + "_" + dtype, a,
               {{a.splits, static_cast<uint32_t>(q_blocks * a.head_chunks), a.batch * a.kv_heads}, kAttentionThreads,
                attention_threadgroup_bytes(max_dim, a.head_dim)}};
  if (a.splits > 1) {
    plan.partials_bytes = out_rows * a.splits * (uint64_t(a.v_dim) + 2) * 4;
    const uint32_t threads = std::clamp<uint32_t>(ceil_div_u32(a.v_dim, 32) * 32, 32, 128);
    plan.combine = {"attention_combine_" + dtype, a, {{static_cast<uint32_t>(out_rows), 1, 1}, threads, 0}};
  }
  return plan;
}

}  // namespace ggml_ext_metal
