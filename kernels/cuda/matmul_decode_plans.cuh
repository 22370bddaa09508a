// Decode (forward, m <= 8 rows of x): the weight is streamed once, at memory speed, with integer dot products.
//
// Quantized weights, two steps (decode_plan):
//   0. quantize_x: each 32 elements of every row of x become 32 int8 codes (scale d = amax / 127, rounded to the
//      nearest, ties to even: ggml's Q8_0 with a float32 scale) plus a record {d, the code sums of both 16-element
//      halves}; codes contiguous per row (the dot reads 16 bytes at a time), records apart. Workspace.
//   1. dot: a warp owns R weight rows. Rows on 4-byte boundaries (decode_direct_kernel): each lane reads the
//      words of its x-blocks straight from global memory (Q4_K/Q5_K: a pair of x-blocks sharing their bytes at a
//      time, lane_group), four x-blocks in flight, and takes __dp4a products as
//      below; from 2 rows of x on, the 4 warps of a block share R rows and split their x-blocks (for one row of x
//      on a weight of at most kFewRows rows, 2 warps share 2 rows). Other rows (decode_dot_kernel) are walked in
//      segments of 128 x-blocks (4096 elements). Each
//      segment of each row is copied into the warp's shared memory with the widest loads the row's alignment
//      allows (16 bytes for every benchmarked shape; rows are contiguous, so the warp's loads are too), then
//      each lane decodes 4 x-blocks of it (decode_formats.cuh: ggml blocks are only 2-byte aligned, so fields
//      are read from shared memory as aligned words and funnel shifts) and takes __dp4a products with x's
//      codes, which it loads once for all R rows (read-only path; x is small and stays in L1/L2). Scales are
//      applied per x-block in float32; the lanes' sums meet in a shuffle reduction.
// Error: x's codes are ggml's Q8_0 ones with an unrounded scale (ggml's K-quants use coarser Q8_K per 256),
// and the offset terms use d * sum(codes) as ggml's Q8_1 does, so the result is never less accurate than
// ggml's own scheme.
//
// One row of x on a weight of many rows (Q4_0, Q5_K: of any), or up to 4 for some formats (decode_fused_kernel,
// fused_max_m, fused_few_rows_max_m): one step, each block quantizing x into its own shared memory first, its warps
// then taking rows (or pairs of rows, fused_pair_max_m) in turn as the direct kernel's do.
//
// From 2..7 rows of x on (fragment_min_m, by format and kernel), most formats take the tensor cores instead: x's
// codes (stored by x-block) are the 8 columns of an int8 m16n8k32 product (two m16n8k16 products, one per
// 16-element half, for the formats with a scale per 16), and each lane reads its A-fragment words of the weight
// from shared memory, where the warp copied its chunks of 16 rows with cp.async (decode_staged_fragment_kernel,
// rows on 16-byte boundaries), else straight from global memory (decode_fragment_kernel). On a weight of many rows
// the staged kernel of most formats quantizes x itself (shared_x_route): a few blocks per multiprocessor, each with
// x in its shared memory, take the groups of 16 rows in turn (one step).
//
// Float weights (F32/F16/BF16) keep the float kernel (decode_float_kernel): a warp per row, 16-element chunks.
// matmul_decode_tensor_cores.cuh (the fragment kernels), matmul_decode_float.cuh (float weights); here the
// plans: which kernel takes which product, and their launch shapes. matmul_decode.cu picks the plan by type;
// the formats' plans are instantiated in three translation units (matmul_decode_blocks32.cu, _superblocks.cu,
// _decoded.cu; not equal in size: the grid types have no fragment kernels) so that nvcc takes them in parallel.
#pragma once
#include <cstdlib>
#include <type_traits>
#if defined(GGML_EXT_TUNING)
#include <cstring>
#endif

#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/decode_formats_iq.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_dp4a.cuh"
#include "kernels/cuda/matmul_decode_fused.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"
#include "kernels/cuda/matmul_decode_tensor_cores.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ plans

// The grid and block follow from the kernel's shape: kR rows per row group, direct_warps / kSplit groups per block.
template <class F, int MB, typename T, int kR = direct_rows<F, MB>(), int kSplit = direct_split<MB>()>
void set_direct_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  constexpr int kWarps = direct_warps<MB, kSplit>();
  l.kernel = reinterpret_cast<const void*>(&decode_direct_kernel<F, MB, T, kR, kSplit>);
  l.grid = dim3(ceil_div(a.n, kR * (kWarps / kSplit)), static_cast<unsigned>(a.batches));
  l.block = dim3(kWarps * 32);
}

