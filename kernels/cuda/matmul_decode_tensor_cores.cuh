// Decode on tensor cores (matmul_decode_plans.cuh has the design): int8 m16n8k32 / m16n8k16 products of 16 weight rows
// with x's rows as the 8 columns, unstaged (decode_fragment_kernel) or with the rows staged in shared memory by
// cp.async (decode_staged_fragment_kernel, which may also quantize x itself).
#pragma once
#include <type_traits>

#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ tensor cores

// D = A (16 x 32 int8, row-major) x B (32 x 8 int8, column-major) in int32, one m16n8k32 tensor-core product.
// Fragments as PTX lays them out (g = lane / 4, t = lane % 4): a[0] row g, k 4t..4t+3; a[1] row g + 8, same k;
// a[2] row g, k 16 + 4t..; a[3] row g + 8, k 16 + 4t..; b[0] k 4t..4t+3 of column g, b[1] k 16 + 4t.. of it;
// d[0], d[1] row g, columns 2t, 2t + 1; d[2], d[3] row g + 8.
__device__ __forceinline__ void mma_s8_16x8x32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_mma_s8_16x8x32(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#endif
}
// The same with k = 16: a[0] row g, k 4t..4t+3; a[1] row g + 8; b k 4t..4t+3 of column g; d as above. As the
// k = 32 product of a and b in its first halves and zeros in its second (the emulation's way).
__device__ __forceinline__ void mma_s8_16x8x16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_mma_s8_16x8x32(d, {a0, a1, 0u, 0u}, {b, 0u});
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
#endif
}

