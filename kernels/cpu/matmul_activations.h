// x's rows quantized for the group row dots (AVX2, portable, and AVX-512 for one row of x): int8 codes per 32
// elements with their scales, in tiles of rows, plus the per-chunk sums the offsets and zero points multiply.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul_common.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

// ---------------------------------------------------------------------------------------------------
// Activations: rows of x quantized per 32 elements to signed bytes. Stored in tiles of rows, group-major, so that
// a tile's data for one weight group is contiguous and small (72 bytes per row and 64 elements): per
// (tile, group, row) the 64 codes and the two activation scales. Apart, per row and 16-element chunk, the exact
// float sum of x and the sum of its codes times their scale (what an offset, resp. kZero, multiplies).
// ---------------------------------------------------------------------------------------------------
struct ActRecord {
  int8_t q[kGroup];
  float d[kGroup / kActBlock];
};

// The tile instance for `rows` rows of x: 1, 2, 4 or 8 (the rows a weight pass takes at once).
inline int tile_rows_for(int64_t rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : kTileRows; }

// Where the records of rows of x sit: tiles of `tile` rows, and inside a tile `units` records per row (groups or
// spans along K), unit-major, so that a tile's records of one unit are contiguous.
struct RowTiles {
  int64_t units = 0;
  int64_t tile = kTileRows;  // rows per tile: 1, 2, 4 or 8 (fewer for small M, so no record is padding)

  // Returns the rows padded to whole tiles.
  int64_t shape(int64_t rows, int64_t n_units) {
    tile = tile_rows_for(rows);
    units = n_units;
    return (rows + tile - 1) / tile * tile;
  }
  int64_t at(int64_t row, int64_t unit) const { return (row / tile * units + unit) * tile + row % tile; }
  // Where a tile's records start (row0: its first row, a multiple of `tile`): at(row0, 0) without the division,
  // which row dots otherwise paid per weight row (~35 cycles a row with the output's own, 2048-element rows
  // taking ~240).
  int64_t tile_start(int64_t row0) const { return row0 * units; }
};

struct QuantizedRows : RowTiles {
  std::vector<ActRecord> rec;
  // Per row and 16-element chunk, row-major: the exact float sum of x and the sum of its codes times their scale.
  std::vector<float> chunk_x, chunk_q;
  // Per row and 32-element block: the sum of x, that sum less the codes' (what the rounding left out), and the
  // codes' scale (as in the records, but contiguous); read by Q4_K and Q5_K's sub-block paths (HalfRowDot).
  std::vector<float> block_x, block_residual, block_d;
  int64_t chunks = 0;  // per row

  void resize(int64_t rows, int64_t K) {
    const int64_t padded = shape(rows, (K + kGroup - 1) / kGroup);
    rec.assign(padded * units, ActRecord{});  // activations of zero: padding rows and the tail of the last group
    chunks = units * (kGroup / 16);
    chunk_x.assign(padded * chunks, 0.0f);
    chunk_q.assign(padded * chunks, 0.0f);
    block_x.assign(padded * chunks / 2, 0.0f);
    block_residual.assign(padded * chunks / 2, 0.0f);
    block_d.assign(padded * chunks / 2, 0.0f);
  }
};

// One tile of rows of x as a row dot reads it: group g's records at rec[g * stride + r].
struct TileView {
  const ActRecord* rec;
  int64_t stride;

  TileView(const QuantizedRows& act, int64_t row0) : rec(act.rec.data() + act.tile_start(row0)), stride(act.tile) {}
  const ActRecord* records(int64_t g) const { return rec + g * stride; }
};

// Row r0 + r's chunk and block sums as a row dot reads them.
struct ChunkSums {
  const float* x;
  const float* q;
  const float* block_x;
  const float* block_residual;
  const float* block_d;
  int64_t stride;

  ChunkSums(const QuantizedRows& act, int64_t row0)
      : x(act.chunk_x.data() + row0 * act.chunks), q(act.chunk_q.data() + row0 * act.chunks),
        block_x(act.block_x.data() + row0 * act.chunks / 2),
        block_residual(act.block_residual.data() + row0 * act.chunks / 2),
        block_d(act.block_d.data() + row0 * act.chunks / 2), stride(act.chunks) {}
  const float* x_of(int r, int64_t chunk) const { return x + r * stride + chunk; }
  const float* q_of(int r, int64_t chunk) const { return q + r * stride + chunk; }
  const float* block_x_of(int r, int64_t block) const { return block_x + r * stride / 2 + block; }
  const float* block_residual_of(int r, int64_t block) const { return block_residual + r * stride / 2 + block; }
  const float* block_d_of(int r, int64_t block) const { return block_d + r * stride / 2 + block; }
};

