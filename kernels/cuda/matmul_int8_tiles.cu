// Int8 tiles: the forward product of m > kDecodeMaxM rows of x (prefill) on the int8 tensor cores, for the formats
// with tensor-core fragments (decode_formats.cuh: every layout type). Two steps:
//   0. quantize_x_kernel<T, false> (matmul_decode_operands.cuh): each 32 elements of every row of x become 32 int8
//      codes and a record {scale d, the code sums of both halves}, once, into the workspace (rows of x row-major).
//   1. int8_tiles_kernel: a block of 8 warps takes 128 weight rows x 64 rows of x. Per stage of 8 x-blocks (256
//      elements: one K-quant block), the block copies the 128 rows' raw bytes of the stage and x's 64 x 8 code
//      blocks into shared memory with cp.async (two stages: the next one's copies fly while the warps multiply the
//      current one), and turns x's records into floats {d, d * sums} there. Warp w owns weight rows 16w..16w+15:
//      per x-block each lane decodes its A-fragment words of rows g and g + 8 once (the format's fragment reader,
//      on the staged bytes, codes re-centred to signed int8 so that no zero-point correction is left) and uses them
//      for all 8 n8 tiles of x's 64 rows: an m16n8k32 product (two m16n8k16, one per half, for the formats with a
//      scale per 16) whose int32 sums are scaled in float32 per x-block (weight scale x x's scale, plus the min
//      term b * d * sums of the formats with one). Outputs in x's type (or float32 where out_f32).
// Why this shape (reasoned, not measured; bench/cuda_kernel_driver.cu times it against the WMMA tiles): the work
// per x-block of a block is 64 int8 products and 8192 scaled sums; the scaling (about 4 float/int operations per
// sum) costs more than the products, so each A fragment is decoded once per block (one m16 tile per warp, all of
// x's columns) rather than once per warp pair, and 128 x 64 outputs per block keep the L2 bytes per product low
// (about 2.3 KB of Q4_0 weight and 2.5 KB of x per x-block). Shared memory, two stages: 78 KB (Q4_0, Q4_K) to
// 111 KB (Q8_0), so two blocks (16 warps) per multiprocessor on an H100 (__launch_bounds__ caps registers at 128).
// The grid walks x's tiles fastest (blockIdx.x), so the blocks sharing a weight tile run together and read it
// from L2.
// Error: x's codes are the decode route's (ggml's Q8_0 with a float32 scale), so the result is as accurate as the
// decode kernels' and ggml's own GPU scheme (x as 8-bit codes per 32 elements); the sums are float32. Host
// emulation, NMSE against float64: 2.5e-5 to 2.9e-5 on normal x (Q4_0, Q8_0, Q4_K, Q6_K), 5.7e-5 to 1.0e-4 with
// outliers (every format), where ggml's CPU scheme gives 7.3e-5 (Q8_0) to 4.6e-4 (Q6_K).
// Registers: 120-128 per thread at two blocks per multiprocessor; ptxas (sm_90) spills 4-28 bytes in the 32-element
// formats and 120-148 in Q3_K / Q6_K, whose fragment groups hold 4 x-blocks of both rows at once; with one block
// per multiprocessor for those (__launch_bounds__(kI8Threads, F::kPerHalf ? 1 : 2)) they take 179 / 186 registers
// and spill nothing. Which is faster is not measured; reading their groups twice, 2 x-blocks used per read, spilled
// more (164-184 bytes: the compiler keeps the first read's words).
// Rows must start on 4-byte boundaries (16-byte rows take 16-byte copies, others 4-byte ones) and k % 32 == 0:
// quantized_matmul.cu sends the rest, the transposed product and exact float x to the WMMA tiles (matmul_tiles.cu).
#include <numeric>
#include <type_traits>

#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/decode_formats_iq.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_decode_operands.cuh"
#include "kernels/cuda/matmul_decode_tensor_cores.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kI8Rows = 128;                  // weight rows per block: one m16 tile per warp
constexpr int kI8Cols = 64;                   // rows of x per block: 8 n8 tiles, every warp takes all of them
constexpr int kI8Warps = kI8Rows / 16;
constexpr int kI8Threads = 32 * kI8Warps;
constexpr int kI8NTiles = kI8Cols / 8;
constexpr int kI8StageXBlocks = 8;            // x-blocks per stage: 256 elements, one K-quant block
constexpr int kI8XRecords = kI8StageXBlocks * kI8Cols;  // x's records per stage
static_assert(kI8XRecords % kI8Threads == 0, "whole records per thread");