// Decode on tensor cores, unstaged (the formats with one scale per 32 elements, rows on 4-byte boundaries but not
// on 16, or not in whole chunks: decode_staged_fragment_kernel below takes the rest): a block of kSplit warps
// takes 16 weight rows, each warp every kSplit-th x-block. For an x-block, lane (g, t) reads only
// its A-fragment words of rows g and g + 8 straight from global memory (decode_formats.cuh: Frag: four lanes per
// row, each a quarter of the x-block's bytes); x, quantized by x-block (quantize_x_kernel<T, true>), gives the B
// fragment (the rows of x as the 8 columns, clamped to the last row past m: those columns are never stored), and
// one m16n8k32 product replaces the dp4a chains of every row of x, scaled in float32 per (row, x-block, row of x)
// as sub_dot does. Its time does not grow with m (H100, bench/cuda_kernel_driver.cu, weight from DRAM, dot step
// alone, 14336x4096 / 4096x14336, m=1..8 within 2%): Q4_0 30.2-30.8 / 28.9-29.8 us, Q4_K 36.0-36.7 / 37.3-37.7,
// Q8_0 41.7-42.7 / 41.7-42.5, where the dp4a kernels take Q4_0 16.7 / 16.2 at m=1 and 36.0 / 28.8 at m=5,
// 41.0 / 36.4 at m=8. What limits it is the L1: its weight loads touch 8 rows per instruction (L1 throughput 91%,
// DRAM 28% at Q4_0 m=8). Tried and not kept: x in the row-major order of the dp4a kernels (flat in m only up to
// m=4, 42 us at m=8: the B and record loads then span 8 rows of x); pairs of 18- and 34-byte blocks read as
// aligned words with the scales shuffled between lanes (L1 65%, but 72-101 registers: no faster, 4096x14336
// Q4_0 38.9 us); 2 or 8 warps per 16 rows of a weight of many rows (up to 1.2x slower than 4).
constexpr int kFragmentSplitMany = 4, kFragmentSplitFew = 16;  // warps per 16 rows, above / up to kFewRows rows
// The rows of x from which a tensor-core kernel replaces the dp4a kernels, by format, weight height and kernel
// (staged: decode_staged_fragment_kernel, below). H100, bench/cuda_kernel_driver.cu, dot step, m = 1, 2, 4, 5, 6,
// 8 on 14336x4096 / 4096x14336 (bench/results/h100-2026-11-25s-staged-fragment.json): the staged kernel beats
// the dp4a kernels from m = 4 (Q4_0 on many rows; Q4_K; Q5_K on few rows), m = 2 (Q5_K on many rows) or m = 5
// (the rest of those measured: Q8_0, Q4_1, IQ4_XS, Q4_0 on few rows); formats not measured (Q5_0, Q5_1, IQ4_NL,
// MXFP4) took it from 5. The formats with a scale per 16 (two m16n8k16 products per x-block): Q3_K from m=3, Q6_K
// from 5 on many rows only, Q2_K never (bench/results/h100-2026-11-25v-*.json). Once the staged kernel stopped
// dividing for every copy's row address (b06ffca: Q6_K m=8 58 -> 38 us), the staged crossings were measured again
// for every format in one run (a -DGGML_EXT_TUNING build, each case by default and with GGML_EXT_STAGED=frag,
// bench/results/h100-2026-11-26i-staged-from-m.json, ncu through MLX, both steps, 14336x4096 / 4096x14336), and
// the staged kernel now starts where it was 4% or more faster: m=3 against the default 29.0 / 27.1 us against
// 31.6 / 31.4 for Q4_K, 29.9 / 28.7 against 32.1 / 32.7 for Q5_0, 29.6 / 29.8 against 33.2 / 31.7 for IQ4_NL; on
// many rows Q6_K 37.8 / 39.4, IQ4_XS 31.9 / 34.9, MXFP4 29.4 / 33.8; m=4 on few rows Q4_0 26.3 / 29.8, Q4_1
// 30.2 / 32.3, Q5_1 32.0 / 35.0, Q8_0 39.8 / 41.7; Q2_K from m=4 on many rows (30.8 / 32.8; 30.7 / 47.2 at m=8)
// and from 5 on few rows (38.3 / 41.2; 39.6 / 51.4 at m=8), Q6_K from 5 on few rows (43.5 / 57.4; 44.1 / 69.6 at
// m=8). Equal within the noise elsewhere (repeated cases differ by up to 3.5%). The unstaged kernel's crossings
// are those of its own measurement (above); formats not measured there from 7. The per-16 formats have fragment
// readers for staged chunks only (fragment_group): their rows on 4-byte boundaries but not on 16 keep the dp4a
// kernels.
template <class F>
constexpr int fragment_min_m(bool few_rows, bool staged) {
  using namespace decode;
#if defined(GGML_EXT_FRAGMENT_FROM_M)  // timing builds of bench/cuda_kernel_driver.cu: route from this m on
  return GGML_EXT_FRAGMENT_FROM_M;
#endif
  if (staged) {  // h100-2026-11-26i (above); many rows / few rows
    if constexpr (std::is_same_v<F, FmtQ3_K> || std::is_same_v<F, FmtQ4_K> || std::is_same_v<F, FmtQ5_0> ||
                  std::is_same_v<F, FmtIQ4_NL>)
      return 3;
    if constexpr (std::is_same_v<F, FmtQ6_K> || std::is_same_v<F, FmtIQ4_XS> || std::is_same_v<F, FmtMXFP4>)
      return few_rows ? 5 : 3;
    if constexpr (std::is_same_v<F, FmtQ2_K>) return few_rows ? 5 : 4;
    if constexpr (std::is_same_v<F, FmtQ5_K>) return few_rows ? 4 : 2;
    if constexpr (std::is_same_v<F, FmtQ4_0>) return 4;
    return few_rows ? 4 : 5;  // Q4_1, Q5_1, Q8_0
  }
  if constexpr (std::is_same_v<F, FmtQ4_K>) return 5;
  if constexpr (std::is_same_v<F, FmtQ4_0>) return few_rows ? 6 : 5;
  if constexpr (std::is_same_v<F, FmtQ4_1>) return few_rows ? 7 : 5;
  if constexpr (std::is_same_v<F, FmtQ5_K>) return few_rows ? kDecodeMaxM + 1 : 5;  // few rows: 52.5 us vs 46.3
  if constexpr (std::is_same_v<F, FmtIQ4_XS>) return few_rows ? 5 : 7;
  return 7;
}
// Where the tensor-core kernels read x, quantized and ordered by x-block (x-block j of row i of x at slot j m + i):
// step 0's workspace (quantize_x_kernel<T, true>) ...
struct GlobalBlockX {
  const uint32_t* codes;
  const XRecord* records;
  // Codes read from column (row of x) `col` on: word(first, h, t) is word t of half h (the codes of elements
  // 16 h + 4 t .. 16 h + 4 t + 3) of slot first + col.
  __device__ __forceinline__ void at_column(int col) { codes += col * 8; }
  __device__ __forceinline__ uint32_t word(int64_t first, int h, int t) const {
    return __ldg(codes + first * 8 + 4 * h + t);
  }
  __device__ __forceinline__ int2 record(int64_t slot) const {
    return __ldg(reinterpret_cast<const int2*>(records + slot));
  }
};
// ... or shared memory (decode_staged_fragment_kernel with kSharedX), the halves of every other 4 slots swapped,
// so that the 8 columns' words of an x-block (8 consecutive slots, 32 bytes each) fall in distinct banks.
struct SharedBlockX {
  uint4* codes;  // two per slot
  XRecord* records;
  int col = 0;
  __device__ __forceinline__ void at_column(int column) { col = column; }
  static __device__ __forceinline__ int half_at(int64_t slot, int h) { return h ^ static_cast<int>((slot >> 2) & 1); }
  __device__ __forceinline__ void put(int64_t slot, uint4 lo, uint4 hi, XRecord r) const {
    codes[2 * slot + half_at(slot, 0)] = lo;
    codes[2 * slot + half_at(slot, 1)] = hi;
    records[slot] = r;
  }
  __device__ __forceinline__ uint32_t word(int64_t first, int h, int t) const {
    const int64_t slot = first + col;
    return reinterpret_cast<const uint32_t*>(codes)[slot * 8 + 4 * half_at(slot, h) + t];
  }
  __device__ __forceinline__ int2 record(int64_t slot) const { return reinterpret_cast<const int2*>(records)[slot]; }
};

