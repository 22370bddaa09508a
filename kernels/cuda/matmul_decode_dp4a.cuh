// Step 1 on __dp4a integer dot products (matmul_decode_plans.cuh has the design): a warp owns R weight rows, read
// straight from global memory (decode_direct_kernel) or staged in shared memory by segments (decode_dot_kernel);
// WarpDot, the products of x-blocks with the rows, is shared with the fused kernel (matmul_decode_fused.cuh).
#pragma once
#include <type_traits>

#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ step 1

// Rows per warp (R) and warps per block by the rows of x the kernel is built for (MB): more weight rows per
// lane share each load of x's codes as m grows. A segment is 32 * L x-blocks of each of the R rows (L = 4 for one
// row, 2 for several: 2-4 KB per row and warp, all loads in flight together).
template <int MB>
constexpr int rows_per_warp() { return MB <= 1 ? 1 : MB <= 4 ? 2 : 4; }
template <int MB>
constexpr int warps_per_block() { return rows_per_warp<MB>() >= 4 ? 2 : 4; }
// The direct kernel from 2 rows of x on: the 4 warps of a block share their R rows, warp w taking every 4th
// group of 32 x-blocks from group w (4x the warps of one row per warp: with R rows per warp the grid of a
// 4096-row weight had too few warps to keep its loads in flight), their sums met through shared memory.
template <int MB>
constexpr int direct_split() { return MB <= 1 ? 1 : 4; }
// Rows per warp of the direct kernel: as the staged kernel's, but 4 from 3 rows of x on. H100 m=4, 14336x4096 /
// 4096x14336, 4 rows against 2: Q4_0 30.3 / 30.0 us (36.1 / 34.0), Q4_K 36.6 / 34.0 (47.9 / 37.8), Q8_0 36.6 / 42.4
// (37.9 / 45.3); Q6_K 52.3 / 43.6 (44.4 / 40.3), so the formats with per-16 scales (Q2_K, Q3_K, Q6_K: two more
// registers of scales per row) keep 2. At m=8, 2 rows were slower than 4 for every format (up to 1.4x).
template <class F, int MB>
constexpr int direct_rows() { return MB == 4 && !F::kPerHalf ? 4 : rows_per_warp<MB>(); }
// Warps of a direct kernel's block: the kSplit warps sharing their rows, or (unsplit) one row group per warp.
template <int MB, int kSplit = direct_split<MB>()>
constexpr int direct_warps() { return kSplit > 1 ? kSplit : warps_per_block<MB>(); }
// One row of x on a weight of few rows (n <= kFewRows: 4096 rows fill an H100's 132 SMs with under 8 blocks of
// 4 warps each): 2 warps share 2 rows and split their x-blocks. H100 4096x14336 m=1 Q4_0 / Q4_K / Q6_K / Q8_0
// 21.1-21.8 / 29.7-32.1 / 28.4-28.8 / 29.9-30.0 us in two runs (22.1-22.7 / 30.5-31.9 / 29.4-30.5 / 33.0-33.1
// with a row per warp); on 14336x4096 no faster (Q6_K 30.6 us, 27.8 otherwise), so only below the threshold.
// Q4_K: 4 warps share 4 rows (few_rows_direct). H100 4096x14336 m=1, ncu through MLX, one run of a tuning build with
// every shape (bench/results/h100-2026-11-26e-direct-shapes.json; kR rows x kSplit warps): Q4_K 2x2 21.9 / 22.0
// us (twice), 1x4 24.5, 2x4 20.1, 4x2 19.5, 4x4 18.8; for the others 4x4 was no faster (Q4_0 22.4 against 20.6,
// Q8_0 30.1 / 29.2, Q6_K 30.3 / 28.1, IQ4_XS 26.7 / 22.1; Q5_K 25.8 / 26.6 and Q3_K 1x4 27.1 / 28.1 within the
// spread of repeated cases).
constexpr int64_t kFewRows = 8192;
template <class F>
constexpr int few_rows_direct() {  // rows per row group = warps sharing them, for one row of x on few rows
  return std::is_same_v<F, decode::FmtQ4_K> ? 4 : 2;
}

// x-blocks a lane of the direct kernel takes at a time: the format's group (decode_formats.cuh: the x-blocks
// that share bytes, read once) where its R rows' decoded groups fit in registers, else 1. H100 Q4_K in pairs,
// 14336x4096 / 4096x14336: m=1 23.3 / 21.9 us, m=8 64.6 / 49.2 (28.2 / 29.7 and 64.9 / 72.7 a sub-block at a
// time). Q6_K in halves (4 sub-blocks sharing 96 bytes) was slower, m=1 35.7 / 32.3 us (28.0 / 28.8), m=4 up to
// 2x (62-159 registers): it has no group.
template <class F, int R>
constexpr int lane_group() { return R * decode::group_of<F>() <= 8 ? decode::group_of<F>() : 1; }

