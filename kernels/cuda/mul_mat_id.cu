// mul_mat_id on the GPU, grouped by expert: each chosen expert's weight rows are read and decoded once per chunk of
// up to 8 of the (token, slot) pairs routed to it, not once per pair. Everything stays on the device (the ids are
// read by the kernels, no host round trip), so the launches record into MLX's CUDA graph like any other.
//
// Forward product, two launches (mul_mat_id_plan) on one workspace:
//   0. group_pairs (mul_mat_id_groups.cuh, block 0): the pairs sorted by expert, per-expert offsets and the list of
//      the experts that have pairs. For quantized weights (every quantized type, K a multiple of 32) the same
//      launch's other blocks quantize x's t * x_slots rows to int8 per 32
//      elements with a float scale (quantize_x_thread of matmul_decode_operands.cuh, the decode route's step 0)
//      into the workspace after the groups: one kernel node where there were two (each costs host time in MLX's
//      CUDA graph).
//   1. grouped_dot_kernel: grid (weight-row tiles, busy_bound): block row y takes the y-th expert that has pairs
//      (at most min(e + 1, t * n_used) of them, so a decode of 8 of 128 experts launches 8 rows of blocks, not 129;
//      the rows past the list's length exit). A warp owns R rows of its expert and walks the expert's pairs in
//      chunks of MB (1, 2, 4 or 8: pairs_per_chunk): the chunk's rows of x are gathered through the sorted
//      pair list (GatheredX), and each x-block group of the warp's weight rows is read and decoded once for all of
//      them (WarpDot of matmul_decode_dp4a.cuh: the decode route's __dp4a products, so the arithmetic is
//      quantized_matmul's on m <= 8 rows). An expert with more pairs than MB reads its rows again for the next
//      chunk, from L2 (the block's rows stay small: R * row_bytes per warp). Rows not on 4-byte boundaries are
//      staged through the warp's shared memory first (kStaged, as quantized_matmul's decode_dot_kernel).
//   Prefill (t * n_used >= 16 e: at least 16 pairs per expert on average, where the dp4a chunks would read each
//   expert's rows twice or more) takes the tensor cores instead, for every weight type but float ones with float32 x:
//   step 0 only groups (group_pairs also counts each busy bucket's tiles of kTilePairs = 64 pairs and their
//   prefix), and step 1 is grouped_tiles_kernel (mul_mat_id_tiles.cuh): quantized_matmul's tensor-core tiles
//   (matmul_tiles.cuh: 128 weight rows x 64 rows of x per block, 64-element steps, WMMA with float32 sums; float32 x
//   rounded to bfloat16 as quantized_matmul's tiles do without precise_x), the tile's rows of x gathered through the
//   sorted pair list and its outputs scattered to each pair's row. Grid (n / 128, a bound of the tiles fixed without
//   the ids: (t * n_used + min(e + 1, t * n_used) * 63) / 64); a block finds its bucket and tile by a binary search
//   of the tile prefix, the blocks past the last tile exit, the bad ids' tiles write NaN. Each expert's rows are
//   decoded once per 64 of its pairs, not once per 8.
//   One pair per chunk (a decode: MB = 1, n_used <= kOneLaunchPairs, a row of x within 48 KB) takes one launch
//   instead, one_launch_dot_kernel (mul_mat_id_one_launch.cuh): each block finds its expert and pairs in the ids
//   itself, quantizes the row of x into its shared memory and takes several row groups of the expert on it; no
//   workspace, one kernel node.
//   Float weights (F32, F16, BF16; any weight the integer dots cannot take):
//   step 0 only groups, and step 1 is grouped_float_kernel, a warp per weight row, each 16-element chunk decoded once
//   per chunk of 8 pairs by the shared chunk decoders of weights.cuh, float32 sums, its blocks mapped as step 1's.
//   The bucket past the experts (e) holds the pairs whose id is outside [0, e): their output rows are NaN and no
//   weight memory is addressed for them (the op raises ValueError at graph-building time for ids already
//   evaluated).
//
// The transposed product (x's gradient): group_pairs_kernel, then grouped_transposed_kernel, a thread per 16
// elements of K of a busy expert, each decoded chunk of the expert's rows used for 4 of its pairs at a time.
#include <cmath>