// Blocks per multiprocessor of a kernel whose blocks hold `shared_bytes` of shared memory and `threads` threads
// (of the device's shared memory per multiprocessor, 1 KB reserved per block, and 2048 threads), at most `cap`.
inline int resident_blocks(int64_t shared_bytes, int threads, int cap) {
  const int64_t by_shared = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor) / (shared_bytes + 1024);
  const int64_t by_threads = 2048 / threads;
  const int64_t n = by_shared < by_threads ? by_shared : by_threads;
  return static_cast<int>(n < 1 ? 1 : n > cap ? cap : n);
}

// kSharedX: leaves `l` empty (no kernel) where the block's shared memory, x's included, is more than the device
// gives a block (an A100 163 KB, sm_86 99 KB, an H100 227 KB).
template <class F, typename T, int kSplit, int kStages, bool kSharedX = false>
void set_staged_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  l.kernel = reinterpret_cast<const void*>(&decode_staged_fragment_kernel<F, T, kSplit, kStages, kSharedX>);
  l.block = dim3(kSplit * 32);
  l.shared_bytes = static_cast<unsigned>(kSplit * kStages * 16 * StagedChunk<F>::kStride);
  int64_t blocks = ceil_div(a.n, 16);
  if constexpr (kSharedX) {
    l.shared_bytes += shared_x_bytes(a);
    const int64_t block_shared = l.shared_bytes + sizeof(float) * kSplit * 16 * 8;  // and the static sums
    if (block_shared > device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) {
      l = KernelLaunch{};
      return;
    }
    int per_sm = resident_blocks(block_shared, kSplit * 32, 4);
#if defined(GGML_EXT_TUNING)
    if (const char* v = std::getenv("GGML_EXT_XS_PER_SM")) per_sm = std::atoi(v);
#endif
    const int64_t sms = multiprocessor_count();
    if (sms > 0 && blocks > sms * per_sm) blocks = sms * per_sm;
  }
  l.grid = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.batches));
}

// bench/cuda_kernel_driver.cu's variant builds (-DGGML_EXT_TUNING): whether GGML_EXT_STAGED names `variant`
// (<warps><stages> of the staged kernel, "unstaged", "dp4a": no tensor-core kernel, "frag": a tensor-core kernel from
// 2 rows of x on wherever one can take the weight, no fused kernel); never in the package's builds.
inline bool tuning_variant(const char* variant) {
#if defined(GGML_EXT_TUNING)
  const char* v = std::getenv("GGML_EXT_STAGED");
  return v != nullptr && std::strcmp(v, variant) == 0;
#else
  (void)variant;
  return false;
#endif
}


// Whether a weight has too few rows for the one-kernel plans (fused, staged with x inside) but where measured
// otherwise (fused_few_rows_max_m, shared_x_route): each block quantizes all of x for the few rows it then takes.
// Tuning builds: GGML_EXT_FEW_ROWS_ONE_KERNEL=1 lifts it, to measure them.
inline bool too_few_rows_for_one_kernel(const QuantizedMatmulArgs& a) {
  return a.n <= kFewRows && !tuning_switch("GGML_EXT_FEW_ROWS_ONE_KERNEL");
}

// The per-16 formats only where staged_fits (set_dot_step): they have no reader for the unstaged kernel.
template <class F, typename T>
void set_fragment_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  if (F::kPerHalf || (staged_fits<F>(a) && !tuning_variant("unstaged"))) {
#if defined(GGML_EXT_TUNING)  // float16 x only (the benchmarks'), so that the tuning build stays quick
    if constexpr (std::is_same_v<T, __half>) {
      if (tuning_variant("42")) return set_staged_step<F, T, 4, 2>(l, a);
      if (tuning_variant("43")) return set_staged_step<F, T, 4, 3>(l, a);
      if (tuning_variant("82")) return set_staged_step<F, T, 8, 2>(l, a);
      if (tuning_variant("83")) return set_staged_step<F, T, 8, 3>(l, a);
      if (tuning_variant("162")) return set_staged_step<F, T, 16, 2>(l, a);
      if (tuning_variant("24")) return set_staged_step<F, T, 2, 4>(l, a);
    }
#endif
    if (a.n <= kFewRows) return set_staged_step<F, T, staged_split<F>(true), kStagedStages>(l, a);
    return set_staged_step<F, T, staged_split<F>(false), kStagedStages>(l, a);
  }
  if constexpr (!F::kPerHalf) {
    const bool few = a.n <= kFewRows;  // more warps per 16 rows, so that the grid keeps enough loads in flight
    l.kernel = few ? reinterpret_cast<const void*>(&decode_fragment_kernel<F, T, kFragmentSplitFew>)
                   : reinterpret_cast<const void*>(&decode_fragment_kernel<F, T, kFragmentSplitMany>);
    l.grid = dim3(ceil_div(a.n, 16), static_cast<unsigned>(a.batches));
    l.block = dim3((few ? kFragmentSplitFew : kFragmentSplitMany) * 32);
  }
}