__device__ __forceinline__ GlobalBlockX global_block_x(const QuantizedMatmulArgs& a, int64_t z) {
  return GlobalBlockX{reinterpret_cast<const uint32_t*>(x_codes(a, z)), x_records(a, z)};
}

// What both tensor-core kernels do per x-block and at the end: lane (g, t)'s share of the m16n8k32 product of
// 16 weight rows (from n0) with x's 8 columns (rows of x, clamped to the last past m), scaled into acc, then the
// block's kSplit warps' sums met in shared memory and stored.
template <class F, class X>
struct FragmentDot {
  const QuantizedMatmulArgs& a;
  int64_t n0, z;
  int m, t;
  int out_col[2];
  X x;
  float acc[4] = {};

  // The workspace's x (GlobalBlockX) is found here rather than passed in: taken from the kernel, its addresses
  // gave the 8-warp staged Q4_1 kernel 88 registers instead of 80 (ptxas -v; 2 blocks per SM instead of 3).
  __device__ FragmentDot(const QuantizedMatmulArgs& args, int lane, int64_t first_row, const X& source = {})
      : a(args), n0(first_row), z(blockIdx.y), m(static_cast<int>(args.m)), t(lane % 4), x(source) {
    // Of each x-block, column g's codes (B fragment) and the records of columns 2t, 2t + 1 (this lane's outputs).
    const int g = lane / 4, col_g = g < m ? g : m - 1;
    out_col[0] = 2 * t < m ? 2 * t : m - 1;
    out_col[1] = 2 * t + 1 < m ? 2 * t + 1 : m - 1;
    if constexpr (std::is_same_v<X, GlobalBlockX>) x = global_block_x(a, z);
    x.at_column(col_g);
  }

  // x-block xb of rows g (lo) and g + 8 (hi).
  __device__ __forceinline__ void add(const decode::Frag& lo, const decode::Frag& hi, int xb) {
    const int64_t first = static_cast<int64_t>(xb) * m;  // x-block xb of row 0 of x
    const uint32_t bf[2] = {x.word(first, 0, t), x.word(first, 1, t)};
    float dx[2];
    int s0[2], s1[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) unpack_record(x.record(first + out_col[c]), dx[c], s0[c], s1[c]);
    if constexpr (F::kPerHalf) {  // a scale per 16 elements: the halves' products apart, scaled in integers
      int d0[4], d1[4];
      mma_s8_16x8x16(d0, lo.lo, hi.lo, bf[0]);
      mma_s8_16x8x16(d1, lo.hi, hi.hi, bf[1]);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        acc[c] += decode::scaled_half_dots<F>(d0[c], d1[c], lo, dx[c], s0[c], s1[c]);
        acc[2 + c] += decode::scaled_half_dots<F>(d0[2 + c], d1[2 + c], hi, dx[c], s0[c], s1[c]);
      }
    } else {
      const uint32_t af[4] = {lo.lo, hi.lo, lo.hi, hi.hi};
      int d[4];
      mma_s8_16x8x32(d, af, bf);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        acc[c] += decode::scaled_dot<F>(d[c], lo.a, lo.b, dx[c], s0[c] + s1[c]);
        acc[2 + c] += decode::scaled_dot<F>(d[2 + c], hi.a, hi.b, dx[c], s0[c] + s1[c]);
      }
    }
  }

  template <typename T, int kSplit>
  __device__ __forceinline__ void store(float (&partial)[kSplit][16][8], int warp, int lane) {
    const int g = lane / 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][g + 8 * (i / 2)][2 * t + i % 2] = acc[i];
    __syncthreads();
    for (int o = threadIdx.x; o < 16 * 8; o += kSplit * 32) {
      const int r = o / 8, col = o % 8;
      if (col >= m || n0 + r >= a.n) continue;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kSplit; ++w) sum += partial[w][r][col];
      store_output<T>(a, (z * a.m + col) * a.n + n0 + r, sum);
    }
  }
};

