// Tiles (prefill, and the transposed product of the vjp): each block computes a tile of outputs for a tile of
// rows of x, walking the reduction in steps; each step's weights are decoded once into shared memory and
// reused by every row of the tile.
//   float16/bfloat16 x: tensor cores (WMMA, float32 accumulation) on 128 (or 64) rows x 128 outputs, 64
//     reduction steps; the weight rounded to x's type. Each thread decodes one 32-element x-block per step into
//     registers and stores it to the other of two shared stages while the warps multiply the current one (the
//     formats of 32-element blocks decode after issuing the multiply, K-quants before it).
//     Weight rows on 4-byte boundaries are read as aligned words (decode_formats.cuh, as the decode kernels
//     do); others, and float weights, through the reference decoders (weights.cuh).
//   float32 x, forward on quantized weights: the same tensor-core tiles in bfloat16 (x rounded as it is staged:
//     at most ggml's own loss, whose GPU kernels take x as 8-bit codes per 32 elements, and no overflow), float32
//     sums and output. Measured on an H200 before it (the FMA tiles below): Q4_K 4096 x 14336 at 512 rows of x
//     3.4 ms against llama.cpp's 0.35 ms (bench_mul_mat_vs_ggml.py), most of a model's prefill.
//   float32 x otherwise (precise_x, the transposed product of the vjp, float weights): float32 FMAs on 64x64
//     tiles, 32 reduction steps (no precision lost to the inputs).
#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"
// Tensor cores (WMMA, bfloat16 included) need sm_80; the host emulation of tests/cuda_emulation supplies the API.
#if defined(GGML_EXT_CUDA_EMULATION)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mlx-ggml-ext's CUDA kernels need sm_80 or newer (tensor-core tiles): set CMAKE_CUDA_ARCHITECTURES to 80 or higher"
#else
#include <mma.h>
#endif
namespace ggml_ext::cuda {
namespace {

// Which reduction index and output a tile element belongs to, forward or transposed.
template <bool kTranspose>
struct Orientation {
  const QuantizedMatmulArgs& a;
  __device__ int64_t reduce() const { return kTranspose ? a.n : a.k; }
  __device__ int64_t outs() const { return kTranspose ? a.k : a.n; }
};

// ------------------------------------------------------------------------------------------------ float32 x

constexpr int kFmaM = 64, kFmaOut = 64, kFmaReduce = 32, kFmaThreads = 128;
constexpr int kFmaPad = 8;  // spreads the banks

// The 64x64 float32 accumulators of a tile: each thread owns 8 rows x 4 outputs; each 32-step tile is summed
// on its own before it is added, which keeps float32 rounding over long reductions near that of a pairwise sum.
struct FmaAccumulators {
  float acc[8][4] = {};
  __device__ int row() const { return (threadIdx.x / 16) * 8; }
  __device__ int col() const { return (threadIdx.x % 16) * 4; }
  __device__ void multiply(const float (&xs)[kFmaM][kFmaReduce + kFmaPad],
                           const float (&ws)[kFmaReduce][kFmaOut + kFmaPad]) {
    float part[8][4] = {};
#pragma unroll 8
    for (int r = 0; r < kFmaReduce; ++r) {
      float xv[8], wv[4];
#pragma unroll
      for (int i = 0; i < 8; ++i) xv[i] = xs[row() + i][r];
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = ws[r][col() + j];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] += xv[i] * wv[j];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += part[i][j];
  }
};

template <typename Weights, bool kTranspose>
__global__ void __launch_bounds__(kFmaThreads) fma_tiles_kernel(QuantizedMatmulArgs a) {
  __shared__ __align__(16) float xs[kFmaM][kFmaReduce + kFmaPad];
  __shared__ __align__(16) float ws[kFmaReduce][kFmaOut + kFmaPad];  // the weight as (reduction, output)
  const int t = threadIdx.x;
  const int64_t z = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kFmaM;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kFmaOut;
  const Orientation<kTranspose> o{a};
  const int64_t reduce = o.reduce(), outs = o.outs();
  const float* x = static_cast<const float*>(a.x) + z * a.m * reduce;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + weight_batch(a, z) * a.n * a.row_bytes;

  FmaAccumulators acc;
  for (int64_t r0 = 0; r0 < reduce; r0 += kFmaReduce) {
    {  // x tile: thread t fills 16 elements of row t / 2
      const int i = t / 2, j0 = 16 * (t % 2);
      float v[16];
      if (m0 + i < a.m) {
        load_x_chunk(x + (m0 + i) * reduce, (r0 + j0) / 16, reduce, false, v);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) xs[i][j0 + j] = v[j];
    }
    {  // weight tile: one 16-element chunk of a weight row per thread
      float v[16];
      const int64_t n = kTranspose ? r0 + t / 4 : o0 + t / 2;
      const int64_t chunk = kTranspose ? o0 / 16 + t % 4 : r0 / 16 + t % 2;
      if (n < a.n && chunk * 16 < a.k) {
        Weights::row_chunk(w + n * a.row_bytes, chunk, a.k, v);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = 0.0f;
      }
      if constexpr (kTranspose) {
#pragma unroll
        for (int j = 0; j < 16; ++j) ws[t / 4][16 * (t % 4) + j] = v[j];
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) ws[16 * (t % 2) + j][t / 2] = v[j];
      }
    }
    __syncthreads();
    acc.multiply(xs, ws);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + acc.row() + i, out = o0 + acc.col() + j;
      if (m < a.m && out < outs) store_output<float>(a, (z * a.m + m) * outs + out, acc.acc[i][j]);
    }
}

// ------------------------------------------------------------------------------------------------ tensor cores

constexpr int kTcOut = 128, kTcReduce = 64, kTcThreads = 256;
constexpr int kTcWarpsOut = 4;  // 2 x 4 warps, each (kM / 2) rows x 32 outputs: (kM / 32) x 2 fragments of 16 x 16
constexpr int kTcPad = 8;       // keeps WMMA's 32-byte alignment of fragment rows, spreads the banks
constexpr int kTcLd = kTcReduce + kTcPad;  // row length of x's tile and of the forward weight tile

// One reduction step in shared memory, for tiles of kM rows of x. x: (row, reduction), WMMA's row-major A. The
// weight: 32-element x-blocks are contiguous either way: forward (output, reduction) read as column-major B,
// transposed (reduction, output) read as row-major B.
template <typename T, bool kTranspose, int kM>
struct TcStage {
  static constexpr int kWRows = kTranspose ? kTcReduce : kTcOut;
  static constexpr int kWLd = kTranspose ? kTcOut + kTcPad : kTcLd;
  static constexpr int kXChunks = kM * kTcReduce / 16 / kTcThreads;  // 16-element chunks of x per thread
  T x[kM][kTcLd];
  T w[kWRows][kWLd];
};
static_assert(kTcOut * kTcReduce / 32 == kTcThreads, "one 32-element x-block of the weight per thread and step");

// 16 consecutive elements of a 2-byte float type: 2 16-byte words.
struct Raw32 {
  uint4 v[2];
};
template <typename T>
__device__ __forceinline__ Raw32 pack16(const float* f) {
  static_assert(sizeof(T) == 2, "float16/bfloat16");
  Raw32 r;
  T* e = reinterpret_cast<T*>(r.v);
#pragma unroll
  for (int j = 0; j < 16; ++j) e[j] = from_float<T>(f[j]);
  return r;
}
__device__ __forceinline__ void store_raw(void* p, const Raw32& r) {
  reinterpret_cast<uint4*>(p)[0] = r.v[0];
  reinterpret_cast<uint4*>(p)[1] = r.v[1];
}

// One x-block (32 elements) of a weight row as floats: from aligned words (the decode kernels' formats) or
// through the reference decoders (any alignment, float weights).
template <class Fmt>
struct WordDecoder {
  const typename Fmt::Context ctx;
  __device__ void decode(const uint8_t* row, int64_t g, int64_t, float (&v)[32]) const {
    decode::Sub s;
    Fmt::load(ctx, row, static_cast<int>(g), s);
    decode::sub_values<Fmt>(s, v);
  }
  static constexpr bool kDecodeLate = Fmt::kQK == 32;
  // The block that holds x-block g, into L1 ahead of decode.
  __device__ void prefetch(const uint8_t* row, int64_t g) const {
    using Block = typename Fmt::Block;
    prefetch_l1(row + g * 32 / Fmt::kQK * static_cast<int64_t>(sizeof(Block)), static_cast<int>(sizeof(Block)));
  }
};
template <class Weights>
struct ReferenceDecoder {
  __device__ void decode(const uint8_t* row, int64_t g, int64_t k, float (&v)[32]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float c[16] = {};
      if ((2 * g + h) * 16 < k) Weights::row_chunk(row, 2 * g + h, k, c);
#pragma unroll
      for (int j = 0; j < 16; ++j) v[16 * h + j] = c[j];
    }
  }
  static constexpr bool kDecodeLate = false;
  __device__ void prefetch(const uint8_t*, int64_t) const {}
};