#include "kernels/cuda/decode_formats_iq.cuh"
#include "kernels/cuda/matmul_decode_dp4a.cuh"
#include "kernels/cuda/mul_mat_id_groups.cuh"
#include "kernels/cuda/mul_mat_id_one_launch.cuh"
#include "kernels/cuda/mul_mat_id_tiles.cuh"
#include "kernels/cuda/weights.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kFloatWarps = 8;  // grouped_float_kernel: warps per block, one weight row each
constexpr int kFloatChunk = 8;  // grouped_float_kernel: pairs per pass over a row
constexpr int kTransposedThreads = 128;  // grouped_transposed_kernel: 16-element chunks of K per block
constexpr int kTransposedPairs = 4;      // grouped_transposed_kernel: pairs per pass over an expert's rows
constexpr int64_t kMaxGridZ = 65535;

// x's quantize step: t * x_slots rows of k as one batch, written after the groups.
__host__ __device__ inline QuantizedMatmulArgs x_quantize_view(const MulMatIdArgs& a) {
  QuantizedMatmulArgs q = expert_view(a);
  q.workspace = a.workspace ? static_cast<uint8_t*>(a.workspace) + groups_bytes(a) : nullptr;
  return q;
}

// The rows of x of up to MB pairs, read from x's quantized rows (the decode kernels' GlobalX, one row per pair).
template <int MB>
struct GatheredX {
  const uint8_t* codes;
  const XRecord* records;
  int64_t k;
  int32_t row[MB];  // of x's t * x_slots rows (32-bit: fewer registers)
  __device__ __forceinline__ decode::XBlock get(int i, int64_t xb) const {
    return load_x(codes + int64_t{row[i]} * k, records + int64_t{row[i]} * (k / 32), xb);
  }
};

// Step 0 of the integer dots: block 0 groups the pairs, blocks 1 .. quantize x (kQuantizeThreads threads each, 8
// per x-block). The blocks do not wait for one another: step 1 reads both results.
static_assert(kGroupThreads == kQuantizeThreads, "one block size for both parts of the launch");
template <typename T>
__global__ void __launch_bounds__(kGroupThreads) group_and_quantize_kernel(MulMatIdArgs a) {
  if (blockIdx.x == 0) return group_pairs(a);
  quantize_x_thread<T, false>(x_quantize_view(a),
                              static_cast<int64_t>(blockIdx.x - 1) * kQuantizeThreads + threadIdx.x);
}

