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
#include <type_traits>
#if defined(GGML_EXT_TUNING)
#include <cstdlib>
#include <cstring>
#endif

#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ step 0

constexpr int kQuantizeThreads = 256;  // 8 threads per 32-element x-block, 4 elements each

// The workspace: codes (rows * k bytes), then one record per x-block.
struct XRecord {
  float d;
  int sums;  // low 16 bits: sum of the codes of elements 0..15, high 16 bits: of 16..31 (each |sum| <= 2032)
};
inline int64_t x_rows(const QuantizedMatmulArgs& a) { return a.batches * a.m; }
__host__ __device__ inline int64_t records_offset(const QuantizedMatmulArgs& a) {
  return (a.batches * a.m * a.k + 15) / 16 * 16;
}

__device__ __forceinline__ float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }  // NaN wins

// An x-block's scale from its largest magnitude, and the factor that turns its elements into codes (0 where the
// scale is 0, NaN or infinite: the codes are 0 and the products keep the scale's NaN or infinity).
struct XScale {
  float d, inv;
  __device__ explicit XScale(float amax) : d(amax / 127.0f), inv(d > 0.0f && d <= 3.402823466e38f ? 1.0f / d : 0.0f) {}
  // Four elements' codes (v * inv to the nearest integer, ties to even, |q| <= 127: as the CPU kernel and ggml's
  // x86 quantizer round) as one word, their sum added to `sum`.
  __device__ __forceinline__ uint32_t pack(const float* v, int& sum) const {
    if (inv == 0.0f) return 0u;  // also where an element is NaN or infinite (then so is amax): v * 0 is no code
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = nearest_int(__fmul_rn(v[j], inv));
      sum += q;
      packed |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * j);
    }
    return packed;
  }
  // Finite r (|r| < 2^22) to the nearest integer, ties to even, in one full-rate add: roundf and the float-to-int
  // conversion it replaced run at a quarter of the rate or less, and the fused kernel, which quantizes x in every
  // block, spent 2.5-4 us of an H100's 17-30 us on x (timed with and without quantizing it,
  // bench/results/h100-2026-11-26v-fused-x-cost.json). Floats in [2^23, 2^24) are the integers, so r + 1.5 * 2^23
  // is rounded, and its bits less those of 1.5 * 2^23 are the result.
  static __device__ __forceinline__ int nearest_int(float r) {
    return __float_as_int(__fadd_rn(r, 12582912.0f)) - 0x4B400000;
  }
};

