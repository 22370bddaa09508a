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
#include "kernels/cuda/matmul_tiles.cuh"
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
// (the machinery in matmul_tiles.cuh, shared with mul_mat_id's grouped tiles)

// quantized_matmul's tile: rows m0 .. m0 + kM - 1 of batch z of x, outputs o0 .. o0 + kTcOut - 1.
template <typename X, bool kTranspose>
struct DenseTile {
  const QuantizedMatmulArgs& a;
  int64_t z, m0, o0, reduce, outs, n, k, row_bytes;
  const X* x;
  const uint8_t* w;
  bool x_words;
  __device__ DenseTile(const QuantizedMatmulArgs& args, int kM)
      : a(args),
        z(blockIdx.z),
        m0(static_cast<int64_t>(blockIdx.y) * kM),
        o0(static_cast<int64_t>(blockIdx.x) * kTcOut),
        reduce(Orientation<kTranspose>{args}.reduce()),
        outs(Orientation<kTranspose>{args}.outs()),
        n(args.n),
        k(args.k),
        row_bytes(args.row_bytes),
        x(static_cast<const X*>(args.x) + z * args.m * reduce),
        w(static_cast<const uint8_t*>(args.w) + weight_batch(args, z) * args.n * args.row_bytes),
        x_words(aligned(args.x, 16) && reduce % (16 / sizeof(X)) == 0) {}
  __device__ const X* x_row(int i) const { return m0 + i < a.m ? x + (m0 + i) * reduce : nullptr; }
  __device__ void store8(int i, int64_t out0, const float* v) const {
    const int64_t m = m0 + i;
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (m < a.m && out0 + c < outs) store_output<X>(a, (z * a.m + m) * outs + out0 + c, v[c]);
  }
};

template <class Decoder, typename X, typename T, bool kTranspose, int kM>
__global__ void __launch_bounds__(kTcThreads, 2) tc_tiles_kernel(QuantizedMatmulArgs a) {
  tc_tiles_block<Decoder, X, T, kTranspose, kM>(DenseTile<X, kTranspose>(a, kM));
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
  l.shared_bytes = transpose ? tc_shared_bytes<T, true, kM>() : tc_shared_bytes<T, false, kM>();
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