template <class F, typename T, int kSplit>
__global__ void __launch_bounds__(kSplit * 32) decode_fragment_kernel(QuantizedMatmulArgs a) {
  __shared__ float partial[kSplit][16][8];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  FragmentDot<F, GlobalBlockX> dot(a, lane, static_cast<int64_t>(blockIdx.x) * 16);
  const uint8_t* row_lo = weight_row(a, dot.z, dot.n0 + g);
  const uint8_t* row_hi = weight_row(a, dot.z, dot.n0 + g + 8);
  const int xblocks = static_cast<int>(a.k / 32);
  const typename F::Context ctx;
#pragma unroll 4
  for (int xb = warp; xb < xblocks; xb += kSplit) {
    decode::Frag lo, hi;  // rows g and g + 8
    F::fragment(ctx, row_lo, xb, t, lo);
    F::fragment(ctx, row_hi, xb, t, hi);
    dot.add(lo, hi, xb);
  }
  dot.template store<T, kSplit>(partial, warp, lane);
}

// The tensor-core decode with the weight staged: where the fragment kernel's lanes each read a word of 8 rows
// per load (8 L1 wavefronts for 128 bytes), here each warp copies its chunks of the 16 rows (kChunk x-blocks
// of whole blocks, a multiple of 16 bytes) into shared memory with 16-byte cp.async copies, kStages chunks in
// flight, and the lanes read their fragment words from there (the row stride an odd number of 16-byte words, so
// the 8 rows of a read fall in distinct banks). Rows must start on 16-byte boundaries and hold whole chunks.
template <class F>
struct StagedChunk {
  static constexpr int bytes_of(int xblocks) {
    return xblocks * 32 / F::kQK * static_cast<int>(sizeof(typename F::Block));
  }
  // x-blocks per chunk: 8 (one 256-element block), or 16 where only that makes whole 16-byte words (MXFP4, IQ4_XS).
  static constexpr int kXBlocks = bytes_of(8) % 16 != 0 && bytes_of(16) % 16 == 0 ? 16 : 8;
  static constexpr int kBytes = bytes_of(kXBlocks);
  // Chunks of other sizes (Q6_K's 210 bytes, Q3_K's 110, Q2_K's 84) start `lead` bytes into a 16-byte word (even:
  // blocks are), so their copies begin at that word; 4 bytes more for sh_words' read of the word after a field.
  static constexpr bool kLead = kBytes % 16 != 0;
  static constexpr int kWords = kLead ? (kBytes + 14 + 4 + 15) / 16 : kBytes / 16;  // staged words per row
  static constexpr int kStride = kWords % 2 == 1 ? 16 * kWords : 16 * kWords + 16;  // bytes between staged rows
  static_assert(kXBlocks * 32 % F::kQK == 0, "chunks of whole blocks");
  // Chunk c's bytes in the stage of a row: lead = (c kBytes) % 16 bytes after the start.
  static __device__ __forceinline__ int first_word(int c) { return c * kBytes / 16; }
  static __device__ __forceinline__ int words(int c) { return (c * kBytes % 16 + kBytes + 15) / 16; }
};
// Warps per 16 rows and chunks in flight per warp. H100 (same measurement as fragment_min_m), m=8, 14336x4096 /
// 4096x14336, warps x stages 4x2 / 4x3 / 8x2 / 8x3 / 16x2: Q4_0 24.8 / 27.0 / 25.7 / 26.0 / 25.6 and 52.4 / 57.8 /
// 30.8 / 31.0 / 24.0 us, Q4_K 34.5 / 34.4 / 28.0 / 28.6 / 28.9 and 48.9 / 48.5 / 33.0 / 33.9 / 28.2, Q8_0 50.0 /
// 39.2 / 39.3 / 40.7 / 45.1 and 78.7 / 54.8 / 37.7 / 37.9 / 43.2: a weight of few rows (a grid of n / 16 blocks)
// needs more warps per block to keep enough copies in flight; a third stage never beat 8 warps with two.
constexpr int kStagedStages = 2;
// The per-16 formats take 8 warps on few rows too (Q3_K 4096x14336 m=8: 29.3 us against 32.5 with 16). Measured
// again once the copies stopped dividing (b06ffca; bench/results/h100-2026-11-26k-staged-warps.json, a tuning
// build, 8 / 16 / 4 warps in one run, m=5 and 8): on many rows Q4_0 takes 4 warps (29.5 / 26.1 / 25.5 and 29.4 /
// 26.5 / 25.9 us; the others within 4% or slower with 4), on few rows Q2_K takes 16 (38.6 / 27.6 and 38.5 / 28.2;
// Q3_K and Q6_K no faster with 16: 30.0 / 32.5, 42.6 / 42.1).
template <class F>
constexpr int staged_split(bool few_rows) {
  if constexpr (std::is_same_v<F, decode::FmtQ2_K>) return few_rows ? 16 : 8;
  if constexpr (std::is_same_v<F, decode::FmtQ4_0>) return few_rows ? 16 : 4;
  return few_rows && !std::is_same_v<F, decode::FmtQ8_0> && !F::kPerHalf ? 16 : 8;
}
// Whether the staged kernel can take this weight: rows on 16-byte boundaries (so every row's chunk c starts as
// far into its 16-byte word), in whole chunks.
template <class F>
bool staged_fits(const QuantizedMatmulArgs& a) {
  return rows_aligned(a, 16) && a.k / 32 % StagedChunk<F>::kXBlocks == 0;
}