// Step 1 of quantized weights: warp w of block (bx, y) takes rows n0 = (bx * kDotWarps + w) * R .. n0 + R - 1 of busy
// expert y (e) for each chunk of its pairs. Rows on 4-byte boundaries are read straight from global memory; others
// (kStaged: e.g. Q6_K, Q3_K and most IQ types at an odd number of 256-element blocks, such as the 768-element rows
// of qwen3-30b-a3b's down experts) are copied into the warp's shared memory segment by segment first, as
// quantized_matmul's decode_dot_kernel does. They took the float kernel before: Q6_K 2048 x 768, 8 of 128 experts,
// kernel-only on an H200 at base clocks (bench/cuda_mul_mat_id_driver.cu), one token 42.0 -> 28.7 us (the aligned
// types take 12.5-18.7), 8 tokens 221 -> 123.
// With kLanes = 16 (SubWarp) each warp takes two groups of R rows, a half-warp each.
template <class F, int MB, typename T, bool kStaged, int kLanes>
__global__ void __launch_bounds__(kDotWarps * 32) grouped_dot_kernel(MulMatIdArgs a) {
  static_assert(kLanes == 32 || !kStaged, "staged rows: the whole warp stages them");
  constexpr int R = dot_rows_per_warp<MB>();
  using Sub = SubWarp<kLanes>;
  const int lane = threadIdx.x % 32;
  const int64_t warp_n0 = (static_cast<int64_t>(blockIdx.x) * kDotWarps + threadIdx.x / 32) * Sub::kGroups * R;
  if (warp_n0 >= a.n) return;  // the whole warp
  const Sub sub(lane);
  const int64_t n0 = warp_n0 + sub.group * R;
  const PairGroups g(a);
  const int64_t e = g.bucket_of_block(blockIdx.y);
  if (e < 0) return;  // fewer experts have pairs than the grid has rows
  if (e == a.e) return store_nan_rows<T>(a, g, warp_n0, Sub::kGroups * R, lane);
  const int64_t first = g.offsets[e], last = g.offsets[e + 1];
  const QuantizedMatmulArgs xq = x_quantize_view(a);
  QuantizedMatmulArgs view = xq;  // m set per chunk
  // kStaged: the widest word dividing the experts' base address and row length (stage_rows' loads).
  const int width = kStaged ? copy_width(reinterpret_cast<uintptr_t>(a.w), static_cast<uint64_t>(a.row_bytes)) : 0;
  constexpr int kG = lane_group<F, R>(), kUnroll = 4 / kG;  // as decode_direct_kernel: four x-blocks in flight
  const int groups = static_cast<int>(a.k / 32) / kG;
  for (int64_t c = first; c < last; c += MB) {
    view.m = last - c < MB ? last - c : MB;
    GatheredX<MB> x{x_codes(xq, 0), x_records(xq, 0), a.k, {}};
    int32_t pair[MB];
#pragma unroll
    for (int i = 0; i < MB; ++i) {
      pair[i] = g.sorted[i < view.m ? c + i : c];
      x.row[i] = static_cast<int32_t>(x_row_of_pair(a, pair[i]));
    }
    WarpDot<F, MB, R, GatheredX<MB>> dot(view, n0, x, e);
    if constexpr (kStaged) {
      __shared__ uint4 stage_all[kDotWarps][R][Seg<F, R>::kWords];
      add_staged_rows(dot, stage_all[threadIdx.x / 32], width, lane);
    } else {
#pragma unroll kUnroll
      for (int p = sub.lane; p < groups; p += kLanes) dot.template add<kG>(dot.rows, p, int64_t{p} * kG);
    }
    store_pair_sums<T, kLanes>(a, dot, pair, static_cast<int>(view.m), n0, sub.lane);
  }
}

// Step 1 of the other weights: warp w of block (bx, y) takes row n = bx * kFloatWarps + w of busy expert y; its lanes
// take the row's 16-element chunks in turn, each decoded once per kFloatChunk pairs.
template <typename W, typename T>
__global__ void __launch_bounds__(kFloatWarps * 32) grouped_float_kernel(MulMatIdArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kFloatWarps + threadIdx.x / 32;
  if (n >= a.n) return;  // the whole warp
  const PairGroups g(a);
  const int64_t e = g.bucket_of_block(blockIdx.y);
  if (e < 0) return;
  if (e == a.e) return store_nan_rows<T>(a, g, n, 1, lane);
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + (e * a.n + n) * a.row_bytes;
  const bool vector = a.k % 16 == 0 && aligned(a.x, 16);  // every row of x starts on a 16-byte boundary
  const int64_t first = g.offsets[e], last = g.offsets[e + 1], chunks = (a.k + 15) / 16;
  for (int64_t c = first; c < last; c += kFloatChunk) {
    const int m = static_cast<int>(last - c < kFloatChunk ? last - c : kFloatChunk);
    int32_t pair[kFloatChunk];
    const T* xs[kFloatChunk];
    float acc[kFloatChunk] = {};
#pragma unroll
    for (int i = 0; i < kFloatChunk; ++i) {
      pair[i] = g.sorted[i < m ? c + i : c];
      xs[i] = static_cast<const T*>(a.x) + x_row_of_pair(a, pair[i]) * a.k;
    }
    for (int64_t q = lane; q < chunks; q += 32) {
      float w[16];
      W::row_chunk(row, q, a.k, w);  // decoded once for the chunk's m pairs
#pragma unroll
      for (int i = 0; i < kFloatChunk; ++i) {
        if (i >= m) break;
        float v[16], part = 0.0f;  // each 16-element product summed apart: shorter float32 rounding chains
        load_x_chunk(xs[i], q, a.k, vector, v);
#pragma unroll
        for (int j = 0; j < 16; ++j) part += w[j] * v[j];
        acc[i] += part;
      }
    }
#pragma unroll
    for (int i = 0; i < kFloatChunk; ++i) {
      if (i < m) {
        const float sum = warp_sum(acc[i]);
        if (lane == i) static_cast<T*>(a.y)[int64_t{pair[i]} * a.n + n] = from_float<T>(sum);
      }
    }
  }
}