template <class F, int R>
struct Seg {
  static constexpr int kLaneXBlocks = R == 1 ? 4 : 2;  // x-blocks per lane and segment
  static constexpr int kXBlocks = 32 * kLaneXBlocks;
  // Bytes of a full segment (whole blocks; a multiple of 16, so every segment starts 16-byte aligned in its row
  // when the row does), and the staging buffer in uint4s, padded for sh_words' read past the end.
  static constexpr int kBytes = kXBlocks * 32 / F::kQK * static_cast<int>(sizeof(typename F::Block));
  static constexpr int kWords = kBytes / 16 + 1;
  static_assert(kXBlocks * 32 % F::kQK == 0 && kBytes % 16 == 0, "segments of whole blocks, 16-byte aligned");
};

template <class F, int R>
__device__ __forceinline__ void stage_rows(const uint8_t* const (&rows)[R], int64_t offset, int bytes,
                                           uint4 (*stage)[Seg<F, R>::kWords], int width, int lane) {
  constexpr int kMax = (Seg<F, R>::kBytes / 16 + 31) / 32;
  if (width == 16) {
    // Every row's loads before any store, so R * kMax loads are in flight.
    uint4 buf[R][kMax];
    const int words = bytes / 16;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kMax; ++i)
        if (lane + 32 * i < words) buf[r][i] = __ldg(reinterpret_cast<const uint4*>(rows[r] + offset) + lane + 32 * i);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kMax; ++i)
        if (lane + 32 * i < words) stage[r][lane + 32 * i] = buf[r][i];
    return;
  }
  // Rows not 16-byte aligned (e.g. 18-byte blocks, an odd count per row): narrower words, never a misread.
#pragma unroll
  for (int r = 0; r < R; ++r) warp_copy(rows[r] + offset, reinterpret_cast<uint8_t*>(stage[r]), bytes, width, lane);
}

// What both dot kernels share: a warp's R weight rows (rows past n read the last row and store nothing), x's codes
// and records for its batch, the products of x-blocks with them, and the sums stored at the end.
template <class F, int MB, int kRows = rows_per_warp<MB>(), class X = GlobalX>
struct WarpDot {
  static constexpr int R = kRows;
  const QuantizedMatmulArgs& a;
  int64_t n0, z, xblocks;
  int m;
  const uint8_t* rows[R];
  X x;
  const typename F::Context ctx;
  float acc[R][MB] = {};

  // z: the batch (of x and the weight), blockIdx.y unless the kernel maps its blocks otherwise (mul_mat_id).
  __device__ WarpDot(const QuantizedMatmulArgs& args, int64_t first_row, const X& source, int64_t batch)
      : a(args), n0(first_row), z(batch), xblocks(args.k / 32), m(static_cast<int>(args.m)), x(source) {
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = weight_row(a, z, n0 + r);
  }
  __device__ WarpDot(const QuantizedMatmulArgs& args, int64_t first_row, const X& source)
      : WarpDot(args, first_row, source, blockIdx.y) {}
  __device__ WarpDot(const QuantizedMatmulArgs& args, int64_t first_row)
      : WarpDot(args, first_row, GlobalX{x_codes(args, blockIdx.y), x_records(args, blockIdx.y), args.k}) {}

  // x-blocks xb0 .. xb0 + kG - 1 of every row, read as group p (of kG x-blocks) of src[r] (the row itself, or
  // its staged segment).
  template <int kG>
  __device__ __forceinline__ void add(const uint8_t* const (&src)[R], int p, int64_t xb0) {
    decode::Sub w[R][kG];
#pragma unroll
    for (int r = 0; r < R; ++r) decode::load_group<F, kG>(ctx, src[r], p, w[r]);
#pragma unroll
    for (int i = 0; i < MB; ++i) {
      if (i < m) {
#pragma unroll
        for (int t = 0; t < kG; ++t) {
          const decode::XBlock xq = x.get(i, xb0 + t);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][i] += decode::sub_dot<F>(w[r][t], xq);
        }
      }
    }
  }

  template <typename T>
  __device__ __forceinline__ void store(int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < MB; ++i) {
        if (i < m) {
          const float sum = warp_sum(acc[r][i]);
          if (lane == (r * MB + i) % 32 && n0 + r < a.n) store_output<T>(a, (z * a.m + i) * a.n + n0 + r, sum);
        }
      }
    }
  }

  // kParts warps of the block hold partial sums of the same rows (this one is `part`); called by all of them.
  template <typename T, int kParts>
  __device__ __forceinline__ void store_parts(int lane, int part) {
    static_assert(R * MB <= 32, "one lane per (row, row of x)");
    __shared__ float partial[kParts][32];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < MB; ++i) {
        const float sum = warp_sum(acc[r][i]);
        if (lane == r * MB + i) partial[part][lane] = sum;
      }
    __syncthreads();
    const int r = lane / MB, i = lane % MB;
    if (part == 0 && lane < R * MB && i < m && n0 + r < a.n) {
      float sum = partial[0][lane];
#pragma unroll
      for (int p = 1; p < kParts; ++p) sum += partial[p][lane];
      store_output<T>(a, (z * a.m + i) * a.n + n0 + r, sum);
    }
  }
};