// Four elements of x as floats: one load where x's rows are aligned to them (`vector`), else one at a time.
template <typename T>
__device__ __forceinline__ void load_x4(const T* src, bool vector, float (&v)[4]) {
  if (vector) {
    load(src, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = to_float(src[j]);
}

// kByBlock: the codes and records of batch z ordered by x-block, then row of x (for decode_fragment_kernel, whose
// lanes read one x-block of every row of x at once); else by row of x, then x-block (the dp4a kernels, whose
// lanes read consecutive x-blocks of one row).
template <typename T, bool kByBlock>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_x_kernel(QuantizedMatmulArgs a) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x;
  const int64_t xb = t / 8, blocks = a.batches * a.m * (a.k / 32);
  const int part = static_cast<int>(t % 8);
  const bool valid = xb < blocks;  // no early exit: the 8 threads of an x-block shuffle together
  // Rows of x are contiguous and k % 32 == 0: x-block xb is elements [32 xb, 32 xb + 32) of x.
  const T* src = static_cast<const T*>(a.x) + (valid ? xb : 0) * 32 + part * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (valid) load_x4(src, aligned(a.x, 4 * sizeof(T)), v);
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = nan_max(amax, fabsf(v[j]));
#pragma unroll
  for (int offset = 1; offset < 8; offset <<= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const XScale scale(amax);
  int sum = 0;
  const uint32_t packed = scale.pack(v, sum);
  // Code sums of the halves (parts 0..3 and 4..7): exact in float.
  float half = static_cast<float>(sum);
  half += __shfl_xor_sync(0xffffffffu, half, 1);
  half += __shfl_xor_sync(0xffffffffu, half, 2);
  const float other = __shfl_xor_sync(0xffffffffu, half, 4);
  if (!valid) return;
  int64_t slot = xb;  // where x-block xb (row-major over batches, rows, x-blocks) is stored
  if constexpr (kByBlock) {
    const int64_t per_row = a.k / 32, per_batch = a.m * per_row;
    const int64_t z = xb / per_batch, i = xb % per_batch / per_row, j = xb % per_row;
    slot = z * per_batch + j * a.m + i;
  }
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  reinterpret_cast<uint32_t*>(ws + slot * 32)[part] = packed;
  if (part == 0) {
    const int s0 = static_cast<int>(half), s1 = static_cast<int>(other);
    reinterpret_cast<XRecord*>(ws + records_offset(a))[slot] = XRecord{scale.d, (s0 & 0xFFFF) | (s1 << 16)};
  }
}

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

// An XRecord read as an int2: x-block's scale and the code sums of its halves.
__device__ __forceinline__ void unpack_record(int2 rec, float& d, int& s0, int& s1) {
  d = __int_as_float(rec.x);
  s0 = static_cast<int>(static_cast<int16_t>(rec.y & 0xFFFF));
  s1 = rec.y >> 16;
}

__device__ __forceinline__ decode::XBlock load_x(const uint8_t* codes, const XRecord* records, int64_t xb) {
  decode::XBlock x;
  const uint4* c = reinterpret_cast<const uint4*>(codes + xb * 32);
  x.lo = __ldg(c);
  x.hi = __ldg(c + 1);
  unpack_record(__ldg(reinterpret_cast<const int2*>(records + xb)), x.d, x.s0, x.s1);
  return x;
}

// Weight row n of batch z, clamped to the last row (rows past n are read and nothing is stored for them).
__device__ __forceinline__ const uint8_t* weight_row(const QuantizedMatmulArgs& a, int64_t z, int64_t n) {
  return static_cast<const uint8_t*>(a.w) + (weight_batch(a, z) * a.n + (n < a.n ? n : a.n - 1)) * a.row_bytes;
}
// x's codes and records (step 0's workspace) of batch z.
__device__ __forceinline__ const uint8_t* x_codes(const QuantizedMatmulArgs& a, int64_t z) {
  return static_cast<const uint8_t*>(a.workspace) + z * a.m * a.k;
}
__device__ __forceinline__ const XRecord* x_records(const QuantizedMatmulArgs& a, int64_t z) {
  return reinterpret_cast<const XRecord*>(static_cast<const uint8_t*>(a.workspace) + records_offset(a)) +
         z * a.m * (a.k / 32);
}

// Where the dp4a kernels read x's quantized blocks: step 0's workspace (row i of x's codes and records) ...
struct GlobalX {
  const uint8_t* codes;
  const XRecord* records;
  int64_t k;
  __device__ __forceinline__ decode::XBlock get(int i, int64_t xb) const {
    return load_x(codes + i * k, records + i * (k / 32), xb);
  }
};
// ... or the fused kernel's shared memory (rows of x one after another, `xblocks` x-blocks each): the codes of
// elements 0..15 of every x-block in one plane and of 16..31 in another (lanes reading consecutive x-blocks hit
// distinct banks), then the records.
struct SharedX {
  const uint4* lo;
  const uint4* hi;
  const XRecord* records;
  int xblocks;
  __device__ __forceinline__ decode::XBlock get(int i, int64_t xb) const {
    const int64_t at = static_cast<int64_t>(i) * xblocks + xb;
    decode::XBlock x;
    x.lo = lo[at];
    x.hi = hi[at];
    unpack_record(reinterpret_cast<const int2*>(records)[at], x.d, x.s0, x.s1);
    return x;
  }
};

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

  __device__ WarpDot(const QuantizedMatmulArgs& args, int64_t first_row, const X& source)
      : a(args), n0(first_row), z(blockIdx.y), xblocks(args.k / 32), m(static_cast<int>(args.m)), x(source) {
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = weight_row(a, z, n0 + r);
  }
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

template <class F, int MB, typename T>
__global__ void __launch_bounds__(warps_per_block<MB>() * 32) decode_dot_kernel(QuantizedMatmulArgs a) {
  constexpr int R = rows_per_warp<MB>(), kWarps = warps_per_block<MB>();
  using S = Seg<F, R>;
  __shared__ uint4 stage_all[kWarps][R][S::kWords];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (n0 >= a.n) return;  // the whole warp: only __syncwarp below
  WarpDot<F, MB> dot(a, n0);
  // The widest word that divides the weight's base address and row length (segments start 16-byte multiples in).
  const int width = copy_width(reinterpret_cast<uintptr_t>(a.w), static_cast<uint64_t>(a.row_bytes));
  uint4 (*stage)[S::kWords] = stage_all[warp];
  const uint8_t* staged[R];
#pragma unroll
  for (int r = 0; r < R; ++r) staged[r] = reinterpret_cast<const uint8_t*>(stage[r]);

  for (int64_t xb0 = 0; xb0 < dot.xblocks; xb0 += S::kXBlocks) {
    const int64_t offset = xb0 * 32 / F::kQK * static_cast<int64_t>(sizeof(typename F::Block));
    const int64_t left = a.row_bytes - offset;
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
  dot.template store<T>(lane);
}

// Up to 4 rows of x in one kernel (decode_fused_kernel; rows on 4-byte boundaries, m * k <= kFusedMaxK): no step
// 0. Each block quantizes x into its shared memory (SharedX; what quantize_x_kernel computes, a thread per x-block),
// then its warps take weight rows (or pairs of rows: fused_pair_max_m) in turn, as decode_direct_kernel's warps do
// with one row of x. The grid is at most kFusedBlocksPerSm blocks per multiprocessor, so x is quantized a few
// hundred times rather than once per 8 rows. Each warp used to ask for its first rows in L2 before quantizing;
// once x's codes took full-rate operations (XScale::nearest_int), the kernel was faster without (H100, ncu through
// MLX, m=1, tuning build, GGML_EXT_FUSED_PREFETCH=1 against none in one run, h100-2026-11-26w-fused-prefetch.json:
// 14336x4096 Q4_0 18.1 / 17.3 us, Q4_K 19.3 / 18.0, Q8_0 28.6 / 27.6, Q5_K 21.7 / 20.5, Q4_1 19.0 / 18.2; 4096x14336
// Q5_K 25.3 / 22.9, Q4_0 22.1 / 21.7).
// H100 (bench/cuda_kernel_driver.cu, both steps against this one, bench/results/h100-2026-11-25v-*.json),
// 14336x4096, m=1: Q4_0 18.6 us (19.5), Q4_K 17.5 (22.1), Q5_K 20.2 (25.4), Q8_0 27.3 (28.2), IQ4_XS 21.8 (22.7),
// Q4_1, Q3_K, Q2_K within 3%; Q6_K 27.9 (26.6), so it keeps both steps. On 4096x14336 (one wave of blocks, each
// quantizing all 14336 elements before its first product) it was slower for every format (Q4_0 21.9 against
// 18.0, IQ4_XS 28.2 / 20.8): weights of at most kFewRows rows keep both steps, but where measured otherwise through
// MLX (fused_few_rows_max_m). 2 blocks per multiprocessor were slower (Q4_0 22.8 us), 8 no faster (18.8). More rows
// of x where fused_max_m allows (below).
constexpr int kFusedWarps = 8, kFusedBlocksPerSm = 4;
constexpr int64_t kFusedMaxK = 32768;  // elements of x (m * k): shared memory, 40 bytes per x-block, 40 KB at most
// The shared memory of x's rows quantized inside a kernel (the fused kernel's planes, the staged kernel's slots):
// 32 code bytes and a record per x-block.
inline unsigned shared_x_bytes(const QuantizedMatmulArgs& a) {
  return static_cast<unsigned>(a.m * a.k / 32 * (32 + sizeof(XRecord)));
}

// Quantizes the `xblocks` x-blocks of x (contiguous) in shared memory, a thread per x-block; store(xb, lo, hi,
// record) puts x-block xb's codes of elements 0..15 and 16..31 and its record where the kernel reads them.
template <typename T, int kUnroll = 2, class Store>
__device__ __forceinline__ void quantize_x_to_shared(const T* x, int xblocks, Store&& store) {
  const bool vector = aligned(x, 4 * sizeof(T));
#pragma unroll kUnroll
  for (int xb = threadIdx.x; xb < xblocks; xb += blockDim.x) {
    const T* src = x + 32 * static_cast<int64_t>(xb);
    float v[8][4];
#pragma unroll
    for (int w = 0; w < 8; ++w) load_x4(src + 4 * w, vector, v[w]);
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w)
#pragma unroll
      for (int e = 0; e < 4; ++e) amax = nan_max(amax, fabsf(v[w][e]));
    const XScale scale(amax);
    uint32_t words[8];
    int sums[2] = {0, 0};
#pragma unroll
    for (int w = 0; w < 8; ++w) words[w] = scale.pack(v[w], sums[w / 4]);
    store(xb, uint4{words[0], words[1], words[2], words[3]}, uint4{words[4], words[5], words[6], words[7]},
          XRecord{scale.d, (sums[0] & 0xFFFF) | (sums[1] << 16)});
  }
}

#if defined(GGML_EXT_TUNING)
// Tuning builds: GGML_EXT_FUSED_PREFETCH=1 (set_fused_step copies it here) has each warp of the fused kernel ask for
// its first weight rows in L2 before x is quantized, as it did before x's codes took full-rate operations.
__device__ int g_fused_prefetch;
__device__ __forceinline__ bool fused_prefetch() { return g_fused_prefetch != 0; }
#else
__device__ __forceinline__ constexpr bool fused_prefetch() { return false; }
#endif

// The fused kernels' x: the batch's rows quantized into the shared-memory planes of SharedX, then a barrier.
template <typename T, bool kSkipX, int kXUnroll>
__device__ __forceinline__ SharedX quantize_x_to_planes(const QuantizedMatmulArgs& a, uint4* planes, int64_t z,
                                                        int xblocks) {
  const int all = static_cast<int>(a.m) * xblocks;  // x-blocks of the batch's rows of x, contiguous in x
  const SharedX x{planes, planes + all, reinterpret_cast<const XRecord*>(planes + 2 * all), xblocks};
  if constexpr (!kSkipX) {
    quantize_x_to_shared<T, kXUnroll>(static_cast<const T*>(a.x) + z * a.m * a.k, all,
                                      [&](int xb, uint4 lo, uint4 hi, XRecord r) {
                                        planes[xb] = lo;
                                        planes[all + xb] = hi;
                                        reinterpret_cast<XRecord*>(planes + 2 * all)[xb] = r;
                                      });
  }
  __syncthreads();
  return x;
}

// kRows weight rows per warp at a time (fused_rows). kSkipX: tuning builds' timing of the products alone (x is not
// quantized; the results are meaningless). kXUnroll: x-blocks each thread quantizes at once.
template <class F, int MB, typename T, int kRows, bool kSkipX = false, int kXUnroll = 2>
__global__ void __launch_bounds__(kFusedWarps * 32) decode_fused_kernel(QuantizedMatmulArgs a) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, xblocks = static_cast<int>(a.k / 32);
  const int64_t z = blockIdx.y, warps = static_cast<int64_t>(gridDim.x) * kFusedWarps;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kFusedWarps + warp) * kRows;
  if (fused_prefetch() && first < a.n)
    prefetch_l2_warp(weight_row(a, z, first), a.row_bytes * (a.n - first < kRows ? a.n - first : kRows), lane);
  uint4* planes = dynamic_shared_memory<uint4>();
  const SharedX x = quantize_x_to_planes<T, kSkipX, kXUnroll>(a, planes, z, xblocks);
  constexpr int kG = lane_group<F, kRows>(), kUnroll = 4 / kG;  // four x-blocks' loads in flight per lane
  const int groups = xblocks / kG;
  for (int64_t n = first; n < a.n; n += warps * kRows) {
    WarpDot<F, MB, kRows, SharedX> dot(a, n, x);
#pragma unroll kUnroll
    for (int p = lane; p < groups; p += 32) dot.template add<kG>(dot.rows, p, int64_t{p} * kG);
    dot.template store<T>(lane);
  }
}

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