// Transposed (x's gradient), step 1 after group_pairs_kernel: thread i of block (bx, y, z) takes 16-element chunk
// c = bx * kTransposedThreads + i of K for the pairs of busy expert y (e), kTransposedPairs at a time (chunks z,
// z + gridDim.z, .. of the expert's pairs): each row's chunk W[e, n, c] is decoded once per pass for all of them,
// and y[p, c] sums x[p, n] * W[e, n, c] over n in the order of the ungrouped kernel it replaced (a thread per pair
// that decoded the whole expert again for every pair).
template <typename W, typename T>
__global__ void __launch_bounds__(kTransposedThreads) grouped_transposed_kernel(MulMatIdArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTransposedThreads + threadIdx.x;
  if (c * 16 >= a.k) return;
  const PairGroups g(a);
  const int64_t e = g.bucket_of_block(blockIdx.y);
  if (e < 0) return;
  const int64_t first = g.offsets[e], last = g.offsets[e + 1];
  const int valid = static_cast<int>(a.k - c * 16 < 16 ? a.k - c * 16 : 16);
  const bool bad = e == a.e;  // ids outside [0, e): NaN, no weight addressed
  const uint8_t* rows = static_cast<const uint8_t*>(a.w) + (bad ? 0 : e * a.n * a.row_bytes);
  for (int64_t q = first + int64_t{blockIdx.z} * kTransposedPairs; q < last;
       q += int64_t{gridDim.z} * kTransposedPairs) {
    const int m = static_cast<int>(last - q < kTransposedPairs ? last - q : kTransposedPairs);
    int32_t pair[kTransposedPairs];
    const T* xs[kTransposedPairs];
#pragma unroll
    for (int i = 0; i < kTransposedPairs; ++i) {
      pair[i] = g.sorted[i < m ? q + i : q];
      xs[i] = static_cast<const T*>(a.x) + int64_t{pair[i]} * a.n;
    }
    float acc[kTransposedPairs][16];
#pragma unroll
    for (int i = 0; i < kTransposedPairs; ++i)
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[i][j] = bad ? NAN : 0.0f;
    for (int64_t n = 0; n < (bad ? 0 : a.n); ++n) {
      float w[16];
      W::row_chunk(rows + n * a.row_bytes, c, a.k, w);  // once for the pass's m pairs
#pragma unroll
      for (int i = 0; i < kTransposedPairs; ++i) {
        if (i >= m) break;
        const float xn = to_float(xs[i][n]);
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[i][j] += xn * w[j];
      }
    }
    for (int i = 0; i < m; ++i) {
      T* y = static_cast<T*>(a.y) + int64_t{pair[i]} * a.k + c * 16;
      for (int j = 0; j < valid; ++j) y[j] = from_float<T>(acc[i][j]);
    }
  }
}

