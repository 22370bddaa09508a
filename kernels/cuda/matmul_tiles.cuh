// The tensor-core tiles' machinery (matmul_tiles.cu has the design), shared by quantized_matmul's tiles and
// mul_mat_id's grouped tiles (mul_mat_id_tiles.cuh): a block of kTcThreads computes kM rows of x x kTcOut outputs,
// walking the reduction in kTcReduce steps, each step's x-blocks of the weight decoded once into shared memory (two
// stages) and multiplied by WMMA fragments. What differs between the two callers is where the tile's rows of x come
// from and where its outputs go: a tile policy (tc_tiles_block's `Tile`) answers both.
#pragma once
#include <type_traits>

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

// The tile a block computes, as tc_tiles_block reads it (both callers' policies have these members):
//   reduce              the reduction length (k forward, n transposed);
//   w, n, k, row_bytes  the weight matrix of this tile (n rows of k elements);
//   o0                  the tile's first output;
//   x_words             whether every row of x starts on a 16-byte boundary and holds whole 16-byte words;
//   x_row(i)            row i (< kM) of the tile's x, reduce elements, or nullptr past the tile's rows;
//   store8(i, out0, v)  outputs out0 .. out0 + 7 of the tile's row i (the policy skips rows and outputs past the
//                       product's).
// Two stages in dynamic shared memory: step s + 1 is decoded and stored while the warps multiply step s, one
// barrier per step. X: x's type in memory (and the output's); T: the tensor cores' (X itself, or bfloat16 for
// float32 x).
template <class Decoder, typename X, typename T, bool kTranspose, int kM, class Tile>
__device__ __forceinline__ void tc_tiles_block(const Tile& tile) {
  // Formats of one 32-element block per x-block decode the next step after issuing the multiply (the bytes
  // prefetched into L1 before it), so the decoding overlaps the tensor cores: m = 512, 128-row tiles, Q4_0
  // 1.02x / 1.08x, Q8_0 1.02x / 1.05x (14336x4096 / 4096x14336). K-quants decode first (Q6_K 0.97x / 0.99x,
  // Q4_K 0.96x / 1.06x late). Measured forward only.
  constexpr bool kDecodeLate = Decoder::kDecodeLate && !kTranspose && kM == 128;
  using Stage = TcStage<T, kTranspose, kM>;
  constexpr int kXChunks = Stage::kXChunks;
  Stage* stages = dynamic_shared_memory<Stage>();
  const int t = threadIdx.x;
  const int64_t o0 = tile.o0, reduce = tile.reduce;
  const uint8_t* w = tile.w;
  const Decoder decoder;
  // This thread's chunks of x: chunk c = t + kTcThreads * i is row c / 4 of the tile, elements 16 (c % 4)..+15.
  // (The row is asked for at every step: keeping the kXChunks pointers in registers across the loop doubled the
  // spills of quantized_matmul's 128-row tiles under nvcc 13.)
  const bool x_words = tile.x_words;
  // This thread's x-block of the weight: forward, row o0 + t/2, x-block (step) + t%2; transposed, row
  // (step) + t/4, x-block o0/32 + t%4. Stored at w[wr][wc..wc+31].
  const int wr = kTranspose ? t / 4 : t / 2, wc = kTranspose ? 32 * (t % 4) : 32 * (t % 2);

  auto load_x = [&](TcLoads<kXChunks>& l, int64_t r0) {
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = t + kTcThreads * i, xj = 16 * (c % 4);
      const X* row = tile.x_row(c / 4);
      const bool whole = x_words && r0 + xj + 16 <= reduce;
      if constexpr (std::is_same_v<X, T>) {
        if (row && whole) {
          const uint4* p = reinterpret_cast<const uint4*>(row + r0 + xj);
          l.x[i].v[0] = __ldg(p);
          l.x[i].v[1] = __ldg(p + 1);
          continue;
        }
      }
      float v[16] = {};
      if (row) load_x_chunk(row, (r0 + xj) / 16, reduce, whole, v);
      l.x[i] = pack16<T>(v);
    }
  };
  auto w_row = [&](int64_t r0) { return kTranspose ? r0 + wr : o0 + wr; };
  auto w_block = [&](int64_t r0) { return kTranspose ? o0 / 32 + t % 4 : r0 / 32 + t % 2; };
  auto load_w = [&](TcLoads<kXChunks>& l, int64_t r0) {
    const int64_t n = w_row(r0), g = w_block(r0);
    float v[32] = {};
    if (n < tile.n && g * 32 < tile.k) decoder.decode(w + n * tile.row_bytes, g, tile.k, v);
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
        if (n < tile.n && g * 32 < tile.k) decoder.prefetch(w + n * tile.row_bytes, g);
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
      tile.store8(acc.warp_row() + 16 * i + r, o0 + acc.warp_col() + 16 * j + c0, scratch + r * kScratchLd + c0);
      __syncwarp();
    }
}

// Dynamic shared memory of tc_tiles_block: its two stages.
template <typename T, bool kTranspose, int kM>
constexpr unsigned tc_shared_bytes() {
  return 2 * static_cast<unsigned>(sizeof(TcStage<T, kTranspose, kM>));
}

}  // namespace
}  // namespace ggml_ext::cuda