// Returns whether the step reads x by x-block (quantize_x_kernel's kByBlock).
template <class F, int MB, typename T>
bool set_dot_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  if (!rows_aligned(a, 4)) {
    l.kernel = reinterpret_cast<const void*>(&decode_dot_kernel<F, MB, T>);
    l.grid = dim3(ceil_div(a.n, rows_per_warp<MB>() * warps_per_block<MB>()), static_cast<unsigned>(a.batches));
    l.block = dim3(warps_per_block<MB>() * 32);
    return false;
  }
  if constexpr (MB > 1 && decode::has_fragments<F>()) {  // the grid and ternary formats: __dp4a only
    const bool staged = staged_fits<F>(a);
    const bool tensor_cores = a.m >= fragment_min_m<F>(a.n <= kFewRows, staged) || tuning_variant("frag");
    if ((staged || !F::kPerHalf) && tensor_cores && !tuning_variant("dp4a")) {
      set_fragment_step<F, T>(l, a);
      return true;
    }
  }
  if constexpr (MB == 1) {
#if defined(GGML_EXT_TUNING)  // rows per row group and warps sharing them, for one row of x at any weight height
    if (tuning_variant("d22")) return set_direct_step<F, 1, T, 2, 2>(l, a), false;
    if (tuning_variant("d14")) return set_direct_step<F, 1, T, 1, 4>(l, a), false;
    if (tuning_variant("d24")) return set_direct_step<F, 1, T, 2, 4>(l, a), false;
    if (tuning_variant("d42")) return set_direct_step<F, 1, T, 4, 2>(l, a), false;
    if (tuning_variant("d44")) return set_direct_step<F, 1, T, 4, 4>(l, a), false;
#endif
    if (a.n <= kFewRows) {
      set_direct_step<F, 1, T, few_rows_direct<F>(), few_rows_direct<F>()>(l, a);
      return false;
    }
  }
  set_direct_step<F, MB, T>(l, a);
  return false;
}

// The most rows of x the fused kernel takes for a format (0: none). H100 ncu through MLX, 14336x4096, fused
// against the two steps in the same run (a -DGGML_EXT_TUNING build, GGML_EXT_STAGED=twostep;
// bench/results/h100-2026-11-26-fused-two-rows.json), m=2: Q4_1 22.1 / 24.6 us, Q5_0 25.1 / 29.0, Q5_1 23.5 / 27.3,
// Q5_K 25.5 / 32.0, Q2_K 21.6 / 26.5, Q3_K 30.1 / 35.6, IQ4_NL 25.9 / 31.2, IQ4_XS 26.3 / 31.0, MXFP4 25.4 / 31.2,
// Q4_K 23.7 / 29.3, Q8_0 29.7 / 30.6. Q4_0 also at m = 3, 4 (h100-2026-11-25zz-fused-few-rows.json: 24.6 / 28.4
// against 29.4 / 29.2 in an earlier run); the others were slower there in the kernel built for 4 rows (Q4_K, Q8_0
// 39.8-48.8 against 32.6-36.7). Q6_K at m=1 only: kernel-only about as fast as its two steps (27.9 against 26.6 us;
// 27.0 against 27.0-27.3 in a later run), and a kernel node fewer through MLX (one_kernel_at_one_row); not measured
// at m=2. Where the staged kernel with x in shared memory takes a weight (shared_x_route, set_shared_x_step: rows on
// 16-byte boundaries), it comes first: Q4_0 keeps the fused kernel at m = 3, 4 only for rows on 4-byte boundaries but
// not on 16.
template <class F>
constexpr int fused_max_m() {
  if constexpr (std::is_same_v<F, decode::FmtQ6_K>) return 1;
  if constexpr (std::is_same_v<F, decode::FmtQ4_0>) return 4;
  return 2;
}