// The sum of n floats (a power of 2, at least 4) by folding: the upper half added to the lower half, lane by lane,
// until one is left. A fixed order, so the same x gives the same sums; a tree like a pairwise sum (as accurate),
// but one that vectorizes. In 16-byte vectors throughout: a copy into a float array that GCC then read back 32
// bytes at a time was loaded across two 16-byte stores, which store forwarding cannot serve (x's quantization
// of a 4096-element row took ~13 us, the whole product of 16 rows of it 19 us, 2026-11-29).
template <int n>
inline float fold_sum(const float* v) {
  static_assert(n >= 4 && (n & (n - 1)) == 0, "fold_sum: a power of 2 of at least 4");
  typedef float vf4 __attribute__((vector_size(16)));
  vf4 t[n / 4];
  for (int i = 0; i < n / 4; ++i) t[i] = load_vec<vf4>(v + 4 * i);
#pragma GCC unroll 8
  for (int h = n / 8; h >= 1; h /= 2) {  // element j += element j + 4h
    for (int j = 0; j < h; ++j) t[j] += t[j + h];
  }
  return (t[0][0] + t[0][2]) + (t[0][1] + t[0][3]);
}

// A block's 32 codes (integral floats within int8) as bytes; GCC scalarizes a plain vector narrowing.
inline __attribute__((always_inline)) void store_block_codes(const vf32* codes, int8_t* q) {
#if defined(__AVX512F__)
  for (int i = 0; i < 2; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32((__m512)codes[i])));
  }
#elif defined(__AVX2__)
  const __m256i words = _mm256_packs_epi32(_mm256_cvtps_epi32((__m256)codes[0]), _mm256_cvtps_epi32((__m256)codes[1]));
  const __m256i words2 = _mm256_packs_epi32(_mm256_cvtps_epi32((__m256)codes[2]), _mm256_cvtps_epi32((__m256)codes[3]));
  // packs works per 128-bit half: dword k of the result holds elements 8k..8k+3 (k < 4), 8(k-4)+4..+7 (k >= 4)
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words2), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
#else
  for (int j = 0; j < kActBlock; ++j) q[j] = static_cast<int8_t>(codes[j / kLanes][j % kLanes]);
#endif
}

// One block of x (n <= 32 elements, zeros after them): its values as float32 in v and its codes in q (v / scale
// rounded; 0 for a zero or non-finite scale); returns the scale amax / 127.
template <class Fmt>
float quantize_block(const typename Fmt::T* x, int64_t n, float* v, int8_t* q, float* code_values = nullptr) {
  constexpr int kVecs = kActBlock / kLanes;
  typedef int32_t vi32 __attribute__((vector_size(kLanes * 4)));
  vf32 val[kVecs];
  if (n == kActBlock) {
    for (int i = 0; i < kVecs; ++i) val[i] = Fmt::load(x + i * kLanes);
  } else {
    for (int j = 0; j < kActBlock; ++j) v[j] = j < n ? Fmt::to_f32(x[j]) : 0.0f;
    for (int i = 0; i < kVecs; ++i) std::memcpy(&val[i], v + i * kLanes, sizeof(vf32));
  }
  vf32 amax_lanes = {};
  vi32 nan_lanes = {};
  for (int i = 0; i < kVecs; ++i) {
    const vf32 m = (vf32)((vu32)val[i] & 0x7fffffffu);
    amax_lanes = m > amax_lanes ? m : amax_lanes;
    nan_lanes |= val[i] != val[i];
  }
  float amax = 0.0f;
  bool nan = false;
  for (int l = 0; l < kLanes; ++l) {
    amax = std::max(amax, amax_lanes[l]);
    nan |= nan_lanes[l] != 0;
  }
  if (nan) amax = std::numeric_limits<float>::quiet_NaN();  // a NaN stays the maximum: the row's result is NaN
  const float scale = amax / 127.0f;
  const float inv = scale != 0.0f && std::isfinite(scale) ? 1.0f / scale : 0.0f;
  vf32 codes[kVecs];
  for (int i = 0; i < kVecs; ++i) {
    // |v * inv| <= 127 for a finite scale; otherwise inv is 0 and the codes are 0 (inf * 0 masked out).
    const vf32 r = round_to_nearest_even(val[i] * inv);
    codes[i] = (vf32)((vu32)r & (vu32)(r == r));
    std::memcpy(v + i * kLanes, &val[i], sizeof(vf32));
    if (code_values) std::memcpy(code_values + i * kLanes, &codes[i], sizeof(vf32));
  }
  store_block_codes(codes, q);
  return scale;
}

