// mul_mat_id's forward product at prefill on the tensor cores (mul_mat_id.cu has the design and when it is taken):
// quantized_matmul's tensor-core tiles (matmul_tiles.cuh) over the pairs grouped by expert. A block takes kTcOut
// weight rows of one busy expert and one tile of up to kTilePairs of its pairs: their rows of x are gathered through
// the sorted pair list, each of the expert's x-blocks is decoded once per tile (not once per chunk of 8 pairs, as
// the dp4a dots do), and each output row goes to its pair's (token, slot) row.
#pragma once
#include "kernels/cuda/matmul_tiles.cuh"
#include "kernels/cuda/mul_mat_id_groups.cuh"

namespace ggml_ext::cuda {
namespace {

// Blocks along y, fixed without reading the ids: sum over the busy buckets b of ceil(pairs_b / kTilePairs), at most
// (pairs + busy * (kTilePairs - 1)) / kTilePairs with busy <= busy_bound (a bucket with pairs rounds up by at most
// kTilePairs - 1 of them). The blocks past the tiles that the grouping counted exit.
inline int64_t tile_bound(const MulMatIdArgs& a) {
  return (pair_count(a) + int64_t{busy_bound(a)} * (kTilePairs - 1)) / kTilePairs;
}

// The tile of a block: pairs sorted[first ..] (count of them) of one expert, outputs o0 .. o0 + kTcOut - 1.
template <typename X>
struct GatheredTile {
  const MulMatIdArgs& a;
  const int32_t* pairs;
  int count;
  int64_t o0, reduce, n, k, row_bytes;
  const uint8_t* w;
  bool x_words;
  __device__ const X* x_row(int i) const {
    return i < count ? static_cast<const X*>(a.x) + x_row_of_pair(a, pairs[i]) * a.k : nullptr;
  }
  __device__ void store8(int i, int64_t out0, const float* v) const {
    if (i >= count) return;
    X* y = static_cast<X*>(a.y) + int64_t{pairs[i]} * a.n;
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (out0 + c < a.n) y[out0 + c] = from_float<X>(v[c]);
  }
};

// Block (bx, y): weight rows bx * kTcOut .. of the busy bucket whose tiles hold tile y (a binary search of the
// grouping's first tiles), that tile's pairs. The bucket of bad ids writes NaN to its pairs' rows and reads no
// weight. Every exit below is the whole block's (before any barrier).
template <class Decoder, typename X, typename T>
__global__ void __launch_bounds__(kTcThreads, 2) grouped_tiles_kernel(MulMatIdArgs a) {
  const PairGroups g(a);
  const int busy = g.busy[0], y = static_cast<int>(blockIdx.y);
  if (y >= g.tiles[busy]) return;  // fewer tiles than the bound
  int lo = 0, hi = busy - 1;       // the last busy index whose first tile is at most y
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (g.tiles[mid] <= y) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int bucket = g.busy[1 + lo];
  const int64_t first = g.offsets[bucket] + int64_t{y - g.tiles[lo]} * kTilePairs, last = g.offsets[bucket + 1];
  const int count = static_cast<int>(last - first < kTilePairs ? last - first : kTilePairs);
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTcOut;
  if (bucket == a.e) {
    for (int i = threadIdx.x; i < count * kTcOut; i += kTcThreads) {
      const int64_t out = o0 + i % kTcOut;
      if (out < a.n) static_cast<X*>(a.y)[int64_t{g.sorted[first + i / kTcOut]} * a.n + out] = from_float<X>(NAN);
    }
    return;
  }
  const GatheredTile<X> tile{a,   g.sorted + first, count, o0, a.k, a.n, a.k, a.row_bytes,
                             static_cast<const uint8_t*>(a.w) + bucket * a.n * a.row_bytes,
                             aligned(a.x, 16) && a.k % (16 / sizeof(X)) == 0};
  tc_tiles_block<Decoder, X, T, false, kTilePairs>(tile);
}

// Average pairs per expert from which the tiles are taken. Below it the dp4a chunks of 8 pairs read each expert's
// rows about once anyway (and their int8 x is a quarter of the bytes); from 16 on (two chunks or more per expert on
// average, e.g. qwen3-30b-a3b's 8 of 128 experts from 256 tokens), the tiles decode each row once per 64 pairs
// and multiply on the tensor cores. A guess from that count, to be tuned on a GPU.
constexpr int64_t kTilesMinPairsPerExpert = 16;

inline bool tiles_worth_it(const MulMatIdArgs& a) {
  return a.k > 0 && pair_count(a) >= kTilesMinPairsPerExpert * a.e && tile_bound(a) <= 65535;
}

// The grouped tiles as step 1 (after group_pairs_kernel) where worth it and a decoder fits, chosen as tiles_plan
// chooses them: aligned words for the quantized layouts on 4-byte rows, else the reference decoders (the IQ grid
// and ternary types always); float weights only for float16/bfloat16 x (float32 x keeps grouped_float_kernel's
// float32 products, as quantized_matmul keeps its FMA tiles). X: x's type; T: the tensor cores' (bfloat16 for
// float32 x, as quantized_matmul's tiles without precise_x: mul_mat_id has no such flag).
template <typename X, typename T>
bool set_tile_step(MulMatIdPlan& p, const MulMatIdArgs& a, int type) {
  if (!tiles_worth_it(a)) return false;
  auto set = [&](auto tag) {
    p.steps[1] = KernelLaunch{reinterpret_cast<const void*>(&grouped_tiles_kernel<typename decltype(tag)::type, X, T>),
                              dim3(static_cast<unsigned>(ceil_div(a.n, kTcOut)), static_cast<unsigned>(tile_bound(a))),
                              dim3(kTcThreads), tc_shared_bytes<T, false, kTilePairs>()};
    return true;
  };
  const bool words = aligned(a.w, 4) && a.row_bytes % 4 == 0;
  switch (type) {
#define GGML_EXT_MMID_TILES_CASE(NAME, name, id, qk, bytes)                                      \
  case GGML_EXT_TYPE_##NAME:                                                                    \
    return words ? set(std::type_identity<WordDecoder<decode::Fmt##NAME>>{})                    \
                 : set(std::type_identity<ReferenceDecoder<Weights_##name>>{});
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_MMID_TILES_CASE)
#undef GGML_EXT_MMID_TILES_CASE
#define GGML_EXT_MMID_TILES_DECODED_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return set(std::type_identity<ReferenceDecoder<Weights_##name>>{});
    GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_MMID_TILES_DECODED_CASE)
#undef GGML_EXT_MMID_TILES_DECODED_CASE
    case GGML_EXT_TYPE_F32:
      if constexpr (std::is_same_v<X, T>) return set(std::type_identity<ReferenceDecoder<Weights_f32>>{});
      return false;
    case GGML_EXT_TYPE_F16:
      if constexpr (std::is_same_v<X, T>) return set(std::type_identity<ReferenceDecoder<Weights_f16>>{});
      return false;
    case GGML_EXT_TYPE_BF16:
      if constexpr (std::is_same_v<X, T>) return set(std::type_identity<ReferenceDecoder<Weights_bf16>>{});
      return false;
    default: return false;
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