// The most rows of x for which each warp of the fused kernel takes two weight rows at a time (0: none): twice the
// loads in flight per warp, half the row ends (each a reduction and a wait for the next row's first loads). H100
// ncu through MLX, 14336x4096, one row of x, -DGGML_EXT_TUNING builds run with GGML_EXT_FUSED_ROWS=2 and =1 in the
// same run (bench/results/h100-2026-11-26c-fused-row-pairs.json), pairs / one row: Q4_0 17.2 / 19.3 and 17.1 / 18.8
// us in two runs (ncu's detail: SMs active 27.3k of 34.5k cycles, 30.4k of 40.3k with one row), IQ4_XS 21.9 / 24.1
// and 21.8 / 23.5, Q4_1 18.1 / 19.6, Q5_0 19.9 / 21.4, Q5_1 20.3 / 22.1; within the noise of the same
// configuration measured twice (about 5%) or slower for the others (Q2_K 15.9 / 16.7, Q3_K 29.7 / 26.8, Q4_K 19.7 /
// 18.3, Q5_K 23.0 / 21.3, Q8_0 28.5 / 27.0, IQ4_NL 23.4 / 22.4, MXFP4 23.4 / 22.2); at m=2 not consistently faster
// (Q4_0 21.5 / 22.8, then 21.7 / 21.8).
template <class F>
constexpr int fused_pair_max_m() {
  using namespace decode;
  if constexpr (std::is_same_v<F, FmtQ4_0> || std::is_same_v<F, FmtQ4_1> || std::is_same_v<F, FmtQ5_0> ||
                std::is_same_v<F, FmtQ5_1> || std::is_same_v<F, FmtIQ4_XS>)
    return 1;
  return 0;
}
// Weight rows per warp of the fused kernel for m rows of x (tuning builds: GGML_EXT_FUSED_ROWS=1 or 2 forces one).
template <class F>
int fused_rows(int64_t m) {
#if defined(GGML_EXT_TUNING)
  if (const char* v = std::getenv("GGML_EXT_FUSED_ROWS")) return std::atoi(v) == 2 ? 2 : 1;
#endif
  return m <= fused_pair_max_m<F>() ? 2 : 1;
}

// x-blocks each thread of the one-row fused kernel quantizes at a time: 2 keeps more of x's loads in flight, 1 takes
// fewer registers (Q5_0's pair kernel 73 -> 58: 4 blocks per multiprocessor instead of 3). H100, ncu through MLX,
// 14336x4096, tuning build, GGML_EXT_FUSED_X_UNROLL=1 against the default in one run, each kernel three times (under
// variant names that take the same kernels there; bench/results/h100-2026-11-26zz-fused-x-unroll.json): Q4_1
// 18.0-18.4 against 20.2-21.0 us, Q5_0 20.7-22.6 against 22.1-22.5; Q4_0, Q4_K, Q5_K, Q8_0 the same within 0.5 us,
// IQ4_XS 0.6 us slower, Q6_K's fused kernel 27.0 against 31.3 but no faster than its two steps (27.0-27.3).
template <class F>
constexpr int fused_x_unroll() {
  return std::is_same_v<F, decode::FmtQ4_1> || std::is_same_v<F, decode::FmtQ5_0> ? 1 : 2;
}

// The row counts of x compiled with pairs of weight rows: fused_pair_max_m's (tuning builds: fused_max_m's).
template <class F>
constexpr int fused_built_pair_m() {
#if defined(GGML_EXT_TUNING)
  return fused_max_m<F>();
#else
  return fused_pair_max_m<F>();
#endif
}
// The fused kernel built for m rows of x and kRows weight rows per warp (only those fused_max_m and
// fused_built_pair_m allow are compiled).
template <class F, typename T, int kRows>
const void* fused_kernel(int64_t m) {
  constexpr int kMaxM = kRows == 2 ? fused_built_pair_m<F>() : fused_max_m<F>();
  if constexpr (kMaxM >= 4) {
    if (m > 2) return reinterpret_cast<const void*>(&decode_fused_kernel<F, 4, T, kRows>);
  }
  if constexpr (kMaxM >= 2) {
    if (m > 1) return reinterpret_cast<const void*>(&decode_fused_kernel<F, 2, T, kRows>);
  }
  return reinterpret_cast<const void*>(&decode_fused_kernel<F, 1, T, kRows, false, fused_x_unroll<F>()>);
}
template <class F, typename T>
const void* fused_kernel(int64_t m, int rows) {
  if constexpr (fused_built_pair_m<F>() == 0) {
    return fused_kernel<F, T, 1>(m);
  } else {
    return rows == 2 ? fused_kernel<F, T, 2>(m) : fused_kernel<F, T, 1>(m);
  }
}