// make(decode::Fmt<type>{}) for the quantized types (every one has an integer-dot format, the IQ grid and
// ternary ones through decode_formats_iq.cuh); false for the float types.
template <typename Make>
bool with_dot_format(int type, Make&& make) {
#define GGML_EXT_MMID_DOT_FORMAT(NAME, name, id, qk, bytes) \
  if (type == GGML_EXT_TYPE_##NAME) return make(decode::Fmt##NAME{}), true;
  GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_MMID_DOT_FORMAT)
  GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_MMID_DOT_FORMAT)
#undef GGML_EXT_MMID_DOT_FORMAT
  return false;
}

// The dot step with MB pairs per chunk: one launch (one_launch_dot_kernel, no workspace) at one pair per chunk where
// the pairs fit one block and a row of x its shared memory, else step 1 after step 0. Each block of the one-launch
// kernel quantizes its chunk's rows of x itself; at MB = 8 that made it slower than the two launches (H200,
// qwen3-30b-a3b's experts, 8 tokens: 81-103 us per product against 44-50 on an H100 the day before;
// bench/results/h200-2026-11-28-mul-mat-id-vs-llama-cpp-cuda.json), so it is compiled for MB = 1 only.
template <class F, int MB, typename T, int kLanes>
void set_grouped_dot(MulMatIdPlan& p, const MulMatIdArgs& a, bool words) {
  constexpr int kWarpRows = 32 / kLanes * dot_rows_per_warp<MB>();
  const dim3 grid(ceil_div(a.n, kDotWarps * kWarpRows), busy_bound(a)), block(kDotWarps * 32);
  if constexpr (MB == 1) {  // the one-launch kernel is compiled for one pair per chunk only
    const int64_t shared = one_launch_shared_bytes<MB>(a);
    const bool fits = pair_count(a) <= kOneLaunchPairs && shared <= kOneLaunchShared;
    if (fits && words && !tuning_switch("GGML_EXT_MMID_TWO_LAUNCHES")) {
      const int64_t row_groups = grid.x;  // of kDotWarps * kWarpRows rows, as grouped_dot_kernel's blocks take them
      const dim3 one_grid(ceil_div(row_groups, one_launch_groups(row_groups, grid.y)), grid.y);
      p.steps[0] = KernelLaunch{reinterpret_cast<const void*>(&one_launch_dot_kernel<F, MB, T, kLanes>), one_grid,
                                block, static_cast<unsigned>(shared)};
      p.steps[1] = KernelLaunch{};
      p.workspace_bytes = 0;
      return;
    }
  }
  if constexpr (kLanes == 32) {
    const void* dot = words ? reinterpret_cast<const void*>(&grouped_dot_kernel<F, MB, T, false, 32>)
                            : reinterpret_cast<const void*>(&grouped_dot_kernel<F, MB, T, true, 32>);
    p.steps[1] = KernelLaunch{dot, grid, block};
  } else {  // (staged rows take 32 lanes: set_dot_lanes)
    p.steps[1] = KernelLaunch{reinterpret_cast<const void*>(&grouped_dot_kernel<F, MB, T, false, kLanes>), grid, block};
  }
}