// A stage's bytes of a weight row: 8 x-blocks of whole blocks. With the row on 16-byte (else 4-byte) boundaries, the
// stage copies the words that hold them, from the word where stage c starts (c kBytes may fall inside it: Q6_K's
// 210 bytes, Q3_K's 110, Q2_K's 84, IQ4_XS's 136, MXFP4's 136); rows kStride bytes apart in shared memory, an odd
// number of 16-byte words, so that the 8 rows of a fragment read fall in distinct banks.
template <class F>
struct I8Stage {
  static constexpr int kBytes = kI8StageXBlocks * 32 / F::kQK * static_cast<int>(sizeof(typename F::Block));
  static constexpr int lead_max(int word) { return kBytes % word == 0 ? 0 : word - std::gcd(kBytes, word); }
  static constexpr int kWords16 = (lead_max(16) + kBytes + 15) / 16;  // 16-byte words per row, at most
  static constexpr int kWords4 = (lead_max(4) + kBytes + 3) / 4;      // 4-byte words per row, at most
  static constexpr int kStride = 16 * (kWords16 | 1);
  static_assert(4 * kWords4 <= kStride, "either copy fits a row's stride");
  static constexpr int kWeightBytes = kI8Rows * kStride;
};

// x's record of an x-block as the scaling reads it: its scale, and the scale times the code sums the format's min
// term takes (the whole x-block's, or each half's for Q2_K's mins per 16).
struct XColSum {
  float dx, dxs;
};
struct XColHalves {
  float dx, dxs0, dxs1, unused;
};
template <class F>
using XCol = std::conditional_t<F::kOffset == 2, XColHalves, XColSum>;

// Shared memory of one stage: the weight rows, x's codes (x-block-major, 32 bytes per row of x, the halves of every
// other 4 rows swapped so that a B-fragment read of 8 rows hits distinct banks), x's records.
template <class F>
struct I8Layout {
  static constexpr int kXCodes = kI8XRecords * 32;
  static constexpr int kStageBytes = I8Stage<F>::kWeightBytes + kXCodes + kI8XRecords * sizeof(XCol<F>);
  static constexpr int kBytes = 2 * kStageBytes;
  static __device__ __forceinline__ uint8_t* weight(uint8_t* base, int s) { return base + s * kStageBytes; }
  static __device__ __forceinline__ uint32_t* codes(uint8_t* base, int s) {
    return reinterpret_cast<uint32_t*>(weight(base, s) + I8Stage<F>::kWeightBytes);
  }
  static __device__ __forceinline__ XCol<F>* records(uint8_t* base, int s) {
    return reinterpret_cast<XCol<F>*>(weight(base, s) + I8Stage<F>::kWeightBytes + kXCodes);
  }
  static __device__ __forceinline__ int half_at(int col, int h) { return h ^ ((col >> 2) & 1); }
};

// A 4-byte cp.async (rows on 4-byte but not 16-byte boundaries), as common.cuh's 16-byte one.
__device__ __forceinline__ void copy_async_4(void* shared_dst, const void* global_src) {
#if defined(GGML_EXT_CUDA_EMULATION)
  ggml_ext_emulated_copy_async(shared_dst, global_src, 4);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(global_src) : "memory");
#endif
}

// Four codes in [0, 128) less the format's zero point, as signed bytes (no borrow crosses a byte: each is at least
// 128 - kZero after the or), so the products need no correction by x's code sums.
template <class F>
__device__ __forceinline__ uint32_t centered(uint32_t codes) {
  if constexpr (F::kZero == 0) {
    return codes;
  } else {
    return ((codes | 0x80808080u) - 0x01010101u * static_cast<uint32_t>(F::kZero)) ^ 0x80808080u;
  }
}

// An integer sum as a float, exactly. Where |v| < 2^22 (every format but Q6_K, whose scaled halves reach 1.7e7):
// the float 1.5 * 2^23 + v from its bits, less 1.5 * 2^23, an integer add and a float add at full rate, where the
// conversion instruction runs at a quarter of it and there are 32 of them per x-block and lane.
template <class F>
__device__ __forceinline__ float exact_float(int v) {
  if constexpr (std::is_same_v<F, decode::FmtQ6_K>) {
    return static_cast<float>(v);
  } else {
    return __fsub_rn(__int_as_float(v + 0x4B400000), 12582912.0f);
  }
}