// The rows of x for which the fused kernel also takes weights of few rows (0: none). Kernel-only it was faster for
// Q4_0 and Q5_K only. H100, ncu through MLX, 4096x14336, m=1, GGML_EXT_FEW_ROWS_ONE_KERNEL=1 against the default
// (both steps) in one run (bench/results/h100-2026-11-26q-kernel-times.json): Q4_0 21.4 -> 20.4 us, Q5_K 26.2 ->
// 24.1; slower for the others (Q4_1 20.0 -> 24.6, Q4_K 19.9 -> 21.0, Q8_0 30.5 -> 33.6, IQ4_NL 21.7 -> 28.4; every
// format at m=2). Checked on more shapes against GGML_EXT_STAGED=twostep in one run (h100-2026-11-26r-few-rows.json),
// 4096x14336 / 4096x4096 / 1024x4096: Q4_0 21.8 / 11.6 / 8.7 -> 20.3 / 11.0 / 6.9 us, Q5_K 26.6 / 13.4 / 8.3 -> 24.5
// / 11.4 / 6.7. Through MLX, though, the second kernel node costs more host time than the fused kernel's repeated
// quantizing of x costs the GPU: H200, a Llama-1B-shaped Q4_K GGUF (q/k/v 3072, o 2048 and down 2048 rows: 3 of a
// layer's 4 products have few rows), decode of 128 tokens, one process per figure, alternated three times
// (bench/results/h200-2026-11-28e-few-rows-one-kernel.json): both steps 251.5 / 267.1 / 261.6 tok/s, the fused kernel
// 304.7 / 273.0 / 288.9 (+10% in the medians). So every format with a fused kernel takes it at one row of x
// (Q6_K too, fused_max_m). MLX_GGML_EXT_CUDA_ONE_ROW_ONE_KERNEL=0 (read once) gives both steps back where kernel-only
// times preferred them (these weights but for Q4_0 and Q5_K; Q6_K on any), for A/B runs.
inline bool one_kernel_at_one_row() {
  static const bool on = [] {
    const char* v = std::getenv("MLX_GGML_EXT_CUDA_ONE_ROW_ONE_KERNEL");
    return v == nullptr || std::atoi(v) != 0;
  }();
  return on;
}
template <class F>
int fused_few_rows_max_m() {
  if constexpr (std::is_same_v<F, decode::FmtQ4_0> || std::is_same_v<F, decode::FmtQ5_K>) return 1;
  return one_kernel_at_one_row() ? 1 : 0;
}

#if defined(GGML_EXT_TUNING)
// The one-row fused kernel with `rows` weight rows per warp, built for the tuning switches of set_fused_step.
template <class F, typename T, bool kSkipX, int kXUnroll>
const void* one_row_fused_kernel(int rows) {
  return rows == 2 ? reinterpret_cast<const void*>(&decode_fused_kernel<F, 1, T, 2, kSkipX, kXUnroll>)
                   : reinterpret_cast<const void*>(&decode_fused_kernel<F, 1, T, 1, kSkipX, kXUnroll>);
}
#endif

// The fused kernel where it applies (rows on 4-byte boundaries, x's blocks fit shared memory, many weight rows
// or fused_few_rows_max_m).
template <class F, typename T>
bool set_fused_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  // Tuning builds: GGML_EXT_STAGED=fused takes the one-row kernel where it would not be taken (Q6_K with
  // MLX_GGML_EXT_CUDA_ONE_ROW_ONE_KERNEL=0).
  const bool forced = a.m == 1 && tuning_variant("fused");
  const int max_m = std::is_same_v<F, decode::FmtQ6_K> && !one_kernel_at_one_row() ? 0 : fused_max_m<F>();
  if ((a.m > max_m && !forced) || !rows_aligned(a, 4) || a.m * a.k > kFusedMaxK ||
      (too_few_rows_for_one_kernel(a) && a.m > fused_few_rows_max_m<F>()) || tuning_variant("twostep") ||
      tuning_variant("frag"))
    return false;
  int per_sm = kFusedBlocksPerSm;