// Rows whose base and length are multiples of 4 bytes: each lane reads its x-blocks' words straight from global
// memory (no shared-memory stage, so more warps are resident per SM and each keeps its loads in flight
// across x-blocks).
// kR rows per warp; with kSplit > 1, kSplit warps (the whole block) share them.
template <class F, int MB, typename T, int kR = direct_rows<F, MB>(), int kSplit = direct_split<MB>()>
__global__ void __launch_bounds__(direct_warps<MB, kSplit>() * 32) decode_direct_kernel(QuantizedMatmulArgs a) {
  constexpr int kRowGroups = direct_warps<MB, kSplit>() / kSplit;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % kSplit;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kRowGroups + warp / kSplit) * kR;
  if (n0 >= a.n) return;  // with kSplit > 1 the whole block (one row group): no barrier is left waiting
  WarpDot<F, MB, kR> dot(a, n0);
  constexpr int kG = lane_group<F, kR>(), kUnroll = 4 / kG;  // four x-blocks' loads in flight per lane
  const int groups = static_cast<int>(dot.xblocks) / kG;
#pragma unroll kUnroll
  for (int p = lane + 32 * part; p < groups; p += 32 * kSplit) dot.template add<kG>(dot.rows, p, int64_t{p} * kG);
  if constexpr (kSplit == 1) {
    dot.template store<T>(lane);
  } else {
    dot.template store_parts<T, kSplit>(lane, part);
  }
}

// Every x-block of a warp's rows into dot's sums, the rows copied segment by segment into `stage` (the warp's own
// shared memory) with words of `width` bytes (copy_width of the weight's base and row length), the lanes decoding
// from there: for rows whose fields cannot be read as aligned words from global memory. decode_dot_kernel's loop,
// and mul_mat_id's (grouped_dot_kernel) for such rows.
template <class F, int MB, int R, class X>
__device__ __forceinline__ void add_staged_rows(WarpDot<F, MB, R, X>& dot, uint4 (*stage)[Seg<F, R>::kWords],
                                                int width, int lane) {
  using S = Seg<F, R>;
  const uint8_t* staged[R];
#pragma unroll
  for (int r = 0; r < R; ++r) staged[r] = reinterpret_cast<const uint8_t*>(stage[r]);
  for (int64_t xb0 = 0; xb0 < dot.xblocks; xb0 += S::kXBlocks) {
    const int64_t offset = xb0 * 32 / F::kQK * static_cast<int64_t>(sizeof(typename F::Block));
    const int64_t left = dot.a.row_bytes - offset;
    const int bytes = static_cast<int>(left < S::kBytes ? left : S::kBytes);
    stage_rows<F, R>(dot.rows, offset, bytes, stage, width, lane);
    __syncwarp();
    const int seg_xblocks = static_cast<int>(dot.xblocks - xb0 < S::kXBlocks ? dot.xblocks - xb0 : S::kXBlocks);
    // Independent x-blocks interleaved when registers allow (one row of each); else one at a time.
    constexpr int kUnroll = R * MB <= 2 ? S::kLaneXBlocks : 1;
#pragma unroll kUnroll
    for (int p = 0; p < S::kLaneXBlocks; ++p) {
      const int g = lane + 32 * p;
      if (g < seg_xblocks) dot.template add<1>(staged, g, xb0 + g);
    }
    __syncwarp();  // the stage is rewritten next
  }
}

template <class F, int MB, typename T>
__global__ void __launch_bounds__(warps_per_block<MB>() * 32) decode_dot_kernel(QuantizedMatmulArgs a) {
  constexpr int R = rows_per_warp<MB>(), kWarps = warps_per_block<MB>();
  __shared__ uint4 stage_all[kWarps][R][Seg<F, R>::kWords];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (n0 >= a.n) return;  // the whole warp: only __syncwarp below
  WarpDot<F, MB> dot(a, n0);
  // The widest word that divides the weight's base address and row length (segments start 16-byte multiples in).
  const int width = copy_width(reinterpret_cast<uintptr_t>(a.w), static_cast<uint64_t>(a.row_bytes));
  add_staged_rows(dot, stage_all[warp], width, lane);
  dot.template store<T>(lane);
}

}  // namespace
}  // namespace ggml_ext::cuda