// A warp's 16 weight rows x 64 rows of x: lane (g, t) holds rows g, g + 8 x columns 2t, 2t + 1 of each n8 tile.
template <class F>
struct I8Accumulators {
  using Col = XCol<F>;
  float acc[kI8NTiles][4] = {};
  int g, t;

  // Columns 2t, 2t + 1 of n8 tile nt (adjacent records: one 16-byte load where a record is 8 bytes).
  __device__ __forceinline__ void columns(const Col* xc, int nt, Col (&c)[2]) const {
    const Col* p = xc + 8 * nt + 2 * t;
    if constexpr (sizeof(Col) == 8) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      c[0] = Col{v.x, v.y};
      c[1] = Col{v.z, v.w};
    } else {
      c[0] = p[0];
      c[1] = p[1];
    }
  }

  // One x-block: rows g (lo) and g + 8 (hi), x's codes of the x-block (32 bytes per row of x) and its records.
  __device__ __forceinline__ void add(const decode::Frag& lo, const decode::Frag& hi, const uint32_t* xq,
                                      const Col* xc, int cols) {
    const uint32_t af[4] = {centered<F>(lo.lo), centered<F>(hi.lo), centered<F>(lo.hi), centered<F>(hi.hi)};
    const float wa[2] = {lo.a, hi.a};
    const int sw = (g >> 2) & 1;  // the half swap of rows 8 nt + g (I8Layout::half_at)
#pragma unroll
    for (int nt = 0; nt < kI8NTiles; ++nt) {
      if (8 * nt >= cols) continue;  // the same for the whole block: rows of x past m
      const uint32_t* row = xq + (8 * nt + g) * 8;
      const uint32_t bf[2] = {row[4 * sw + t], row[4 * (sw ^ 1) + t]};
      Col c[2];
      columns(xc, nt, c);
      if constexpr (!F::kPerHalf) {
        const float wb[2] = {lo.b, hi.b};
        int d[4];
        mma_s8_16x8x32(d, af, bf);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = i / 2, k = i % 2;
          float v = fmaf(wa[r] * c[k].dx, exact_float<F>(d[i]), acc[nt][i]);
          if constexpr (F::kOffset == 1) v = fmaf(wb[r], c[k].dxs, v);
          acc[nt][i] = v;
        }
      } else {
        const int ia0[2] = {lo.ia0, hi.ia0}, ia1[2] = {lo.ia1, hi.ia1};
        int d0[4], d1[4];
        mma_s8_16x8x16(d0, af[0], af[1], bf[0]);
        mma_s8_16x8x16(d1, af[2], af[3], bf[1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = i / 2, k = i % 2;
          float v = fmaf(wa[r] * c[k].dx, exact_float<F>(ia0[r] * d0[i] + ia1[r] * d1[i]), acc[nt][i]);
          if constexpr (F::kOffset == 2) {  // Q2_K: b = -dmin, the mins ib per half
            const float b0 = (r ? hi.b : lo.b) * static_cast<float>(r ? hi.ib0 : lo.ib0);
            const float b1 = (r ? hi.b : lo.b) * static_cast<float>(r ? hi.ib1 : lo.ib1);
            v = fmaf(b0, c[k].dxs0, fmaf(b1, c[k].dxs1, v));
          }
          acc[nt][i] = v;
        }
      }
    }
  }
};