#if defined(GGML_EXT_TUNING)
  if (const char* v = std::getenv("GGML_EXT_FUSED_PER_SM")) per_sm = std::atoi(v);
#endif
  const int rows = fused_rows<F>(a.m);
  const int64_t sms = multiprocessor_count(), blocks = ceil_div(ceil_div(a.n, rows), kFusedWarps);
  l.kernel = fused_kernel<F, T>(a.m, rows);
#if defined(GGML_EXT_TUNING)
  // GGML_EXT_FUSED_SKIP_X=1: one row of float16 x without quantizing it (the products' time; wrong results);
  // GGML_EXT_FUSED_PREFETCH=1: the weight prefetch before x's quantizing (fused_prefetch).
  // GGML_EXT_FUSED_X_UNROLL=1: one row of x quantized one x-block at a time per thread (fused_x_unroll).
  if constexpr (std::is_same_v<T, __half>) {
    if (a.m == 1 && tuning_switch("GGML_EXT_FUSED_SKIP_X")) l.kernel = one_row_fused_kernel<F, T, true, 2>(rows);
    if (a.m == 1 && tuning_switch("GGML_EXT_FUSED_X_UNROLL")) l.kernel = one_row_fused_kernel<F, T, false, 1>(rows);
  }
  const int prefetch = tuning_switch("GGML_EXT_FUSED_PREFETCH") ? 1 : 0;
  cudaMemcpyToSymbol(g_fused_prefetch, &prefetch, sizeof prefetch);
#endif
  l.grid = dim3(static_cast<unsigned>(sms > 0 && blocks > sms * per_sm ? sms * per_sm : blocks),
                static_cast<unsigned>(a.batches));
  l.block = dim3(kFusedWarps * 32);
  l.shared_bytes = shared_x_bytes(a);
  return true;
}