// The pairs-per-chunk template with the lanes per group of rows (SubWarp), for rows read straight from memory: 16
// where a row's x-block groups (of the kG the dot takes at a time) would leave more than half of 32 lanes idle, and
// at 2-4 pairs per chunk (a lane's few products leave its loads the time to land: more of them in flight). H200, 8
// of 128 experts, qwen3-30b-a3b's widths (bench/cuda_mul_mat_id_driver.cu, CUDA events, DRAM, us; 32 -> 16 lanes):
// Q4_K 2048 x 768 (12 groups), one token 14.9 -> 11.8, 8 tokens 60.9 -> 35.2; 8 tokens (2 pairs per chunk) Q4_0
// 768 x 2048 27.0 -> 26.2, 2048 x 768 39.2 -> 28.8, Q4_K 768 x 2048 34.3 -> 28.6, Q8_0 36.3 -> 35.3 and 50.9 -> 42.1,
// Q6_K 768 x 2048 45.1 -> 38.9. Every token on the same 8 experts (also 2 pairs per chunk: the rule knows only the
// expected spread) is the exception: rows of 24-32 groups 11-26% faster, of 64 (K = 2048) Q4_0 and Q6_K 1.2-1.3x
// slower (Q8_0 10% faster); random routing, as a top-k router gives, decides. One token (one pair per chunk), rows of
// 24-64 groups: -0.8 .. +3 us, so 32 lanes there. 4 and 8 pairs per chunk were not measured (8 keeps 32 lanes).
template <class F, int MB, typename T>
void set_dot_lanes(MulMatIdPlan& p, const MulMatIdArgs& a, bool words) {
  const int64_t groups = a.k / 32 / lane_group<F, dot_rows_per_warp<MB>()>();
  const bool half_warps = groups < 16 || (MB >= 2 && MB <= 4);
  const int lanes = tuning_int("GGML_EXT_MMID_LANES", half_warps ? 16 : 32);
  if (lanes == 16 && words) {
    set_grouped_dot<F, MB, T, 16>(p, a, words);
  } else {
    set_grouped_dot<F, MB, T, 32>(p, a, words);
  }
}

// The pairs per chunk of the dot kernels (MB, as the decode route's rows of x: 1, 2, 4 or 8): the pairs a busy expert
// takes on average if the router spread the tokens evenly, t * n_used over the expected number of busy experts
// e * (1 - (1 - n_used / e)^t), rounded up, and at most t (a token's slots name distinct experts in every router of
// ggml: top-k). The registers of more pairs than an expert has sit idle; an expert with more takes more chunks,
// its rows read again from L2 (an expert chosen twice by one token likewise). H200, 8 of 128 experts, 8 tokens, ncu
// at base clocks (bench/cuda_mul_mat_id_driver.cu), MB 8 (t, the rule before) / 2: random routing Q4_0 768 x 2048
// 54.1 / 32.6 us, Q4_K 63.6 / 40.5, 2048 x 768 76.8 / 49.0 and 108.4 / 75.2; every token on the same 8 experts (the
// most an expert can take) 27.0 / 25.7, 30.9 / 35.1, 39.9 / 38.1, 55.8 / 56.9 (Q8_0 and Q6_K alike).
inline int pairs_per_chunk(const MulMatIdArgs& a) {
  const double used = static_cast<double>(a.n_used < a.e ? a.n_used : a.e);
  const double busy = static_cast<double>(a.e) * (1.0 - std::pow(1.0 - used / static_cast<double>(a.e),
                                                                  static_cast<double>(a.t)));
  const double average = static_cast<double>(pair_count(a)) / (busy > 1.0 ? busy : 1.0);
  int mb = 1;
  while (mb < 8 && mb < a.t && average > mb * (1.0 + 1e-9)) mb *= 2;
  return tuning_int("GGML_EXT_MMID_MB", mb);
}

// The two steps of the integer dots, where they take the weight; the pairs per chunk from pairs_per_chunk.
template <typename T>
bool set_dot_steps(MulMatIdPlan& p, const MulMatIdArgs& a, int type) {
  if (a.k <= 0 || a.k % 32 != 0) return false;  // no empty grid
  const bool words = a.row_bytes % 4 == 0 && aligned(a.w, 4);  // else the rows are staged (grouped_dot_kernel)
  return with_dot_format(type, [&](auto format) {
    using F = decltype(format);
    KernelLaunch& first = p.steps[0];
    const QuantizedMatmulArgs xq = x_quantize_view(a);
    first.kernel = reinterpret_cast<const void*>(&group_and_quantize_kernel<T>);
    first.grid = dim3(1 + ceil_div(xq.m * (a.k / 32) * 8, kQuantizeThreads));
    first.block = dim3(kGroupThreads);
    p.workspace_bytes += records_offset(xq) + xq.m * (a.k / 32) * static_cast<int64_t>(sizeof(XRecord));
    const int mb = pairs_per_chunk(a);
    if (mb <= 1) {
      set_dot_lanes<F, 1, T>(p, a, words);
    } else if (mb <= 2) {
      set_dot_lanes<F, 2, T>(p, a, words);
    } else if (mb <= 4) {
      set_dot_lanes<F, 4, T>(p, a, words);
    } else {
      set_dot_lanes<F, 8, T>(p, a, words);
    }
  });
}