// ------------------------------------------------------------------------------------------------ float

constexpr int kFloatRows = 8;  // warps per block, one weight row each

// Float weights (and any weight whose rows do not split into 32-element x-blocks): a warp per row, each lane
// 16-element chunks decoded to float and multiplied with x in float32.
template <typename Weights, typename T>
__global__ void __launch_bounds__(kFloatRows * 32) decode_float_kernel(QuantizedMatmulArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kFloatRows + threadIdx.x / 32;
  const int64_t z = blockIdx.y;
  if (n >= a.n) return;  // the whole warp
  const uint8_t* row = static_cast<const uint8_t*>(a.w) + (weight_batch(a, z) * a.n + n) * a.row_bytes;
  const T* x = static_cast<const T*>(a.x) + z * a.m * a.k;
  // Whole 16-element chunks on 16-byte boundaries: every x row starts on one when k % 16 == 0.
  const bool vector = a.k % 16 == 0 && aligned(a.x, 16);
  float acc[kDecodeMaxM] = {};
  const int64_t chunks = (a.k + 15) / 16;
  for (int64_t c = lane; c < chunks; c += 32) {
    float w[16];
    Weights::row_chunk(row, c, a.k, w);
#pragma unroll
    for (int m = 0; m < kDecodeMaxM; ++m) {
      if (m < a.m) {
        float xv[16];
        load_x_chunk(x + m * a.k, c, a.k, vector, xv);
        float chunk_sum = 0.0f;  // summed apart, then added: shorter float32 rounding chains
#pragma unroll
        for (int j = 0; j < 16; ++j) chunk_sum += w[j] * xv[j];
        acc[m] += chunk_sum;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kDecodeMaxM; ++m) {
    if (m < a.m) {
      const float sum = warp_sum(acc[m]);
      if (lane == 0) store_output<T>(a, (z * a.m + m) * a.n + n, sum);
    }
  }
}

// ------------------------------------------------------------------------------------------------ plans

template <typename T, typename Weights>
QuantizedMatmulPlan float_plan(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  l.kernel = reinterpret_cast<const void*>(&decode_float_kernel<Weights, T>);
  l.grid = dim3(ceil_div(a.n, kFloatRows), static_cast<unsigned>(a.batches));
  l.block = dim3(kFloatRows * 32);
  return p;
}

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

// Tuning builds: whether the switch `name` (an environment variable) is 1; never in the package's builds.
inline bool tuning_switch(const char* name) {
#if defined(GGML_EXT_TUNING)
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) == 1;
#else
  (void)name;
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
  if constexpr (MB > 1) {
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
// 39.8-48.8 against 32.6-36.7). Q6_K never (27.9 against 26.6 us at m=1; not measured at m=2). Where the staged
// kernel with x in shared memory takes a weight (shared_x_route, set_shared_x_step: rows on 16-byte boundaries),
// it comes first: Q4_0 keeps the fused kernel at m = 3, 4 only for rows on 4-byte boundaries but not on 16.
template <class F>
constexpr int fused_max_m() {
  if constexpr (std::is_same_v<F, decode::FmtQ6_K>) return 0;
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

// The rows of x for which the fused kernel also takes weights of few rows (0: none). H100, ncu through MLX,
// 4096x14336, m=1, GGML_EXT_FEW_ROWS_ONE_KERNEL=1 against the default (both steps) in one run
// (bench/results/h100-2026-11-26q-kernel-times.json): Q4_0 21.4 -> 20.4 us, Q5_K 26.2 -> 24.1; slower for the others
// (Q4_1 20.0 -> 24.6, Q4_K 19.9 -> 21.0, Q8_0 30.5 -> 33.6, IQ4_NL 21.7 -> 28.4; every format at m=2). Checked on
// more shapes against GGML_EXT_STAGED=twostep in one run (h100-2026-11-26r-few-rows.json), 4096x14336 / 4096x4096 /
// 1024x4096: Q4_0 21.8 / 11.6 / 8.7 -> 20.3 / 11.0 / 6.9 us, Q5_K 26.6 / 13.4 / 8.3 -> 24.5 / 11.4 / 6.7.
template <class F>
constexpr int fused_few_rows_max_m() {
  return std::is_same_v<F, decode::FmtQ4_0> || std::is_same_v<F, decode::FmtQ5_K> ? 1 : 0;
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
  // Tuning builds: GGML_EXT_STAGED=fused takes the one-row kernel where fused_max_m is 0 (Q6_K).
  const bool forced = a.m == 1 && tuning_variant("fused");
  if ((a.m > fused_max_m<F>() && !forced) || !rows_aligned(a, 4) || a.m * a.k > kFusedMaxK ||
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

template <typename T, class F>
QuantizedMatmulPlan dot_plan(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  if (set_shared_x_step<F, T>(p.steps[0], a) || set_fused_step<F, T>(p.steps[0], a)) return p;
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

// The integer-dot format of a ggml type id (nullptr_t: none).
template <typename Make>
QuantizedMatmulPlan with_format(int type, Make&& make) {
  switch (type) {
#define GGML_EXT_FORMAT_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return make(decode::Fmt##NAME{});
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_FORMAT_CASE)
#undef GGML_EXT_FORMAT_CASE
    default: return {};
  }
}

}  // namespace

QuantizedMatmulPlan decode_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  if (args.m < 1 || args.m > kDecodeMaxM) return {};
  // Quantized weights whose rows split into whole 32-element x-blocks: the integer dot products.
  if (args.k % 32 == 0 && args.k > 0 && args.n > 0) {
    GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, {
      const QuantizedMatmulPlan p = with_format(ggml_type, [&](auto format) {
        return dot_plan<typename Storage<kType>::type, decltype(format)>(args);
      });
      if (p.steps[0].kernel) return p;
      break;
    });
  }
  // Float weights: the float kernel (quantized ones always take the path above: k is a multiple of 32).
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, {
    using T = typename Storage<kType>::type;
    switch (ggml_type) {
      case GGML_EXT_TYPE_F32: return float_plan<T, Weights_f32>(args);
      case GGML_EXT_TYPE_F16: return float_plan<T, Weights_f16>(args);
      case GGML_EXT_TYPE_BF16: return float_plan<T, Weights_bf16>(args);
      default: return {};
    }
  });
  return {};
}

}  // namespace ggml_ext::cuda