// The staged kernel with x's step 0 inside (kSharedX) on a weight of many rows: for which rows of x, with how many
// warps per 16 rows (8 up to eight_warps_max_m, then 16). H100, ncu through MLX, 14336x4096, -DGGML_EXT_TUNING
// builds, each case by default and with GGML_EXT_STAGED=xs8 / xs16 (8, 16 warps from 2 rows of x on) in one run.
// bench/results/h100-2026-11-26m-shared-x.json (also xs4, never the fastest), m = 2 / 3 / 4 / 5 / 8, default
// against the best: Q4_0 20.7 (fused) / 24.1 / 28.3 / 27.8 / 28.7 us against 21.8 (8) / 23.6 (8) / 23.8 (8) / 24.4
// (8) / 25.5 (16); Q4_K 23.4 (fused) / 29.1 / 29.5 / 30.2 / 29.8 against 26.8 / 27.9 / 28.6 / 28.8 (8) / 29.7 (16);
// Q6_K 37.6 / 35.8 / 36.1 / 36.4 / 38.2 against 33.3 / 33.2 / 34.0 / 34.1 / 36.0 (16); Q8_0 28.7 / 33.5 / 34.3 /
// 39.6 / 40.0 against 28.6 / 29.2 / 29.2 / 30.5 / 31.5 (16). Q4_K keeps both steps from m=6 (16 warps no faster at
// m=8; 31.7-31.8 us at m=6 in three release runs against 29.5 for both steps).
// bench/results/h100-2026-11-26p-shared-x-formats.json, m = 2 / 3 / 4 / 5 / 6 / 8, default against xs8 / xs16:
// Q4_1 21.9 (fused) / 26.6 / 28.2 / 30.3 / 30.4 / 30.5 against 24.3/24.3, 25.2/26.0, 26.4/24.4, 27.4/24.8,
// 28.5/25.4, 31.6/26.2; Q5_0 22.4 (fused) / 29.5 / 30.6 / 29.4 / 29.6 / 30.0 against 25.8/28.1, 27.1/29.1,
// 28.4/27.4, 29.2/28.3, 30.2/28.6, 32.9/29.7; Q5_1 23.9 (fused) / 31.1 / 32.5 / 35.0 / 34.9 / 35.6 against
// 26.7/27.0, 28.1/27.6, 29.1/27.9, 29.3/28.9, 30.6/29.2, 34.0/29.8; Q5_K 33.3 (fused) / 31.9 / 32.7 / 32.8 / 31.8 /
// 32.4 against 28.3/29.8, 29.1/30.3, 31.2/29.2, 31.8/29.9, 32.2/30.4, 35.7/31.6; IQ4_XS from m=4: 33.4 / 34.0 / 34.6
// / 34.8 against xs16 31.4 / 32.1 / 32.2 / 33.1 (m=3 31.8 / 31.2, within the noise). Not taken (xs no faster, or
// within 3%): Q2_K, Q3_K, IQ4_NL (both steps 29.8-30.9 us from m=3, xs 30.8-40.0), MXFP4 (31.2-32.4 against xs16
// 31.2-31.6). Q4_0 at m=6 (h100-2026-11-26u-q4_0-m6-warps.json): 8 warps 25.6 us against 16 27.2 / 27.3 (twice
// in the run; 3 stages 26.3), at m=8 28.7 against 25.6; m=7 not measured (16).
// On weights of few rows (too_few_rows_for_one_kernel), only at 2 rows of x, 16 warps (few_rows_max_m): 4096x14336,
// GGML_EXT_FEW_ROWS_ONE_KERNEL=1 with GGML_EXT_STAGED=xs16 against the default in one run
// (bench/results/h100-2026-11-26q-kernel-times.json): Q4_0 25.3 -> 22.1 us, Q8_0 36.1 -> 30.3, Q5_K 29.8 -> 27.8;
// from m=3 on it was within 3% of both steps for every format (x's quantizing, repeated by each block, costs about
// what the quantize step does), at m=2 within 5% or slower for the others. Against GGML_EXT_STAGED=twostep in one run
// (h100-2026-11-26r-few-rows.json), 4096x14336 / 4096x4096 / 1024x4096: Q4_0 24.6 / 13.0 / 8.2 -> 21.9 / 10.6 / 7.3
// us, Q8_0 36.4 / 15.2 / 9.2 -> 30.2 / 12.2 / 7.5, Q5_K 29.5 / 15.1 / 9.0 -> 28.0 / 12.7 / 7.8.
struct SharedXRoute {
  int min_m, max_m;       // rows of x it takes (min_m > kDecodeMaxM: none)
  int eight_warps_max_m;  // 8 warps per 16 rows up to here, 16 above
  int few_rows_max_m;     // on weights of few rows: 16 warps from 2 rows of x up to here (0: none)
};
template <class F>
constexpr SharedXRoute shared_x_route() {
  using namespace decode;
  if constexpr (std::is_same_v<F, FmtQ4_0>) return {3, kDecodeMaxM, 6, 2};
  if constexpr (std::is_same_v<F, FmtQ4_K>) return {3, 5, 5, 0};
  if constexpr (std::is_same_v<F, FmtQ6_K>) return {2, kDecodeMaxM, 0, 0};
  if constexpr (std::is_same_v<F, FmtQ8_0>) return {2, kDecodeMaxM, 0, 2};
  if constexpr (std::is_same_v<F, FmtQ4_1> || std::is_same_v<F, FmtQ5_0>) return {3, kDecodeMaxM, 3, 0};
  if constexpr (std::is_same_v<F, FmtQ5_1>) return {3, kDecodeMaxM, 0, 0};
  if constexpr (std::is_same_v<F, FmtQ5_K>) return {2, kDecodeMaxM, 3, 2};
  if constexpr (std::is_same_v<F, FmtIQ4_XS>) return {4, kDecodeMaxM, 0, 0};
  return {kDecodeMaxM + 1, 0, 0, 0};
}

// The staged kernel with x's step 0 inside where it applies: rows on 16-byte boundaries in whole chunks, x's
// blocks in shared memory (m * k <= kFusedMaxK), where shared_x_route takes the weight. Tuning builds:
// GGML_EXT_STAGED=xs<warps>[<stages>] takes it from 2 rows of x on (on weights of many rows), twostep / frag never.
template <class F, typename T>
bool set_shared_x_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  if (a.m < 2 || a.m * a.k > kFusedMaxK || !staged_fits<F>(a) || tuning_variant("twostep") || tuning_variant("frag"))
    return false;
  constexpr SharedXRoute route = shared_x_route<F>();
  if (too_few_rows_for_one_kernel(a)) {
    if constexpr (route.few_rows_max_m >= 2) {
      if (a.m <= route.few_rows_max_m) return set_staged_step<F, T, 16, kStagedStages, true>(l, a), l.kernel != nullptr;
    }
    return false;
  }