// Step 0 where it only groups the pairs.
void set_group_step(MulMatIdPlan& p) {
  p.steps[0].kernel = reinterpret_cast<const void*>(&group_pairs_kernel);
  p.steps[0].grid = dim3(1);
  p.steps[0].block = dim3(kGroupThreads);
}

// The tensor cores' type for x of type T: T itself, bfloat16 for float32 (quantized_matmul's tiles without
// precise_x).
template <typename T>
using TensorCoreType = std::conditional_t<std::is_same_v<T, float>, __nv_bfloat16, T>;

template <typename T>
MulMatIdPlan mul_mat_id_plan_typed(const MulMatIdArgs& a, int type, bool transpose) {
  MulMatIdPlan p;
  p.workspace_bytes = groups_bytes(a);
  if (transpose) {
    // Pair chunks per expert along z: a top-k router gives an expert at most t pairs (more take more passes).
    const int64_t chunks = ceil_div(a.t, kTransposedPairs);
    with_weights(type, [&](auto weights) {
      p.steps[1].kernel = reinterpret_cast<const void*>(&grouped_transposed_kernel<decltype(weights), T>);
      p.steps[1].grid = dim3(ceil_div((a.k + 15) / 16, kTransposedThreads), busy_bound(a),
                             static_cast<unsigned>(chunks < kMaxGridZ ? chunks : kMaxGridZ));
      p.steps[1].block = dim3(kTransposedThreads);
      return 0;
    });
    if (!p.steps[1].kernel) return {};
    set_group_step(p);
    return p;
  }
  if (set_tile_step<T, TensorCoreType<T>>(p, a, type)) {
    set_group_step(p);
    return p;
  }
  if (!set_dot_steps<T>(p, a, type)) {
    with_weights(type, [&](auto weights) {
      p.steps[1].kernel = reinterpret_cast<const void*>(&grouped_float_kernel<decltype(weights), T>);
      p.steps[1].grid = dim3(ceil_div(a.n, kFloatWarps), busy_bound(a));
      p.steps[1].block = dim3(kFloatWarps * 32);
      return 0;
    });
    if (!p.steps[1].kernel) return {};
    set_group_step(p);
  }
  return p;
}

}  // namespace

MulMatIdPlan mul_mat_id_plan(const MulMatIdArgs& args, int ggml_type, FloatType x_type, bool transpose) {
#if defined(GGML_EXT_TUNING)  // float32 x only (bench/cuda_mul_mat_id_driver.cu's), so that variant builds stay quick
  if (x_type == FloatType::f32) return mul_mat_id_plan_typed<float>(args, ggml_type, transpose);
#else
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType,
                             return mul_mat_id_plan_typed<typename Storage<kType>::type>(args, ggml_type, transpose));
#endif
  return {};
}

// Whether mul_mat_id_plan takes the grouped tensor-core tiles (for the tests: tests/cuda_emulation).
bool mul_mat_id_takes_tiles(const MulMatIdArgs& args, int ggml_type, FloatType x_type, bool transpose) {
  MulMatIdPlan p;
#if defined(GGML_EXT_TUNING)
  if (x_type == FloatType::f32) return !transpose && set_tile_step<float, TensorCoreType<float>>(p, args, ggml_type);
#else
  GGML_EXT_CUDA_FLOAT_SWITCH(
      x_type, kType, using T = typename Storage<kType>::type;
      return !transpose && set_tile_step<T, TensorCoreType<T>>(p, args, ggml_type));
#endif
  return false;
}

}  // namespace ggml_ext::cuda