template <class F, typename T>
__global__ void __launch_bounds__(kI8Threads, 2) int8_tiles_kernel(QuantizedMatmulArgs a) {
  using Stage = I8Stage<F>;
  using Layout = I8Layout<F>;
  using Col = XCol<F>;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t z = blockIdx.z, m0 = static_cast<int64_t>(blockIdx.x) * kI8Cols;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kI8Rows;
  const int m = static_cast<int>(a.m), xblocks = static_cast<int>(a.k / 32);
  const int stages = (xblocks + kI8StageXBlocks - 1) / kI8StageXBlocks;
  const int cols = a.m - m0 < kI8Cols ? static_cast<int>(a.m - m0) : kI8Cols;
  const int row_bytes = static_cast<int>(a.row_bytes);
  const bool wide = aligned(a.w, 16) && row_bytes % 16 == 0;  // else 4-byte boundaries (the plan's condition)
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + weight_batch(a, z) * a.n * a.row_bytes;
  const uint8_t* x_global = x_codes(a, z);
  const XRecord* records = x_records(a, z);
  uint8_t* shared = dynamic_shared_memory<uint8_t>();
  // Rows past the weight's (x's) last are read as its last: their outputs are never stored.
  auto weight_row = [&](int r) { return w + (n0 + r < a.n ? n0 + r : a.n - 1) * a.row_bytes; };
  auto x_row = [&](int col) { return m0 + col < m ? m0 + col : m - 1; };

  // Stage c's copies into buffer s, one commit group.
  auto issue = [&](int c, int s) {
    uint8_t* ws = Layout::weight(shared, s);
    const int first = c * Stage::kBytes;
    const int bytes = row_bytes - first < Stage::kBytes ? row_bytes - first : Stage::kBytes;  // a last partial stage
    if (wide) {
      const int u0 = first / 16, units = (first % 16 + bytes + 15) / 16;
      for (int q = tid; q < kI8Rows * Stage::kWords16; q += kI8Threads) {
        const int r = q / Stage::kWords16, u = q % Stage::kWords16;
        if (u < units) copy_async_16(ws + r * Stage::kStride + 16 * u, weight_row(r) + 16 * (u0 + u));
      }
    } else {
      const int u0 = first / 4, units = (first % 4 + bytes + 3) / 4;
      for (int q = tid; q < kI8Rows * Stage::kWords4; q += kI8Threads) {
        const int r = q / Stage::kWords4, u = q % Stage::kWords4;
        if (u < units) copy_async_4(ws + r * Stage::kStride + 4 * u, weight_row(r) + 4 * (u0 + u));
      }
    }
    // x's codes: 16 threads per row of x, its 8 x-blocks' halves (256 contiguous bytes).
    uint8_t* xs = reinterpret_cast<uint8_t*>(Layout::codes(shared, s));
    for (int q = tid; q < kI8XRecords * 2; q += kI8Threads) {
      const int h = q % 2, xb = q / 2 % kI8StageXBlocks, col = q / (2 * kI8StageXBlocks);
      const int64_t block = static_cast<int64_t>(c) * kI8StageXBlocks + xb;
      if (block < xblocks)
        copy_async_16(xs + (xb * kI8Cols + col) * 32 + 16 * Layout::half_at(col, h),
                      x_global + x_row(col) * a.k + block * 32 + 16 * h);
    }
    copy_async_commit();
  };
  // x's records of stage c (read into registers while the warps multiply, stored as XCol after).
  constexpr int kMine = kI8XRecords / kI8Threads;
  auto load_records = [&](int c, int2 (&r)[kMine]) {
#pragma unroll
    for (int i = 0; i < kMine; ++i) {
      const int idx = tid + kI8Threads * i, xb = idx / kI8Cols, col = idx % kI8Cols;
      const int block = c * kI8StageXBlocks + xb;
      r[i] = block < xblocks ? __ldg(reinterpret_cast<const int2*>(records + x_row(col) * xblocks + block))
                             : int2{0, 0};
    }
  };
  auto put_records = [&](int s, const int2 (&r)[kMine]) {
    Col* xc = Layout::records(shared, s);
#pragma unroll
    for (int i = 0; i < kMine; ++i) {
      float d;
      int s0, s1;
      unpack_record(r[i], d, s0, s1);
      if constexpr (F::kOffset == 2) {
        xc[tid + kI8Threads * i] = Col{d, d * static_cast<float>(s0), d * static_cast<float>(s1), 0.0f};
      } else {
        xc[tid + kI8Threads * i] = Col{d, d * static_cast<float>(s0 + s1)};
      }
    }
  };

  I8Accumulators<F> acc;
  acc.g = lane / 4;
  acc.t = lane % 4;
  const typename F::Context ctx;
  // The products of stage c in buffer s. The readers see the stage as the row itself: its buffer as if at the
  // address the row's byte 0 would have (the bytes before the stage's first copied word), so that they find
  // x-block c * 8 + j where the row holds it.
  auto multiply = [&](int c, int s) {
    const int first = c * Stage::kBytes, rebase = first & ~(wide ? 15 : 3);
    const uint8_t* lo_row = Layout::weight(shared, s) + (16 * warp + acc.g) * Stage::kStride - rebase;
    const uint8_t* hi_row = lo_row + 8 * Stage::kStride;
    const uint32_t* xq = Layout::codes(shared, s);
    const Col* xc = Layout::records(shared, s);
    constexpr int kG = decode::fragment_group_of<F>();
    static_assert(kI8StageXBlocks % kG == 0, "whole fragment groups per stage");
#pragma unroll
    for (int j = 0; j < kI8StageXBlocks; j += kG) {
      const int block = c * kI8StageXBlocks + j;
      if (block >= xblocks) break;  // a last partial stage (32-element formats only; kG is 1 there)
      decode::Frag lo[kG], hi[kG];
      decode::load_fragments<F, kG>(ctx, lo_row, block / kG, acc.t, lo);
      decode::load_fragments<F, kG>(ctx, hi_row, block / kG, acc.t, hi);
#pragma unroll
      for (int u = 0; u < kG; ++u)
        acc.add(lo[u], hi[u], xq + (j + u) * kI8Cols * 8, xc + (j + u) * kI8Cols, cols);
    }
  };

  int2 pending[kMine];
  issue(0, 0);
  load_records(0, pending);
  put_records(0, pending);
  for (int c = 0; c < stages; ++c) {
    const int s = c & 1;
    const bool more = c + 1 < stages;
    if (more) {  // buffer s ^ 1 was last read in stage c - 1, before the barrier that ended it
      issue(c + 1, s ^ 1);
      load_records(c + 1, pending);
    } else {
      copy_async_commit();  // an empty group: the wait below still leaves one
    }
    copy_async_wait<1>();
    __syncthreads();  // every thread's copies of stage c, and its records, have landed
    multiply(c, s);
    if (more) put_records(s ^ 1, pending);
    __syncthreads();  // buffer s read by every warp before stage c + 2's copies go there
  }

#pragma unroll
  for (int nt = 0; nt < kI8NTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = n0 + 16 * warp + acc.g + 8 * (i / 2), col = m0 + 8 * nt + 2 * acc.t + i % 2;
      if (row < a.n && col < a.m) store_output<T>(a, (z * a.m + col) * a.n + row, acc.acc[nt][i]);
    }
}