// One block of row `row` (n <= 32 elements from k0): its codes, scale and sums into `a`; v gets its values as
// float32 and codes their codes (both zero-padded to 32). Returns the scale.
template <class Fmt>
float quantize_row_block(const typename Fmt::T* x, int64_t n, int64_t k0, QuantizedRows& a, int64_t row, float* v,
                         float* codes) {
  const int64_t part = k0 % kGroup;
  ActRecord& r = a.rec[a.at(row, k0 / kGroup)];
  const float scale = quantize_block<Fmt>(x, n, v, r.q + part, codes);
  r.d[part / kActBlock] = scale;
  float block_x = 0.0f, block_q = 0.0f;
  for (int c = 0; c < kActBlock / 16; ++c) {
    const int64_t at = row * a.chunks + k0 / 16 + c;
    a.chunk_x[at] = fold_sum<16>(v + 16 * c);
    a.chunk_q[at] = fold_sum<16>(codes + 16 * c) * scale;  // integers: the sum is exact
    block_x += a.chunk_x[at];
    block_q += a.chunk_q[at];
  }
  const int64_t block = row * a.chunks / 2 + k0 / kActBlock;
  a.block_x[block] = block_x;
  a.block_residual[block] = block_x - block_q;
  a.block_d[block] = scale;
  return scale;
}

template <class Fmt>
void quantize_row(const typename Fmt::T* x, int64_t K, QuantizedRows& a, int64_t row) {
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float v[kActBlock], codes[kActBlock];
    quantize_row_block<Fmt>(x + k0, std::min<int64_t>(kActBlock, K - k0), k0, a, row, v, codes);
  }
}

// x in two passes (MatmulArgs::precise_x): row 2m gets x's codes as above, row 2m + 1 the codes of what their
// rounding left out (r = x - d q, per block), so a pair of rows adds up to x within about 1/254 of one pass's
// rounding error. Every row dot is linear in its row's codes and exact sums: per chunk
//     dot = sum(weight codes * codes * scales) + alpha * X + beta * Q
// (X: the exact float sum that offsets and centers multiply, Q: the codes' sum times their scale; exact when
// the codes are exact, X = Q). Row 2m's exact sum X already covers the residual R = X - Q, so row 2m + 1's
// exact sums are set to its Q less R: the pair then adds to the weights applied to (codes + residual codes),
// whatever alpha and beta a format's dot uses.
template <class Fmt>
void quantize_row_with_residual(const typename Fmt::T* x, int64_t K, QuantizedRows& a, int64_t m) {
  const int64_t row = 2 * m, res_row = row + 1;
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    const int64_t n = std::min<int64_t>(kActBlock, K - k0);
    float v[kActBlock], codes[kActBlock], residual[kActBlock], res_v[kActBlock], res_codes[kActBlock];
    const float scale = quantize_row_block<Fmt>(x + k0, n, k0, a, row, v, codes);
    for (int j = 0; j < kActBlock; ++j) residual[j] = v[j] - scale * codes[j];
    quantize_row_block<F32>(residual, n, k0, a, res_row, res_v, res_codes);
    for (int c = 0; c < kActBlock / 16; ++c) {
      const int64_t at = row * a.chunks + k0 / 16 + c, res_at = res_row * a.chunks + k0 / 16 + c;
      a.chunk_x[res_at] = a.chunk_q[res_at] - (a.chunk_x[at] - a.chunk_q[at]);
    }
    const int64_t block = row * a.chunks / 2 + k0 / kActBlock, res_block = res_row * a.chunks / 2 + k0 / kActBlock;
    const float res_q = a.block_x[res_block] - a.block_residual[res_block];
    a.block_x[res_block] = res_q - a.block_residual[block];
    a.block_residual[res_block] = -a.block_residual[block];
  }
}

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