#if defined(GGML_EXT_TUNING)
  if constexpr (std::is_same_v<T, __half>) {
    if (tuning_variant("xs4")) return set_staged_step<F, T, 4, 2, true>(l, a), l.kernel != nullptr;
    if (tuning_variant("xs8")) return set_staged_step<F, T, 8, 2, true>(l, a), l.kernel != nullptr;
    if (tuning_variant("xs16")) return set_staged_step<F, T, 16, 2, true>(l, a), l.kernel != nullptr;
    if (tuning_variant("xs83")) return set_staged_step<F, T, 8, 3, true>(l, a), l.kernel != nullptr;
  }
#endif
  if constexpr (route.min_m <= kDecodeMaxM) {
    if (a.m < route.min_m || a.m > route.max_m) return false;
    if constexpr (route.eight_warps_max_m > 0) {
      if (a.m <= route.eight_warps_max_m)
        return set_staged_step<F, T, 8, kStagedStages, true>(l, a), l.kernel != nullptr;
    }
    if constexpr (route.max_m > route.eight_warps_max_m)
      return set_staged_step<F, T, 16, kStagedStages, true>(l, a), l.kernel != nullptr;
  }
  return false;
}

// set_shared_x_step where the format has tensor-core fragments (the staged kernel's products), else none.
template <class F, typename T>
bool set_fragment_shared_x_step(KernelLaunch& l, const QuantizedMatmulArgs& a) {
  if constexpr (decode::has_fragments<F>()) {
    return set_shared_x_step<F, T>(l, a);
  } else {
    return false;
  }
}

template <typename T, class F>
QuantizedMatmulPlan dot_plan(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  if (set_fragment_shared_x_step<F, T>(p.steps[0], a) || set_fused_step<F, T>(p.steps[0], a)) return p;
  KernelLaunch& q = p.steps[0];
  KernelLaunch& d = p.steps[1];
  bool by_block;
  if (a.m <= 1) {
    by_block = set_dot_step<F, 1, T>(d, a);
  } else if (a.m <= 2) {
    by_block = set_dot_step<F, 2, T>(d, a);
  } else if (a.m <= 4) {
    by_block = set_dot_step<F, 4, T>(d, a);
  } else {
    by_block = set_dot_step<F, 8, T>(d, a);
  }
  q.kernel = by_block ? reinterpret_cast<const void*>(&quantize_x_kernel<T, true>)
                      : reinterpret_cast<const void*>(&quantize_x_kernel<T, false>);
  q.grid = dim3(ceil_div(x_rows(a) * (a.k / 32) * 8, kQuantizeThreads));
  q.block = dim3(kQuantizeThreads);
  p.workspace_bytes = records_offset(a) + x_rows(a) * (a.k / 32) * static_cast<int64_t>(sizeof(XRecord));
  return p;
}

// The integer-dot format of a ggml type id (nullptr_t: none): every quantized type, the decoded ones (IQ grids,
// ternary: decode_formats_iq.cuh) included.
template <typename Make>
QuantizedMatmulPlan with_format(int type, Make&& make) {
  switch (type) {
#define GGML_EXT_FORMAT_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return make(decode::Fmt##NAME{});
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_FORMAT_CASE)
    GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_FORMAT_CASE)
#undef GGML_EXT_FORMAT_CASE
    default: return {};
  }
}

// The plan of a format of one group (InGroup<F>::value), x of type x_type; empty for every other type.
template <template <class> class InGroup>
QuantizedMatmulPlan group_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, {
    return with_format(ggml_type, [&](auto format) -> QuantizedMatmulPlan {
      using F = decltype(format);
      if constexpr (InGroup<F>::value) {
        return dot_plan<typename Storage<kType>::type, F>(args);
      } else {
        return {};
      }
    });
  });
  return {};
}

// The groups: ggml's formats of 32-element blocks, its 256-element super-blocks whose codes are read in place, and
// the grid and ternary formats (decoded codes, no tensor-core fragments).
template <class F>
struct IsDecoded : std::false_type {};
#define GGML_EXT_DECODED_FORMAT(NAME, name, id, qk, bytes) \
  template <>                                              \
  struct IsDecoded<decode::Fmt##NAME> : std::true_type {};
GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_DECODED_FORMAT)
#undef GGML_EXT_DECODED_FORMAT

template <class F>
struct InBlocksOf32 : std::bool_constant<F::kQK == 32 && !IsDecoded<F>::value> {};
template <class F>
struct InSuperBlocks : std::bool_constant<F::kQK == 256 && !IsDecoded<F>::value> {};

}  // namespace
}  // namespace ggml_ext::cuda