// kSharedX: x's step 0 inside the kernel. The grid is at most a few blocks per multiprocessor (set_staged_step),
// each quantizing x into its shared memory (as the fused kernel does, ordered by x-block) after asking for its
// first chunks, then taking groups of 16 rows in turn; a warp's copies run on from one group into the next.
// Without it, a block per group, as before: a version with the group loop for both did the same work, but its
// 16-warp Q4_K kernel took 84 registers instead of 64 (ptxas -v), one block per multiprocessor instead of two, and
// Q4_K on 4096x14336 m=3..8 34.2-35.9 us against 27.6-28.1 with this one (h100-2026-11-26n, -n2- against -o-).
template <class F, typename T, int kSplit, int kStages, bool kSharedX>
__global__ void __launch_bounds__(kSplit * 32) decode_staged_fragment_kernel(QuantizedMatmulArgs a) {
  using Chunk = StagedChunk<F>;
  constexpr int kWords = Chunk::kWords;  // per row and chunk, at most
  constexpr int kStageBytes = 16 * Chunk::kStride;
  __shared__ float partial[kSplit][16][8];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  uint8_t* stages = dynamic_shared_memory<uint8_t>() + warp * kStages * kStageBytes;
  const int64_t z = blockIdx.y;
  const int chunks = static_cast<int>(a.k / 32) / Chunk::kXBlocks;
  // The 16 consecutive rows from n0: row n0 + r at rows + r * row_bytes, up to the last row (read again past it).
  auto last_row = [&](int64_t n0) { return a.n - n0 < 16 ? static_cast<int>(a.n - n0) - 1 : 15; };
  // Chunk c of those rows into stage s (its 16-byte words, Chunk::words of them).
  auto copy_chunk = [&](const uint8_t* rows, int last, int c, int s) {
    uint8_t* dst = stages + s * kStageBytes;
    const int words = Chunk::words(c);
    const uint8_t* src = rows + 16 * static_cast<int64_t>(Chunk::first_word(c));
    for (int i = lane; i < 16 * kWords; i += 32) {
      const int r = i / kWords, u = i % kWords;
      if (!Chunk::kLead || u < words)
        copy_async_16(dst + r * Chunk::kStride + 16 * u, src + (r < last ? r : last) * a.row_bytes + 16 * u);
    }
  };
  const typename F::Context ctx;
  // The products of chunk c, staged in stage s, with x.
  auto take_chunk = [&](auto& dot, int c, int s) {
    __syncwarp();  // every lane's copies of chunk c have landed
    // Chunks of whole 16-byte words are read as rows of kXBlocks x-blocks (offsets known at compile time). Others
    // are read as the row itself: the stage as if at the address the row's byte 0 would have (16 first_word(c)
    // bytes before it, 4-byte aligned), so that the readers find x-block c kXBlocks + j where the row holds it.
    const uint8_t* stage = stages + s * kStageBytes;
    const int xb0 = c * Chunk::kXBlocks, seen0 = Chunk::kLead ? xb0 : 0;  // x-block j's index for the readers
    if constexpr (Chunk::kLead) stage -= 16 * Chunk::first_word(c);
    constexpr int kG = decode::fragment_group_of<F>();
    static_assert(Chunk::kXBlocks % kG == 0, "whole fragment groups per chunk");
#pragma unroll
    for (int j = 0; j < Chunk::kXBlocks; j += kG) {
      decode::Frag lo[kG], hi[kG];  // rows g and g + 8
      decode::load_fragments<F, kG>(ctx, stage + g * Chunk::kStride, (seen0 + j) / kG, t, lo);
      decode::load_fragments<F, kG>(ctx, stage + (g + 8) * Chunk::kStride, (seen0 + j) / kG, t, hi);
#pragma unroll
      for (int u = 0; u < kG; ++u) dot.add(lo[u], hi[u], xb0 + j + u);
    }
  };
  if constexpr (!kSharedX) {
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
    FragmentDot<F, GlobalBlockX> dot(a, lane, n0);
    const uint8_t* rows = weight_row(a, z, n0);
    const int last = last_row(n0);
    auto issue = [&](int c, int s) {  // one commit group per call (empty past the last chunk)
      if (c < chunks) copy_chunk(rows, last, c, s);
      copy_async_commit();
    };
#pragma unroll
    for (int s = 0; s + 1 < kStages; ++s) issue(warp + s * kSplit, s);
    for (int c = warp, i = 0; c < chunks; c += kSplit, ++i) {
      __syncwarp();  // every lane is done with the stage refilled next (read in the previous iteration)
      issue(c + (kStages - 1) * kSplit, (i + kStages - 1) % kStages);
      copy_async_wait<kStages - 1>();
      take_chunk(dot, c, i % kStages);
    }
    dot.template store<T, kSplit>(partial, warp, lane);
  } else {
    const int64_t groups = (a.n + 15) / 16;
    // The next chunk to copy: chunk next_c of group next_group (this warp's chunks are warp, warp + kSplit, ...
    // of each of the block's groups). One commit group per call (empty past the block's last chunk).
    int64_t next_group = blockIdx.x;
    int next_c = warp;
    auto issue = [&](int s) {
      if (next_c < chunks && next_group < groups) {
        copy_chunk(weight_row(a, z, next_group * 16), last_row(next_group * 16), next_c, s);
        next_c += kSplit;
        if (next_c >= chunks) next_c = warp, next_group += gridDim.x;
      }
      copy_async_commit();
    };
#pragma unroll
    for (int s = 0; s + 1 < kStages; ++s) issue(s);
    // x quantized behind the copies just issued
    const int xblocks = static_cast<int>(a.k / 32), m = static_cast<int>(a.m);
    SharedBlockX x;
    x.codes = reinterpret_cast<uint4*>(dynamic_shared_memory<uint8_t>() + kSplit * kStages * kStageBytes);
    x.records = reinterpret_cast<XRecord*>(x.codes + 2 * m * xblocks);
    quantize_x_to_shared(static_cast<const T*>(a.x) + z * a.m * a.k, m * xblocks,
                         [&](int i, uint4 lo, uint4 hi, XRecord r) {  // x-block i of x: row i / xblocks
                           x.put(static_cast<int64_t>(i % xblocks) * m + i / xblocks, lo, hi, r);
                         });
    __syncthreads();
    int i = 0;  // chunks taken by this warp so far: chunk i is in stage i % kStages
    for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
      FragmentDot<F, SharedBlockX> dot(a, lane, group * 16, x);
      for (int c = warp; c < chunks; c += kSplit, ++i) {
        __syncwarp();  // every lane is done with the stage refilled next (read in the previous iteration)
        issue((i + kStages - 1) % kStages);
        copy_async_wait<kStages - 1>();
        take_chunk(dot, c, i % kStages);
      }
      dot.template store<T, kSplit>(partial, warp, lane);
      __syncthreads();  // every warp has read `partial` before the next group writes it
    }
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