template <typename T, bool kTranspose, int kM>
struct TcAccumulators {
  static constexpr int kFragRows = kM / 32;
  using Stage = TcStage<T, kTranspose, kM>;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[kFragRows][2];
  using BLayout = std::conditional_t<kTranspose, nvcuda::wmma::row_major, nvcuda::wmma::col_major>;
  __device__ int warp_row() const { return (threadIdx.x / 32 / kTcWarpsOut) * (kM / 2); }
  __device__ int warp_col() const { return (threadIdx.x / 32 % kTcWarpsOut) * 32; }
  __device__ TcAccumulators() {
#pragma unroll
    for (int i = 0; i < kFragRows; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
  }
  __device__ void multiply(const Stage& s) {
    namespace wmma = nvcuda::wmma;
#pragma unroll
    for (int kk = 0; kk < kTcReduce; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[kFragRows];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> fb[2];
#pragma unroll
      for (int i = 0; i < kFragRows; ++i) wmma::load_matrix_sync(fa[i], &s.x[warp_row() + 16 * i][kk], kTcLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const T* b = kTranspose ? &s.w[kk][warp_col() + 16 * j] : &s.w[warp_col() + 16 * j][kk];
        wmma::load_matrix_sync(fb[j], b, Stage::kWLd);
      }
#pragma unroll
      for (int i = 0; i < kFragRows; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
};

// What a thread carries to the next stage: its chunks of x and its x-block of the weight, in x's type.
template <int kXChunks>
struct TcLoads {
  Raw32 x[kXChunks];
  Raw32 w[2];
};

// Two stages in dynamic shared memory: step s + 1 is decoded and stored while the warps multiply step s, one
// barrier per step. X: x's type in memory (and the output's); T: the tensor cores' (X itself, or bfloat16 for
// float32 x).
template <class Decoder, typename X, typename T, bool kTranspose, int kM>
__global__ void __launch_bounds__(kTcThreads, 2) tc_tiles_kernel(QuantizedMatmulArgs a) {
  // Formats of one 32-element block per x-block decode the next step after issuing the multiply (the bytes
  // prefetched into L1 before it), so the decoding overlaps the tensor cores: m = 512, 128-row tiles, Q4_0
  // 1.02x / 1.08x, Q8_0 1.02x / 1.05x (14336x4096 / 4096x14336). K-quants decode first (Q6_K 0.97x / 0.99x,
  // Q4_K 0.96x / 1.06x late). Measured forward only.
  constexpr bool kDecodeLate = Decoder::kDecodeLate && !kTranspose && kM == 128;
  using Stage = TcStage<T, kTranspose, kM>;
  constexpr int kXChunks = Stage::kXChunks;
  Stage* stages = dynamic_shared_memory<Stage>();
  const int t = threadIdx.x;
  const int64_t z = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kM;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTcOut;
  const Orientation<kTranspose> o{a};
  const int64_t reduce = o.reduce(), outs = o.outs();
  const X* x = static_cast<const X*>(a.x) + z * a.m * reduce;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + weight_batch(a, z) * a.n * a.row_bytes;
  const Decoder decoder;
  // This thread's chunks of x: chunk c = t + kTcThreads * i is row c / 4 of the tile, elements 16 (c % 4)..+15.
  const bool x_words = aligned(a.x, 16) && reduce % (16 / sizeof(X)) == 0;
  // This thread's x-block of the weight: forward, row o0 + t/2, x-block (step) + t%2; transposed, row
  // (step) + t/4, x-block o0/32 + t%4. Stored at w[wr][wc..wc+31].
  const int wr = kTranspose ? t / 4 : t / 2, wc = kTranspose ? 32 * (t % 4) : 32 * (t % 2);

  auto load_x = [&](TcLoads<kXChunks>& l, int64_t r0) {
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = t + kTcThreads * i, xi = c / 4, xj = 16 * (c % 4);
      const bool row = m0 + xi < a.m, whole = x_words && r0 + xj + 16 <= reduce;
      if constexpr (std::is_same_v<X, T>) {
        if (row && whole) {
          const uint4* p = reinterpret_cast<const uint4*>(x + (m0 + xi) * reduce + r0 + xj);
          l.x[i].v[0] = __ldg(p);
          l.x[i].v[1] = __ldg(p + 1);
          continue;
        }
      }
      float v[16] = {};
      if (row) load_x_chunk(x + (m0 + xi) * reduce, (r0 + xj) / 16, reduce, whole, v);
      l.x[i] = pack16<T>(v);
    }
  };
  auto w_row = [&](int64_t r0) { return kTranspose ? r0 + wr : o0 + wr; };
  auto w_block = [&](int64_t r0) { return kTranspose ? o0 / 32 + t % 4 : r0 / 32 + t % 2; };
  auto load_w = [&](TcLoads<kXChunks>& l, int64_t r0) {
    const int64_t n = w_row(r0), g = w_block(r0);
    float v[32] = {};
    if (n < a.n && g * 32 < a.k) decoder.decode(w + n * a.row_bytes, g, a.k, v);
    l.w[0] = pack16<T>(v);
    l.w[1] = pack16<T>(v + 16);
  };
  auto load = [&](int64_t r0) {
    TcLoads<kXChunks> l;
    load_x(l, r0);
    load_w(l, r0);
    return l;
  };
  auto put = [&](Stage& s, const TcLoads<kXChunks>& l) {
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = t + kTcThreads * i;
      store_raw(&s.x[c / 4][16 * (c % 4)], l.x[i]);
    }
    store_raw(&s.w[wr][wc], l.w[0]);
    store_raw(&s.w[wr][wc + 16], l.w[1]);
  };

  TcAccumulators<T, kTranspose, kM> acc;
  put(stages[0], load(0));
  __syncthreads();
  int cur = 0;
  for (int64_t r0 = 0; r0 < reduce; r0 += kTcReduce) {
    const bool more = r0 + kTcReduce < reduce;
    TcLoads<kXChunks> next;
    if (more) {  // in flight while the warps multiply
      load_x(next, r0 + kTcReduce);
      if constexpr (kDecodeLate) {
        const int64_t n = w_row(r0 + kTcReduce), g = w_block(r0 + kTcReduce);
        if (n < a.n && g * 32 < a.k) decoder.prefetch(w + n * a.row_bytes, g);
      } else {
        load_w(next, r0 + kTcReduce);
      }
    }
    acc.multiply(stages[cur]);
    // The other stage was last read in the previous step, which every warp finished before the last barrier.
    if (more) {
      if constexpr (kDecodeLate) load_w(next, r0 + kTcReduce);  // the tensor cores still busy with the products
      put(stages[cur ^ 1], next);
    }
    __syncthreads();
    cur ^= 1;
  }

  // Fragments have no documented element layout: each warp stores one at a time through shared memory.
  constexpr int kScratchLd = 16 + 4;
  float* scratch = reinterpret_cast<float*>(stages) + (t / 32) * 16 * kScratchLd;
  static_assert(kTcThreads / 32 * 16 * kScratchLd * sizeof(float) <= sizeof(Stage), "scratch inside the stages");
  const int lane = t % 32;
#pragma unroll
  for (int i = 0; i < acc.kFragRows; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      nvcuda::wmma::store_matrix_sync(scratch, acc.acc[i][j], kScratchLd, nvcuda::wmma::mem_row_major);
      __syncwarp();
      const int r = lane / 2, c0 = 8 * (lane % 2);
      const int64_t m = m0 + acc.warp_row() + 16 * i + r;
      const int64_t out0 = o0 + acc.warp_col() + 16 * j + c0;
#pragma unroll
      for (int c = 0; c < 8; ++c)
        if (m < a.m && out0 + c < outs) store_output<X>(a, (z * a.m + m) * outs + out0 + c, scratch[r * kScratchLd + c0 + c]);
      __syncwarp();
    }
}

// ------------------------------------------------------------------------------------------------ plans

template <typename Weights>
QuantizedMatmulPlan fma_plan(const QuantizedMatmulArgs& a, bool transpose) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  l.kernel = transpose ? reinterpret_cast<const void*>(&fma_tiles_kernel<Weights, true>)
                       : reinterpret_cast<const void*>(&fma_tiles_kernel<Weights, false>);
  l.grid = dim3(ceil_div(transpose ? a.k : a.n, kFmaOut), ceil_div(a.m, kFmaM), static_cast<unsigned>(a.batches));
  l.block = dim3(kFmaThreads);
  return p;
}

// float32 x (T bfloat16) is only ever forward: its transposed kernels are not compiled.
template <typename X, typename T, class Decoder, int kM>
QuantizedMatmulPlan tc_plan_rows(const QuantizedMatmulArgs& a, bool transpose) {
  QuantizedMatmulPlan p;
  KernelLaunch& l = p.steps[0];
  if constexpr (std::is_same_v<X, T>) {
    l.kernel = transpose ? reinterpret_cast<const void*>(&tc_tiles_kernel<Decoder, X, T, true, kM>)
                         : reinterpret_cast<const void*>(&tc_tiles_kernel<Decoder, X, T, false, kM>);
  } else {
    if (transpose) return p;
    l.kernel = reinterpret_cast<const void*>(&tc_tiles_kernel<Decoder, X, T, false, kM>);
  }
  l.grid = dim3(ceil_div(transpose ? a.k : a.n, kTcOut), ceil_div(a.m, kM), static_cast<unsigned>(a.batches));
  l.block = dim3(kTcThreads);
  l.shared_bytes = 2 * static_cast<unsigned>(transpose ? sizeof(TcStage<T, true, kM>) : sizeof(TcStage<T, false, kM>));
  return p;
}
// 128 rows of x per tile (each weight x-block decoded for twice the rows: measured 1.0-1.4x faster at m = 512 on
// the H100) from 65 rows on, 64 below (less tensor-core work spent on rows past m).
template <typename X, typename T, class Decoder>
QuantizedMatmulPlan tc_plan(const QuantizedMatmulArgs& a, bool transpose) {
  return a.m > 64 ? tc_plan_rows<X, T, Decoder, 128>(a, transpose) : tc_plan_rows<X, T, Decoder, 64>(a, transpose);
}

// The aligned-word decoder of a quantized type, when its rows start on 4-byte boundaries (sh_words reads whole
// words and never past a row whose length is a multiple of 4); else the reference decoder.
template <typename X, typename T>
QuantizedMatmulPlan tc_plan_for(const QuantizedMatmulArgs& a, int type, bool transpose) {
  const bool words = rows_aligned(a, 4);
  switch (type) {
#define GGML_EXT_TC_CASE(NAME, name, id, qk, bytes)                                         \
  case GGML_EXT_TYPE_##NAME:                                                               \
    return words ? tc_plan<X, T, WordDecoder<decode::Fmt##NAME>>(a, transpose)              \
                 : tc_plan<X, T, ReferenceDecoder<Weights_##name>>(a, transpose);
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_TC_CASE)
#undef GGML_EXT_TC_CASE
    // The decoded types (IQ grids, ternary): their reference decoders only, at any alignment.
#define GGML_EXT_TC_DECODED_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return tc_plan<X, T, ReferenceDecoder<Weights_##name>>(a, transpose);
    GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_TC_DECODED_CASE)
#undef GGML_EXT_TC_DECODED_CASE
    case GGML_EXT_TYPE_F32:
      if constexpr (std::is_same_v<X, T>) return tc_plan<X, T, ReferenceDecoder<Weights_f32>>(a, transpose);
      return {};
    case GGML_EXT_TYPE_F16:
      if constexpr (std::is_same_v<X, T>) return tc_plan<X, T, ReferenceDecoder<Weights_f16>>(a, transpose);
      return {};
    case GGML_EXT_TYPE_BF16:
      if constexpr (std::is_same_v<X, T>) return tc_plan<X, T, ReferenceDecoder<Weights_bf16>>(a, transpose);
      return {};
    default: return {};
  }
}
}  // namespace

QuantizedMatmulPlan tiles_plan(const QuantizedMatmulArgs& args, int ggml_type, FloatType x_type, bool transpose,
                               bool exact_x) {
  switch (x_type) {
    case FloatType::f32: {
      if (!exact_x && !transpose) {  // the bfloat16 tensor cores (quantized weights only: empty for float ones)
        const QuantizedMatmulPlan p = tc_plan_for<float, __nv_bfloat16>(args, ggml_type, false);
        if (p.steps[0].kernel) return p;
      }
      return with_weights(ggml_type, [&](auto weights) { return fma_plan<decltype(weights)>(args, transpose); });
    }
    case FloatType::f16: return tc_plan_for<__half, __half>(args, ggml_type, transpose);
    case FloatType::bf16: return tc_plan_for<__nv_bfloat16, __nv_bfloat16>(args, ggml_type, transpose);
  }
  return {};
}
}  // namespace ggml_ext::cuda