template <class F, typename T>
QuantizedMatmulPlan int8_format_plan(const QuantizedMatmulArgs& a) {
  QuantizedMatmulPlan p;
  if constexpr (decode::has_fragments<F>()) {
    constexpr unsigned kShared = I8Layout<F>::kBytes;
    // A GPU that gives a block less (sm_86: 99 KB against Q8_0's 111 KB) keeps the WMMA tiles.
    if (kShared > static_cast<unsigned>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin))) return p;
    if (ceil_div(a.n, kI8Rows) > 65535 || a.batches > 65535) return p;
    KernelLaunch& q = p.steps[0];
    q.kernel = reinterpret_cast<const void*>(&quantize_x_kernel<T, false>);
    q.grid = dim3(ceil_div(x_rows(a) * (a.k / 32) * 8, kQuantizeThreads));
    q.block = dim3(kQuantizeThreads);
    KernelLaunch& l = p.steps[1];
    l.kernel = reinterpret_cast<const void*>(&int8_tiles_kernel<F, T>);
    l.grid = dim3(ceil_div(a.m, kI8Cols), ceil_div(a.n, kI8Rows), static_cast<unsigned>(a.batches));
    l.block = dim3(kI8Threads);
    l.shared_bytes = kShared;
    p.workspace_bytes = records_offset(a) + x_rows(a) * (a.k / 32) * static_cast<int64_t>(sizeof(XRecord));
  }
  return p;
}

template <typename T>
QuantizedMatmulPlan int8_type_plan(const QuantizedMatmulArgs& args, int ggml_type) {
  switch (ggml_type) {
#define GGML_EXT_INT8_TILES_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return int8_format_plan<decode::Fmt##NAME, T>(args);
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_INT8_TILES_CASE)
#undef GGML_EXT_INT8_TILES_CASE
    default: return {};
  }
}

}  // namespace

QuantizedMatmulPlan int8_tiles_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type) {
  if (args.m <= kDecodeMaxM || args.k <= 0 || args.k % 32 != 0 || args.n <= 0 || !rows_aligned(args, 4)) return {};
  GGML_EXT_CUDA_FLOAT_SWITCH(x_type, kType, return int8_type_plan<typename Storage<kType>::type>(args, ggml_type));
  return {};
}

}  // namespace ggml_ext::cuda
