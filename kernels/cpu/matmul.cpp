// Products with a weight stored as ggml blocks, on the blocks.
//
// Forward, quantized weight: each row of x is quantized to int8 per 32 elements (scale amax / 127, as ggml's
// Q8_0), and each weight row is decoded through the shared layouts of kernels/common/ggml_blocks.h into int8
// codes plus one float scale and offset per 16-element chunk. Integer dot products of 4 consecutive elements
// land in int32 lanes, which are then scaled by the activation's and the chunk's scales in float32:
//     sum_j w_j x_j = sum_lanes s_w * d_x * (sum code_j q_j) + o_w * (sum x_j)
// (o_w: the chunk's offset, for Q4_1, Q5_1, Q2_K, Q4_K, Q5_K; the activation sums are exact float sums).
// Two layouts of the activations:
// - groups of 64 elements (QuantizedRows), for one row of x (every row below AVX-512 VNNI; Q8_0 up to 4 rows):
//   half a group per 256-bit step, the dot one instruction per 4 elements (VNNI dpbusd, AVX2 maddubs/madd, NEON
//   sdot or widening multiplies), each lane scaled on its own;
// - spans (SpanRows), for more rows on AVX-512 VNNI: the weights gathered by byte permutes into the order the
//   activations are stored in, so that a whole span (128 or 256 elements) adds into one int32 vector per row
//   of x before the float scaling, which then comes 2 or 4 times less often (see SpanRowDot).
// Rows of x are taken in tiles of up to 8, so each weight span or group is decoded once per tile: decode
// (M <= 8) streams the weight once with every thread; prefill tiles M by 8 and keeps a slice of weight rows in L2.
//
// Float weights (F32/F16/BF16) and the transposed product (x's gradient) use float32 arithmetic on the
// decoded values: the transposed product decodes each block once and adds it, scaled, into a strip of the
// output that stays in cache.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

typedef int8_t vi8x64 __attribute__((vector_size(64)));

constexpr int kGroup = 64;         // weight elements per step: four 16-element chunks
constexpr int kActBlock = 32;      // elements per activation scale
constexpr int kTileRows = 8;       // rows of x per weight pass
constexpr int64_t kL2WeightBytes = 192 << 10;  // weight rows kept in cache across the row tiles of x
// A K segment's activations, kept in L2: segments cut every weight row into pieces, which DRAM streams badly,
// so they are as long as the cache allows.
constexpr int64_t kActivationBytes = 256 << 10;
// How far ahead of the decoder the weight row is prefetched: 4 KB rather than 1 made one row of x on 4096x14336
// 1.1-1.2x faster (rows of 8-14 KB stalled on DRAM) and changed little elsewhere.
constexpr int64_t kPrefetchBytes = 4096;
// Asks for the kLines 64-byte lines kPrefetchBytes ahead of p in a weight row (the decoders' loops, once per step).
template <int kLines>
inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t* p) {
#pragma GCC unroll 4
  for (int i = 0; i < kLines; ++i) __builtin_prefetch(p + kPrefetchBytes + 64 * i);
}
constexpr int64_t kSegmentAlign = 256;           // K segments hold whole blocks and groups of every type

template <class V>
inline __attribute__((always_inline)) V load_vec(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Formats with an offset (d * q + m; kOffset) have their unsigned codes centered, d * (q - c) + (m + d * c):
// the activation's rounding errors then cancel instead of adding up (about 3.6 times less error for 4 bits).
template <class Q, bool kOffset>
constexpr int code_center() {
  if (!kOffset) return 0;
  const ggml_ext_layout16 l = Q::layout(0);
  return (l.lo_mask + 1) * (l.hi_word ? 2 : l.hi_mask + 1) / 2;
}

// Whether a format adds a per-chunk offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): asked of its scale function.
template <class Q>
bool has_offset() {
  typename Q::B probe{};
  return Q::scale(&probe, 0).offset_op != 0;
}

// How the group kernels' integer dots see a format's codes (their activations are signed bytes; spans have their
// own scheme, see SpanRowDot). Plain codes stay unsigned as stored (0..63 at most), so a dot is one
// unsigned-by-signed multiply (VNNI's dpbusd, AVX2's maddubs); what the zero point and the centering take off
// every code (kZero) is taken off once per chunk, through the activations' per-chunk code sums. Signed codes
// (Q8_0, codebooks) are made unsigned by adding 128 where VNNI is available (kZero = 128, the same correction);
// elsewhere they stay signed and the dot multiplies |w| by q with w's sign.
template <class Q, bool kOffset>
struct CodeForm {
  static constexpr ggml_ext_layout16 kLayout = Q::layout(0);
  static constexpr bool kSigned = kLayout.lo_signed || kLayout.codebook != GGML_EXT_CODEBOOK_NONE;
#if defined(__AVX512VNNI__)
  static constexpr bool kFlip = kSigned;  // signed codes + 128
#else
  static constexpr bool kFlip = false;
#endif
  static constexpr bool kUnsigned = !kSigned || kFlip;
  static constexpr int kZero = kFlip ? 128 : kSigned ? 0 : kLayout.zero + code_center<Q, kOffset>();
  // The codebook as the dot takes it (flipped with the codes).
  static vi8x16 table() {
    const vi8x16 t = codebook_table(kLayout.codebook);
    return kFlip ? t ^ static_cast<int8_t>(-128) : t;
  }
};

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
};

struct QuantizedRows : RowTiles {
  std::vector<ActRecord> rec;
  // Per row and 16-element chunk, row-major: the exact float sum of x and the sum of its codes times their scale.
  std::vector<float> chunk_x, chunk_q;
  // Per row and 32-element block: the sum of x, and that sum less the codes' (what the rounding left out); read
  // by Q4_K and Q5_K's integer-scale path (IntChunkScales).
  std::vector<float> block_x, block_residual;
  int64_t chunks = 0;  // per row

  void resize(int64_t rows, int64_t K) {
    const int64_t padded = shape(rows, (K + kGroup - 1) / kGroup);
    rec.assign(padded * units, ActRecord{});  // activations of zero: padding rows and the tail of the last group
    chunks = units * (kGroup / 16);
    chunk_x.assign(padded * chunks, 0.0f);
    chunk_q.assign(padded * chunks, 0.0f);
    block_x.assign(padded * chunks / 2, 0.0f);
    block_residual.assign(padded * chunks / 2, 0.0f);
  }
};

// One tile of rows of x as a row dot reads it: group g's records at rec[g * stride + r].
struct TileView {
  const ActRecord* rec;
  int64_t stride;

  TileView(const QuantizedRows& act, int64_t row0) : rec(act.rec.data() + act.at(row0, 0)), stride(act.tile) {}
  const ActRecord* records(int64_t g) const { return rec + g * stride; }
};

// Row r0 + r's chunk and block sums as a row dot reads them.
struct ChunkSums {
  const float* x;
  const float* q;
  const float* block_x;
  const float* block_residual;
  int64_t stride;

  ChunkSums(const QuantizedRows& act, int64_t row0)
      : x(act.chunk_x.data() + row0 * act.chunks), q(act.chunk_q.data() + row0 * act.chunks),
        block_x(act.block_x.data() + row0 * act.chunks / 2),
        block_residual(act.block_residual.data() + row0 * act.chunks / 2), stride(act.chunks) {}
  const float* x_of(int r, int64_t chunk) const { return x + r * stride + chunk; }
  const float* q_of(int r, int64_t chunk) const { return q + r * stride + chunk; }
  const float* block_x_of(int r, int64_t block) const { return block_x + r * stride / 2 + block; }
  const float* block_residual_of(int r, int64_t block) const { return block_residual + r * stride / 2 + block; }
};

// The sum of n floats (a power of 2) by folding: the upper half added to the lower half, lane by lane, until one
// is left. A fixed order, so the same x gives the same sums; a tree like a pairwise sum (as accurate), but one
// that vectorizes.
template <int n>
inline float fold_sum(const float* v) {
  float t[n];
  std::memcpy(t, v, sizeof t);
#pragma GCC unroll 8
  for (int h = n / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) t[j] += t[j + h];
  }
  return t[0];
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

template <class Fmt>
void quantize_row(const typename Fmt::T* x, int64_t K, QuantizedRows& a, int64_t row) {
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float v[kActBlock], codes[kActBlock];
    const int64_t part = k0 % kGroup;
    ActRecord& r = a.rec[a.at(row, k0 / kGroup)];
    const float scale = quantize_block<Fmt>(x + k0, std::min<int64_t>(kActBlock, K - k0), v, r.q + part, codes);
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
  }
}

// The signed offset a chunk adds per unit of x (0 for formats without one).
inline __attribute__((always_inline)) float signed_offset(const ggml_ext_scale16& s) {
  return s.offset_op == 0 ? 0.0f : s.offset_op > 0 ? s.offset : -s.offset;
}

// ---------------------------------------------------------------------------------------------------
// Weight groups. A group is 64 consecutive elements of a row: chunks 4G..4G+3 of a 256-element block, or
// chunks 0, 1 of two consecutive 32-element blocks (G = 0).
// ---------------------------------------------------------------------------------------------------
// The chunk layout of chunk c of group G (c may run past 3 for 32-element blocks: chunk c of the blocks from the
// group's first), with its byte offsets counted from the group's first block.
template <class Q>
constexpr ggml_ext_layout16 group_chunk_layout(int G, int c) {
  if (Q::kQK == 32) {
    ggml_ext_layout16 l = Q::layout(c & 1);
    const int block_offset = static_cast<int>(sizeof(typename Q::B)) * (c >> 1);
    l.lo += block_offset;
    l.hi += block_offset;
    return l;
  }
  return Q::layout(4 * G + c);
}

// Portable codes: four 16-element chunks through the shared decoder.
template <class Q, bool kOffset>
struct ChunkCodes {
  static constexpr int8_t kShift = static_cast<int8_t>(-code_center<Q, kOffset>());
  vi8x16 table = codebook_table(Q::layout(0).codebook);

  template <int G, int C>
  inline __attribute__((always_inline)) vi8x16 chunk(const uint8_t* base) const {
    constexpr ggml_ext_layout16 kLayout = group_chunk_layout<Q>(G, C);  // constant: codes16's branches fold
    return codes16(base, kLayout, table);
  }

};

// 16 bytes as 16 floats (widening in steps: GCC 12 scalarizes a direct conversion).
inline __attribute__((always_inline)) vf32x16 widen_bytes(vu8x16 v) {
  typedef uint16_t vu16x16 __attribute__((vector_size(32)));
  return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(v, vu16x16), vi32x16), vf32x16);
}

// Chunk scales and offsets: per block for 256-element blocks (16 chunks, one lane each), then spread over a
// group's lanes; per block for 32-element ones (the row dots call the scale function). The generic form calls
// the shared scale function per chunk; the common formats have vector forms below that compute the same values.
template <class Q>
struct ChunkScales {
  using B = typename Q::B;
  vf32x16 scale, offset;  // 256-element blocks: chunk c in lane c

  inline __attribute__((always_inline)) void load_block(const B* b) {
    float sc[16], off[16];
    for (int c = 0; c < 16; ++c) {
      const auto s = Q::scale(b, c);
      sc[c] = s.scale;
      off[c] = signed_offset(s);
    }
    scale = load_vec<vf32x16>(sc);
    offset = load_vec<vf32x16>(off);
  }
};

// Q4_K and Q5_K: the 8 six-bit scales and mins unpacked with byte shuffles, converted together.
// The block's 8 scales (lanes 0..7) and 8 mins (lanes 8..15) as bytes (get_scale_min_k4).
template <class B>
inline __attribute__((always_inline)) vu8x16 k4_scale_min_bytes(const B* b) {
  const vu8x16 q = load16(b->scales);  // 12 bytes of scales, then the block's next field
  // lanes 0..7: scale j, lanes 8..15: min j (get_scale_min_k4)
  // (constant shifts only: x86 has no per-byte variable shift)
  const vu8x16 low_idx = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11};
  const vu8x16 low_mask = {63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0};
  const vu8x16 nibble_mask = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15};
  const vu8x16 high_idx = {0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7};
  const vu8x16 high_keep = {0, 0, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0, 3, 3, 3, 3};
  const vu8x16 low = __builtin_shuffle(q, low_idx);
  return (low & low_mask) | ((low >> 4) & nibble_mask) | (((__builtin_shuffle(q, high_idx) >> 6) & high_keep) << 4);
}

template <class Q>
struct K4Scales : ChunkScales<Q> {
  inline __attribute__((always_inline)) void load_block(const typename Q::B* b) {
    const vf32x16 values = widen_bytes(k4_scale_min_bytes(b));
    const float d = GGML_EXT_HALF_TO_FLOAT(b->d), dmin = GGML_EXT_HALF_TO_FLOAT(b->dmin);
    const vf32x16 dl = values * d, ml = values * (-dmin);
    // chunk c belongs to sub-block c / 2
    this->scale = __builtin_shufflevector(dl, dl, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    this->offset = __builtin_shufflevector(ml, ml, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  }
};

// Q6_K: 16 int8 scales, one per chunk.
struct Q6KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q6_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q6_k* b) {
    vi8x16 s;
    std::memcpy(&s, b->scales, sizeof s);
    scale = __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(s, vi16x16), vi32x16), vf32x16) *
            GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = vf32x16{};
  }
};

// Q2_K: 16 bytes, scale in the low nibble and min in the high one, one per chunk.
struct Q2KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q2_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q2_k* b) {
    const vu8x16 v = load16(b->scales);
    scale = widen_bytes(v & 15) * GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = widen_bytes(v >> 4) * -GGML_EXT_HALF_TO_FLOAT(b->dmin);
  }
};

// Q3_K: 16 six-bit scales (minus 32): low nibbles from bytes 0..7, two high bits from bytes 8..11. The 16 scales
// as stored (plus 32).
inline __attribute__((always_inline)) vu8x16 q3k_scale_bytes(const block_q3_k* b) {
  // The 12 scale bytes only: a 16-byte load would also take d and 2 bytes past the block, which for a
  // tensor's last block at the end of a mapped file is an unmapped page. Bytes 12-15 are never selected.
  vu8x16 v{};
  std::memcpy(&v, b->scales, sizeof(b->scales));
  const vu8x16 low_idx = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  const vu8x16 first_half = {15, 15, 15, 15, 15, 15, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0};
  const vu8x16 high_idx = {8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11};
  const vu8x16 low = __builtin_shuffle(v, low_idx), high = __builtin_shuffle(v, high_idx);
  const vu8x16 q0 = {3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // high bits at shift 2 * (j / 4)
  const vu8x16 q1 = __builtin_shuffle(q0, vu8x16{4, 4, 4, 4, 0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4});
  const vu8x16 q2 = __builtin_shuffle(q0, vu8x16{4, 4, 4, 4, 4, 4, 4, 4, 0, 1, 2, 3, 4, 4, 4, 4});
  const vu8x16 q3 = __builtin_shuffle(q0, vu8x16{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 1, 2, 3});
  const vu8x16 hbits = (high & q0) | ((high >> 2) & q1) | ((high >> 4) & q2) | ((high >> 6) & q3);
  return (low & first_half) | ((low >> 4) & ~first_half & 15) | (hbits << 4);
}
struct Q3KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q3_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q3_k* b) {
    scale = (widen_bytes(q3k_scale_bytes(b)) - 32.0f) * GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = vf32x16{};
  }
};

// IQ4_XS: 8 six-bit scales (minus 32), one per pair of chunks.
struct IQ4XSScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(iq4_xs, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_iq4_xs* b) {
    const float d = GGML_EXT_HALF_TO_FLOAT(b->d);
    float sc[16];
    for (int ib = 0; ib < 8; ++ib) sc[2 * ib] = sc[2 * ib + 1] = d * static_cast<float>(ggml_ext_iq4xs_scale(b, ib));
    scale = load_vec<vf32x16>(sc);
    offset = vf32x16{};
  }
};

template <class Q>
struct ScalesOf {
  using type = ChunkScales<Q>;
};
#define GGML_EXT_SCALES_OF(name, Scales)               \
  template <>                                           \
  struct ScalesOf<GGML_EXT_BLOCK_FORMAT(name, 256)> {   \
    using type = Scales;                                \
  };
GGML_EXT_SCALES_OF(q2_k, Q2KScales)
GGML_EXT_SCALES_OF(q3_k, Q3KScales)
GGML_EXT_SCALES_OF(q4_k, K4Scales<GGML_EXT_BLOCK_FORMAT(q4_k, 256)>)
GGML_EXT_SCALES_OF(q5_k, K4Scales<GGML_EXT_BLOCK_FORMAT(q5_k, 256)>)
GGML_EXT_SCALES_OF(q6_k, Q6KScales)
GGML_EXT_SCALES_OF(iq4_xs, IQ4XSScales)
#undef GGML_EXT_SCALES_OF

#if !(defined(__AVX512VNNI__) && defined(__AVX512VBMI__))
// Below AVX-512 (AVX2, SSE2, NEON) the same product in 16-element chunks on 16-byte vectors, which GCC keeps
// in registers on every ISA (its lowering of 64-byte vectors without AVX-512 goes through memory).
typedef int32_t vi32x4 __attribute__((vector_size(16)));
typedef float vf32x4 __attribute__((vector_size(16)));

// Signed dot of 16 codes with 16 activation codes, 4 per int32 lane.
inline __attribute__((always_inline)) vi32x4 dot_chunk(vi8x16 w, const int8_t* q) {
#if defined(__AVX2__)
  const __m128i wv = (__m128i)w, qv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  // |w| * (q with w's sign): products of at most 128 * 127, pairs within int16
  return (vi32x4)_mm_madd_epi16(_mm_maddubs_epi16(_mm_sign_epi8(wv, wv), _mm_sign_epi8(qv, wv)), _mm_set1_epi16(1));
#elif defined(__aarch64__) && defined(__ARM_NEON)
  const int8x16_t wv = (int8x16_t)w, qv = vld1q_s8(q);
#if defined(__ARM_FEATURE_DOTPROD)
  return (vi32x4)vdotq_s32(vdupq_n_s32(0), wv, qv);
#else
  return (vi32x4)vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(wv), vget_low_s8(qv))),
                            vpaddlq_s16(vmull_high_s8(wv, qv)));
#endif
#else
  vi32x4 out;
  for (int l = 0; l < 4; ++l) {
    int sum = 0;
    for (int j = 0; j < 4; ++j) sum += static_cast<int>(w[4 * l + j]) * static_cast<int>(q[4 * l + j]);
    out[l] = sum;
  }
  return out;
#endif
}

template <class Q, int MR, bool kOffset>
struct ChunkRowDot {
  using B = typename Q::B;
  vf32x4 acc[MR] = {};
  float offsets[MR] = {};  // what the chunks' offsets add: offset * sum(x)
  TileView tile;
  ChunkSums chunk_sums;
  const ChunkCodes<Q, kOffset>& codes;

  template <class RowCodes>
  ChunkRowDot(const QuantizedRows& act, int64_t row0, const RowCodes& row_codes)
      : tile(act, row0), chunk_sums(act, row0), codes(row_codes.chunk) {}

  // Chunk c (0..3) of group g: its 16 centered codes, scale and offset.
  inline __attribute__((always_inline)) void chunk(vi8x16 w, float scale, float offset, int64_t g, int c) {
    const vf32x4 sw = vf32x4{} + scale;
    const float ow = offset + scale * static_cast<float>(code_center<Q, kOffset>());
    const ActRecord* rec = tile.records(g);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf32x4 f = __builtin_convertvector(dot_chunk(w, rec[r].q + 16 * c), vf32x4) * rec[r].d[c / 2];
      acc[r] += f * sw;
      if constexpr (kOffset) offsets[r] += ow * *chunk_sums.x_of(r, 4 * g + c);
    }
  }

  template <int G, int C>
  inline __attribute__((always_inline)) vi8x16 centered(const uint8_t* base) const {
    return codes.template chunk<G, C>(base) + ChunkCodes<Q, kOffset>::kShift;
  }

  // Blocks [begin, end) of the row.
  void run(const uint8_t* row, int64_t begin, int64_t end, float* res) {
    if constexpr (Q::kQK == 32) {
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        const auto s = Q::scale(reinterpret_cast<const B*>(p), 0);
        const int64_t g = blk / 2;
        const int c0 = 2 * static_cast<int>(blk & 1);
        chunk(centered<0, 0>(p), s.scale, signed_offset(s), g, c0);
        chunk(centered<0, 1>(p), s.scale, signed_offset(s), g, c0 + 1);
      }
    } else {
      typename ScalesOf<Q>::type sc;
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        sc.load_block(reinterpret_cast<const B*>(p));
        float scale[16], offset[16];
        std::memcpy(scale, &sc.scale, sizeof scale);
        std::memcpy(offset, &sc.offset, sizeof offset);
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          (chunk(centered<C / 4, C % 4>(p), scale[C], offset[C], blk * 4 + C / 4, C % 4), ...);
        }(std::make_integer_sequence<int, 16>{});
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) + offsets[r];
  }
};
#endif

#if defined(__AVX2__)
// ---------------------------------------------------------------------------------------------------
// AVX2: half a group per 256-bit step, i.e. two 16-element chunks sharing one activation scale (one 32-element
// block of the legacy types). In every format the two chunks of a half are either 32 consecutive bytes with the
// same shift or the low and high nibbles of the same 16 bytes, so a half's codes take one or two loads; other
// layouts fall back to two chunk decodes.
// The codes are as CodeForm has them: the dot is one maddubs (dpbusd with VNNI) of unsigned codes with the signed
// activations, kZero taken off once per block through the activations' chunk sums; signed codes without VNNI
// multiply |w| by q with w's sign.
// ---------------------------------------------------------------------------------------------------
typedef float vf32x8 __attribute__((vector_size(32)));
typedef int32_t vi32x8 __attribute__((vector_size(32)));

template <class Q, bool kOffset>
struct HalfCodes {
  using Form = CodeForm<Q, kOffset>;
  static constexpr bool kUnsigned = Form::kUnsigned;
  static constexpr int kZero = Form::kZero;
  __m256i table = _mm256_broadcastsi128_si256((__m128i)Form::table());
  ChunkCodes<Q, kOffset> chunks;

  // The bytes at `offset` (and `offset + 16`) shifted right per chunk: elements in the low bits.
  template <int Offset0, int Shift0, int Offset1, int Shift1>
  static inline __attribute__((always_inline)) __m256i window(const uint8_t* base) {
    if constexpr (Offset1 == Offset0 + 16 && Shift0 == Shift1) {
      return _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Offset0)), Shift0);
    } else {
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + Offset0));
      const __m128i v1 = Offset1 == Offset0 ? v0 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + Offset1));
      return _mm256_set_m128i(_mm_srli_epi16(v1, Shift1), _mm_srli_epi16(v0, Shift0));
    }
  }

  // Half H (0, 1) of group G: 32 codes as CodeForm has them.
  template <int G, int H>
  inline __attribute__((always_inline)) __m256i decode(const uint8_t* base) const {
    constexpr ggml_ext_layout16 a = group_chunk_layout<Q>(G, 2 * H), b = group_chunk_layout<Q>(G, 2 * H + 1);
    // The word form of the high bit (Q5_0, Q5_1) is handled for its one arrangement: bits 0..15 and 16..31.
    constexpr bool word_ok = !a.hi_word || (a.hi == b.hi && a.hi_shift == 0 && b.hi_shift == 16);
    if constexpr (!word_ok) {
      return _mm256_set_m128i((__m128i)chunks.template chunk<G, 2 * H + 1>(base),
                              (__m128i)chunks.template chunk<G, 2 * H>(base)) +
             _mm256_set1_epi8(static_cast<char>(ChunkCodes<Q, kOffset>::kShift + kZero));
    }
    __m256i part = window<a.lo, a.lo_shift, b.lo, b.lo_shift>(base);
    if constexpr (a.lo_signed) {  // Q8_0: the bytes are the codes
      return Form::kFlip ? _mm256_xor_si256(part, _mm256_set1_epi8(static_cast<char>(0x80))) : part;
    }
    part = _mm256_and_si256(part, _mm256_set1_epi8(static_cast<char>(a.lo_mask)));
    if constexpr (a.hi_word) {
      // Each byte of the 32-bit word spread over 8 lanes, tested against its lane's bit.
      uint32_t word;
      std::memcpy(&word, base + a.hi, sizeof word);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int>(word)),
          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      part = _mm256_or_si256(part, _mm256_and_si256(set, _mm256_set1_epi8(static_cast<char>(1 << a.hi_pos))));
    } else if constexpr (a.hi_mask != 0) {
      const __m256i hi = _mm256_and_si256(window<a.hi, a.hi_shift, b.hi, b.hi_shift>(base),
                                          _mm256_set1_epi8(static_cast<char>(a.hi_mask)));
      part = _mm256_or_si256(part, _mm256_slli_epi16(hi, a.hi_pos));  // hi_mask << hi_pos fits in the byte
    }
    if constexpr (a.codebook != GGML_EXT_CODEBOOK_NONE) return _mm256_shuffle_epi8(table, part);
    return part;
  }

  // The products of 32 codes with 32 activation codes summed in pairs, in int16 lanes: at most 2 * 63 * 127
  // unsigned, 2 * 128 * 127 signed.
  static inline __attribute__((always_inline)) __m256i pairs(__m256i w, const int8_t* q) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    return kUnsigned ? _mm256_maddubs_epi16(w, qv) : _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qv, w));
  }
  // The dot of 32 codes with 32 activation codes, 4 per int32 lane.
  static inline __attribute__((always_inline)) __m256i dot(__m256i w, const int8_t* q) {
#if defined(__AVX512VNNI__)
    if constexpr (kUnsigned) {
      return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    }
#endif
    return _mm256_madd_epi16(pairs(w, q), _mm256_set1_epi16(1));
  }
};

// A 256-element block's 16 chunk scales and offsets as two 8-lane vectors each (chunk c at [c / 8][c % 8]):
// 16-lane vectors would go through memory on AVX2.
template <class Q>
struct HalfScales {
  vf32x8 scale[2], offset[2];

  inline __attribute__((always_inline)) void load_block(const typename Q::B* b) {
    typename ScalesOf<Q>::type sc;
    sc.load_block(b);
    std::memcpy(scale, &sc.scale, sizeof scale);
    std::memcpy(offset, &sc.offset, sizeof offset);
  }
  // Half H (0..7): chunks 2H and 2H + 1, 4 lanes each.
  template <int H>
  inline __attribute__((always_inline)) vf32x8 half_scale() const {
    constexpr int c = 2 * H % 8;
    return __builtin_shufflevector(scale[H / 4], scale[H / 4], c, c, c, c, c + 1, c + 1, c + 1, c + 1);
  }
};

// The 8 scales and 8 mins of k4_scale_min_bytes as floats.
inline __attribute__((always_inline)) void k4_scale_min_floats(vu8x16 bytes, vf32x8& scale, vf32x8& min) {
  scale = (vf32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32((__m128i)bytes));
  min = (vf32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128((__m128i)bytes, 8)));
}

// Q4_K, Q5_K: 8 sub-block scales and mins, one per half, unpacked and converted in registers.
template <class Q>
struct K4HalfScales : HalfScales<Q> {
  vf32x8 sub_scale;

  inline __attribute__((always_inline)) void load_block(const typename Q::B* b) {
    vf32x8 sub_min;
    k4_scale_min_floats(k4_scale_min_bytes(b), sub_scale, sub_min);
    sub_scale *= GGML_EXT_HALF_TO_FLOAT(b->d);
    sub_min *= -GGML_EXT_HALF_TO_FLOAT(b->dmin);
    this->scale[0] = __builtin_shufflevector(sub_scale, sub_scale, 0, 0, 1, 1, 2, 2, 3, 3);
    this->scale[1] = __builtin_shufflevector(sub_scale, sub_scale, 4, 4, 5, 5, 6, 6, 7, 7);
    this->offset[0] = __builtin_shufflevector(sub_min, sub_min, 0, 0, 1, 1, 2, 2, 3, 3);
    this->offset[1] = __builtin_shufflevector(sub_min, sub_min, 4, 4, 5, 5, 6, 6, 7, 7);
  }
  template <int H>
  inline __attribute__((always_inline)) vf32x8 half_scale() const {
    return __builtin_shufflevector(sub_scale, sub_scale, H, H, H, H, H, H, H, H);
  }
};
template <class Q>
struct HalfScalesOf {
  using type = HalfScales<Q>;
};
template <>
struct HalfScalesOf<GGML_EXT_BLOCK_FORMAT(q4_k, 256)> {
  using type = K4HalfScales<GGML_EXT_BLOCK_FORMAT(q4_k, 256)>;
};
template <>
struct HalfScalesOf<GGML_EXT_BLOCK_FORMAT(q5_k, 256)> {
  using type = K4HalfScales<GGML_EXT_BLOCK_FORMAT(q5_k, 256)>;
};

// 256-element formats whose chunk scales are small integers times one float per block (the K-quants; IQ4_XS too,
// but with its scales unpacked one at a time it gained nothing: 160.7 / 162.2 us, 256x4096, one row of x, Zen 3):
// the integers multiply the code pairs in the int16-to-int32 step (madd, which otherwise multiplies by 1), so a
// half's float work is one conversion and one FMA with the activation scale, the block's float scale applied
// once per block. Without VNNI only (VNNI's dpbusd has no int16 step).
template <class Q>
struct IntChunkScales {
  static constexpr bool kHas = false;
};
struct IntChunkScalesBase {
  static constexpr bool kHas = true;
  static constexpr bool kSubBlockSums = false;
  __m256i low, high;  // int16 scales of chunks 0..7 (resp. 8..15), in both 128-bit halves
  float d;

  inline __attribute__((always_inline)) void set(vi8x16 chunk_scales, float block_scale) {
    const __m256i words = _mm256_cvtepi8_epi16((__m128i)chunk_scales);
    low = _mm256_permute2x128_si256(words, words, 0x00);
    high = _mm256_permute2x128_si256(words, words, 0x11);
    d = block_scale;
  }
  // Half H's scales as multipliers of its 16 code pairs: chunk 2H's in the low 128 bits, 2H + 1's in the high.
  template <int H>
  inline __attribute__((always_inline)) __m256i half() const {
    constexpr char c0 = static_cast<char>(4 * H % 16), c1 = static_cast<char>((4 * H + 2) % 16);
    const __m256i idx = _mm256_setr_epi8(c0, c0 + 1, c0, c0 + 1, c0, c0 + 1, c0, c0 + 1, c0, c0 + 1, c0, c0 + 1, c0,
                                         c0 + 1, c0, c0 + 1, c1, c1 + 1, c1, c1 + 1, c1, c1 + 1, c1, c1 + 1, c1, c1 + 1,
                                         c1, c1 + 1, c1, c1 + 1, c1, c1 + 1);
    return _mm256_shuffle_epi8(H < 4 ? low : high, idx);
  }
};
#if !defined(__AVX512VNNI__)
template <class B>
struct K4IntScales : IntChunkScalesBase {
  static constexpr bool kSubBlockSums = true;  // sums per 32-element sub-block (sub_scale, sub_min)
  vf32x8 sub_scale, sub_min;                    // the 8 scales and mins as floats (without d, dmin)
  float dmin;

  inline __attribute__((always_inline)) void load_block(const B* b) {
    const vu8x16 sub = k4_scale_min_bytes(b);  // chunk c has sub-block c / 2's scale
    set((vi8x16)__builtin_shufflevector(sub, sub, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
        GGML_EXT_HALF_TO_FLOAT(b->d));
    k4_scale_min_floats(sub, sub_scale, sub_min);
    dmin = GGML_EXT_HALF_TO_FLOAT(b->dmin);
  }
};
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(q4_k, 256)> : K4IntScales<block_q4_k> {};
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(q5_k, 256)> : K4IntScales<block_q5_k> {};
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(q6_k, 256)> : IntChunkScalesBase {
  inline __attribute__((always_inline)) void load_block(const block_q6_k* b) {
    vi8x16 sc;
    std::memcpy(&sc, b->scales, sizeof sc);
    set(sc, GGML_EXT_HALF_TO_FLOAT(b->d));
  }
};
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(q3_k, 256)> : IntChunkScalesBase {
  inline __attribute__((always_inline)) void load_block(const block_q3_k* b) {
    set((vi8x16)(q3k_scale_bytes(b) - 32), GGML_EXT_HALF_TO_FLOAT(b->d));
  }
};
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(q2_k, 256)> : IntChunkScalesBase {
  inline __attribute__((always_inline)) void load_block(const block_q2_k* b) {
    set((vi8x16)(load16(b->scales) & 15), GGML_EXT_HALF_TO_FLOAT(b->d));
  }
};
#endif

template <class Q, int MR, bool kOffset>
struct HalfRowDot {
  using B = typename Q::B;
  using Codes = HalfCodes<Q, kOffset>;
  static constexpr bool kSums = kOffset || Codes::kZero != 0;  // whether the chunk sums take part
  // Rows of x up to which IntChunkScales formats take their integer path (8 rows' accumulators and block
  // accumulators would not fit AVX2's 16 vector registers).
  static constexpr int kIntScaleRows = 4;
  // Accumulators live in run() (as members, GCC stores them back after every step).
  using Acc = vf32x8[MR];
  TileView tile;
  ChunkSums chunk_sums;
  const Codes& codes;

  template <class RowCodes>
  HalfRowDot(const QuantizedRows& act, int64_t row0, const RowCodes& row_codes)
      : tile(act, row0), chunk_sums(act, row0), codes(row_codes.half) {}

  // Half h of group g: its codes and per lane its chunk's scale.
  static inline __attribute__((always_inline)) void half(Acc& acc, __m256i w, vf32x8 sw, const ActRecord* rec,
                                                        int h) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      acc[r] += __builtin_convertvector((vi32x8)Codes::dot(w, rec[r].q + 32 * h), vf32x8) * (sw * rec[r].d[h]);
    }
  }

  // What 256-element block blk adds beyond the codes' dot, from its float chunk scales and offsets.
  inline __attribute__((always_inline)) void block_chunk_sums(Acc& sums_acc, const typename HalfScalesOf<Q>::type& sc,
                                                              int64_t blk) const {
    constexpr float kCenter = static_cast<float>(code_center<Q, kOffset>());
    const vf32x8 offset[2] = {sc.offset[0] + sc.scale[0] * kCenter, sc.offset[1] + sc.scale[1] * kCenter};
    block_sums<2>(sums_acc, sc.scale, offset, 16 * blk);
  }

  // Half h of group g with integer chunk scales (IntChunkScales): acc gets the dot times the activation scale.
  static inline __attribute__((always_inline)) void int_half(Acc& acc, __m256i w, __m256i chunk_scales,
                                                            const ActRecord* rec, int h) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256i dot = _mm256_madd_epi16(Codes::pairs(w, rec[r].q + 32 * h), chunk_scales);
      acc[r] += __builtin_convertvector((vi32x8)dot, vf32x8) * rec[r].d[h];
    }
  }

  // What the block's chunks [c0, c0 + 8 * n) add beyond the codes' dot: offset * sum(x) - kZero * scale * sum(q d).
  template <int n>
  inline __attribute__((always_inline)) void block_sums(Acc& sums_acc, const vf32x8* scale, const vf32x8* offset,
                                                        int64_t c0) const {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int i = 0; i < n; ++i) {
        if constexpr (kOffset) sums_acc[r] += offset[i] * load_vec<vf32x8>(chunk_sums.x_of(r, c0 + 8 * i));
        if constexpr (Codes::kZero != 0) {
          sums_acc[r] -= (scale[i] * static_cast<float>(Codes::kZero)) * load_vec<vf32x8>(chunk_sums.q_of(r, c0 + 8 * i));
        }
      }
    }
  }

  // Blocks [begin, end) of the row.
  void run(const uint8_t* row, int64_t begin, int64_t end, float* res) {
    constexpr float kCenter = static_cast<float>(code_center<Q, kOffset>());
    Acc acc = {}, sums_acc = {};  // sums_acc: the offsets' and zero points' part, added per block
    if constexpr (Q::kQK == 32) {
      // Four blocks at a time for the chunk sums (8 chunks, one vector), one by one for the codes.
      float scale[4], offset[4];
      int64_t blk = begin;
      // block b is half b % 2 of group b / 2 (begin is even: segments hold whole groups)
      auto one = [&](int64_t b, const ActRecord* rec, int h, int i) __attribute__((always_inline)) {
        const uint8_t* p = row + b * sizeof(B);
        const auto s = Q::scale(reinterpret_cast<const B*>(p), 0);
        scale[i] = s.scale;
        offset[i] = signed_offset(s) + s.scale * kCenter;
        half(acc, codes.template decode<0, 0>(p), (vf32x8)_mm256_set1_ps(s.scale), rec, h);
      };
      for (; blk + 4 <= end; blk += 4) {
        prefetch_ahead<2>(row + blk * sizeof(B));
        const ActRecord* rec = tile.records(blk / 2);
        one(blk, rec, 0, 0);
        one(blk + 1, rec, 1, 1);
        one(blk + 2, rec + tile.stride, 0, 2);
        one(blk + 3, rec + tile.stride, 1, 3);
        if constexpr (kSums) {
          const vf32x8 sw = {scale[0], scale[0], scale[1], scale[1], scale[2], scale[2], scale[3], scale[3]};
          const vf32x8 ow = {offset[0], offset[0], offset[1], offset[1], offset[2], offset[2], offset[3], offset[3]};
          block_sums<1>(sums_acc, &sw, &ow, 2 * blk);
        }
      }
      for (; blk < end; ++blk) {
        one(blk, tile.records(blk / 2), static_cast<int>(blk & 1), 0);
        if constexpr (kSums) {
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            for (int c = 0; c < 2; ++c) {
              float add = 0.0f;
              if constexpr (kOffset) add += offset[0] * *chunk_sums.x_of(r, 2 * blk + c);
              if constexpr (Codes::kZero != 0) add -= scale[0] * static_cast<float>(Codes::kZero) * *chunk_sums.q_of(r, 2 * blk + c);
              sums_acc[r][0] += add;
            }
          }
        }
      }
    } else if constexpr (IntChunkScales<Q>::kHas && MR <= kIntScaleRows) {
      IntChunkScales<Q> is;
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        prefetch_ahead<3>(p);
        is.load_block(reinterpret_cast<const B*>(p));
        const ActRecord* rec = tile.records(blk * 4);
        constexpr int kChains = MR <= 2 ? 2 : 1;  // with 1-2 rows of x, even and odd halves in two chains of FMAs
        Acc block_acc[kChains] = {};
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          (int_half(block_acc[C % kChains], codes.template decode<C / 2, C % 2>(p), is.template half<C>(),
                    rec + C / 2 * tile.stride, C % 2),
           ...);
        }(std::make_integer_sequence<int, 8>{});
        if constexpr (IntChunkScales<Q>::kSubBlockSums) {
          // Q4_K, Q5_K: the centering and the zero point cancel but for x's rounding residual (kZero = kCenter):
          // per sub-block j, d sc_j kZero (X_j - Q_j) - dmin m_j X_j
          static_assert(Codes::kZero == static_cast<int>(kCenter));
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            block_acc[0][r] += is.sub_scale * (load_vec<vf32x8>(chunk_sums.block_residual_of(r, 8 * blk)) * kCenter);
            acc[r] -= is.sub_min * (load_vec<vf32x8>(chunk_sums.block_x_of(r, 8 * blk)) * is.dmin);
          }
        }
        const vf32x8 d = (vf32x8)_mm256_set1_ps(is.d);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          vf32x8 block_sum = block_acc[0][r];
          if constexpr (kChains == 2) block_sum += block_acc[1][r];
          acc[r] += block_sum * d;
        }
        if constexpr (kSums && !IntChunkScales<Q>::kSubBlockSums) {
          typename HalfScalesOf<Q>::type sc;  // float chunk scales and offsets, for the sums
          sc.load_block(reinterpret_cast<const B*>(p));
          block_chunk_sums(sums_acc, sc, blk);
        }
      }
    } else {
      typename HalfScalesOf<Q>::type sc;
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        prefetch_ahead<3>(p);
        sc.load_block(reinterpret_cast<const B*>(p));
        const ActRecord* rec = tile.records(blk * 4);
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          // C: the block's halves; chunks 2C and 2C + 1 of group C / 2
          (half(acc, codes.template decode<C / 2, C % 2>(p), sc.template half_scale<C>(), rec + C / 2 * tile.stride,
                C % 2),
           ...);
        }(std::make_integer_sequence<int, 8>{});
        if constexpr (kSums) block_chunk_sums(sums_acc, sc, blk);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf32x8 t = acc[r] + sums_acc[r];
      const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)t), _mm256_extractf128_ps((__m256)t, 1));
      res[r] = (s[0] + s[1]) + (s[2] + s[3]);
    }
  }
};

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
// ---------------------------------------------------------------------------------------------------
// Two rows of x or more on AVX-512 VNNI: spans. A span is 256 elements (a 256-element block, eight 32-element
// ones), cut into 16 lanes of S / 16 consecutive elements (a chunk), so one weight scale and one activation
// scale per lane. Register g of a span holds in lane l the elements
// (S / 16) l + 4g .. + 3, for the weights (gathered so by byte permutes) and for the activations (stored in that
// order), so the span's S / 64 dpbusd add into one int32 vector whose lane l is the dot of the whole lane: the
// float conversion and the two scalings come once per span and row of x instead of once per 64 elements (the
// per-row work is what bounds this product on two cores; 128-element spans of Q4_0 were 1.1x slower at m = 8). The activations are stored + 128 (unsigned) and the
// weight codes stay signed (centered for formats with an offset): the 128 * sum(codes) this adds is taken off
// by starting each row's dot from -128 * sum(codes), computed once per span and weight row.
// ---------------------------------------------------------------------------------------------------
template <class Q>
constexpr int kSpan = 256;
// Spans whose registers gather from two windows (SpanPlan::Window::split): Q8_0, eight blocks of 34 bytes.
template <class Q>
constexpr bool kSplitSpan = Q::kQK == 32 && 8 * sizeof(typename Q::B) > 192;

template <int S>
struct SpanRecord {
  uint8_t q[S];    // codes + 128, in span order (register g at q + 64 g)
  float d[16];     // lane l: its activation scale
  float xsum[16];  // lane l: the exact float sum of its x values (what an offset multiplies)
};

// Where element e of a span sits in SpanRecord::q (and in the weight registers).
template <int S>
constexpr int span_position(int e) {
  return 64 * (e % (S / 16) / 4) + 4 * (e / (S / 16)) + e % 4;
}

// Rows of x in span records.
template <int S>
struct SpanRows : RowTiles {
  std::vector<SpanRecord<S>> rec;

  void resize(int64_t rows, int64_t K) {
    const int64_t padded = shape(rows, (K + S - 1) / S);
    SpanRecord<S> zero{};  // x = 0: padding rows and the tail of the last span
    std::memset(zero.q, 128, sizeof zero.q);
    rec.assign(padded * units, zero);
  }
};

template <class Fmt, int S>
void quantize_row(const typename Fmt::T* x, int64_t K, SpanRows<S>& a, int64_t row) {
  constexpr int kLane = S / 16;  // elements per lane
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float v[kActBlock];
    int8_t q[kActBlock];
    const float scale = quantize_block<Fmt>(x + k0, std::min<int64_t>(kActBlock, K - k0), v, q);
    SpanRecord<S>& r = a.rec[a.at(row, k0 / S)];
    const int base = static_cast<int>(k0 % S);
    for (int j = 0; j < kActBlock; ++j) r.q[span_position<S>(base + j)] = static_cast<uint8_t>(q[j] + 128);
    for (int l = 0; l < kActBlock / kLane; ++l) {
      r.d[base / kLane + l] = scale;
      r.xsum[base / kLane + l] = fold_sum<kLane>(v + kLane * l);
    }
  }
}

// How a span's register g is gathered from the weight bytes, computed once per type and register from the shared
// layouts: the byte windows holding its low and high parts (up to three 64-byte loads, masked so that no load
// touches bytes past the span's blocks), the permute indices into them, the shifts per 16-bit word. Where the
// bytes of a register span more than three loads (Q8_0: 272 bytes a span), lanes 0..7 and 8..15 come from two
// windows of at most two loads each, blended (split).
struct SpanPlan {
  struct Window {
    int off = 0, len = 0;   // bytes from the span's first block
    uint64_t load[3] = {};  // byte masks of the loads at off, off + 64, off + 128
    uint64_t third = 0;     // lanes whose index points into the third load
    bool split = false;     // lanes 8..15 from the second window: off2, len2, load2 (load: the first one's)
    int off2 = 0, len2 = 0;
    uint64_t load2[2] = {};
  };
  alignas(64) uint8_t lo_idx[64];
  alignas(64) uint16_t lo_shift[32];
  alignas(64) uint8_t hi_idx[64];
  alignas(64) uint16_t hi_shift[32];
  alignas(64) uint8_t hi_bit[64];  // hi_word formats: the bit of the gathered byte that holds each element's
  Window lo, hi;
  uint8_t lo_mask, hi_mask, hi_pos;
  bool hi_word, has_hi, lo_signed;
  int codebook;
  int8_t sub;  // what takes the format's unsigned part to the (centered) signed code
};

template <class Q, bool kOffset>
constexpr SpanPlan make_span_plan(int g) {
  constexpr int S = kSpan<Q>;
  SpanPlan p{};
  // byte b of the register: element (S / 16) (b / 4) + 4 g + b % 4 of the span, in chunk e / 16 at e % 16
  auto element = [&](int b) { return S / 16 * (b / 4) + 4 * g + b % 4; };
  auto layout = [&](int b) { return group_chunk_layout<Q>(0, element(b) / 16); };
  auto load_masks = [](int len, uint64_t* masks, int n_loads) {
    for (int k = 0; k < n_loads; ++k) {
      const int n = std::clamp(len - 64 * k, 0, 64);
      masks[k] = n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    }
  };
  // at: each byte's offset from the span's first block; idx gets it relative to its window.
  auto set_window = [&](SpanPlan::Window& w, const int (&at)[64], uint8_t* idx) {
    int lo[2] = {1 << 30, 1 << 30}, hi[2] = {0, 0};  // over lanes 0..7 and 8..15
    for (int b = 0; b < 64; ++b) {
      lo[b / 32] = std::min(lo[b / 32], at[b]);
      hi[b / 32] = std::max(hi[b / 32], at[b] + 1);
    }
    if (std::max(hi[0], hi[1]) - std::min(lo[0], lo[1]) > 192) {
      w.split = true;
      w.off = lo[0], w.len = hi[0] - lo[0];
      w.off2 = lo[1], w.len2 = hi[1] - lo[1];
      load_masks(w.len, w.load, 2);
      load_masks(w.len2, w.load2, 2);
      for (int b = 0; b < 64; ++b) idx[b] = static_cast<uint8_t>(at[b] - lo[b / 32]);
      return;
    }
    w.off = std::min(lo[0], lo[1]);
    w.len = std::max(hi[0], hi[1]) - w.off;
    load_masks(w.len, w.load, 3);
    for (int b = 0; b < 64; ++b) {
      idx[b] = static_cast<uint8_t>(at[b] - w.off);
      if (idx[b] >= 128) w.third |= uint64_t(1) << b;
    }
  };
  int at[64];
  for (int b = 0; b < 64; ++b) {
    const ggml_ext_layout16 l = layout(b);
    at[b] = l.lo + element(b) % 16;
    p.lo_shift[b / 2] = static_cast<uint16_t>(l.lo_shift);
  }
  set_window(p.lo, at, p.lo_idx);
  const ggml_ext_layout16 l0 = layout(0);
  p.has_hi = l0.hi_mask != 0 || l0.hi_word;
  p.hi_word = l0.hi_word;
  if (p.has_hi) {
    for (int b = 0; b < 64; ++b) {
      const ggml_ext_layout16 l = layout(b);
      const int pos = element(b) % 16;
      // hi_word: bit (hi_shift + pos) of the little-endian word at hi
      at[b] = l.hi_word ? l.hi + (l.hi_shift + pos) / 8 : l.hi + pos;
      p.hi_bit[b] = static_cast<uint8_t>(1u << ((l.hi_shift + pos) % 8));
      p.hi_shift[b / 2] = static_cast<uint16_t>(l.hi_word ? 0 : l.hi_shift);
    }
    set_window(p.hi, at, p.hi_idx);
  }
  p.lo_mask = static_cast<uint8_t>(l0.lo_mask);
  p.hi_mask = static_cast<uint8_t>(l0.hi_mask);
  p.hi_pos = static_cast<uint8_t>(l0.hi_pos);
  p.lo_signed = l0.lo_signed != 0;
  p.codebook = l0.codebook;
  p.sub = static_cast<int8_t>(l0.zero + code_center<Q, kOffset>());
  return p;
}

template <class Q, bool kOffset, int G>
inline constexpr SpanPlan kSpanPlan = make_span_plan<Q, kOffset>(G);

// The window's bytes picked by idx: one permute per 64-byte load.
template <const SpanPlan::Window& W>
inline __attribute__((always_inline)) __m512i gather_window(const uint8_t* base, __m512i idx) {
  if constexpr (W.split) {
    static_assert(W.len <= 128 && W.len2 <= 128, "a split register gathers each half from at most two loads");
    const uint8_t *p = base + W.off, *q = base + W.off2;
    const __m512i first = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load[0], p), idx,
                                                   _mm512_maskz_loadu_epi8(W.load[1], p + 64));
    const __m512i second = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load2[0], q), idx,
                                                    _mm512_maskz_loadu_epi8(W.load2[1], q + 64));
    return _mm512_mask_blend_epi8(~uint64_t(0) << 32, first, second);  // bytes 32..63: lanes 8..15
  }
  static_assert(W.len <= 192, "a span's register gathers from at most three 64-byte loads");
  const uint8_t* p = base + W.off;
  if constexpr (W.len <= 64) return _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(W.load[0], p));
  __m512i v = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load[0], p), idx,
                                       _mm512_maskz_loadu_epi8(W.load[1], p + 64));
  if constexpr (W.len > 128) {
    v = _mm512_mask_permutexvar_epi8(v, W.third, idx, _mm512_maskz_loadu_epi8(W.load[2], p + 128));
  }
  return v;
}

// A span's weight registers: signed codes (centered for formats with an offset), in span order.
template <class Q, bool kOffset>
struct SpanCodes {
  __m512i table = _mm512_broadcast_i32x4((__m128i)codebook_table(Q::layout(0).codebook));  // every 128-bit lane

  template <int G>
  inline __attribute__((always_inline)) vi8x64 decode(const uint8_t* base) const {
    constexpr const SpanPlan& p = kSpanPlan<Q, kOffset, G>;
    // The tables are read where used: hoisted out of the loop, GCC kept them in registers and spilled the
    // accumulators instead (Q6_K: 1.2x slower).
    const SpanPlan* t = &p;
    asm("" : "+r"(t));
    __m512i part = gather_window<p.lo>(base, _mm512_load_si512(t->lo_idx));
    if constexpr (p.lo_signed) return (vi8x64)part;  // Q8_0: the bytes are the codes
    part = _mm512_and_si512(_mm512_srlv_epi16(part, _mm512_load_si512(t->lo_shift)), _mm512_set1_epi8(p.lo_mask));
    if constexpr (p.has_hi) {
      const __m512i hi = gather_window<p.hi>(base, _mm512_load_si512(t->hi_idx));
      if constexpr (p.hi_word) {
        const __mmask64 set = _mm512_test_epi8_mask(hi, _mm512_load_si512(t->hi_bit));
        part = _mm512_mask_add_epi8(part, set, part, _mm512_set1_epi8(static_cast<char>(1 << p.hi_pos)));
      } else {
        const __m512i bits =
            _mm512_and_si512(_mm512_srlv_epi16(hi, _mm512_load_si512(t->hi_shift)), _mm512_set1_epi8(p.hi_mask));
        part = _mm512_or_si512(part, _mm512_slli_epi16(bits, p.hi_pos));
      }
    }
    if constexpr (p.codebook != GGML_EXT_CODEBOOK_NONE) return (vi8x64)_mm512_shuffle_epi8(table, part);
    if constexpr (p.sub != 0) part = _mm512_sub_epi8(part, _mm512_set1_epi8(p.sub));
    return (vi8x64)part;
  }
};

// One span of a weight row as the dot takes it.
template <class Q>
struct SpanWeights {
  static constexpr int kRegs = kSpan<Q> / 64;
  vi8x64 w[kRegs];
  vi32x16 bias;           // -128 * the sum of each lane's codes
  vf32x16 scale, offset;  // per lane (offset with the centering added)

  void finish() {
    __m512i sum = _mm512_setzero_si512();
    for (int g = 0; g < kRegs; ++g) sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(-128), (__m512i)w[g]);
    bias = -(vi32x16)sum;
  }
};

// One weight row against a tile of MR rows of x: res[r] = sum_k W[k] x[r0 + r][k]. (Two weight rows per pass,
// which would read each activation record once for both, measured slower: 16 accumulators and two spans'
// registers do not fit in the 32 vector registers.)
template <class Q, int MR, bool kOffset>
struct SpanRowDot {
  using B = typename Q::B;
  static constexpr int S = kSpan<Q>, kRegs = S / 64;
  static constexpr int kBlocks = S / Q::kQK;  // blocks per span
  static constexpr float kCenter = static_cast<float>(code_center<Q, kOffset>());
  // Accumulators live in run() (as members, GCC stores them back after every step).
  using Acc = vf32x16[MR];
  const SpanRecord<S>* rec;
  int64_t stride;
  const SpanCodes<Q, kOffset>& codes;

  SpanRowDot(const SpanRows<S>& act, int64_t row0, const SpanCodes<Q, kOffset>& span_codes)
      : rec(act.rec.data() + act.at(row0, 0)), stride(act.tile), codes(span_codes) {}

  // One span of the weight row against the tile's records of it.
  static inline __attribute__((always_inline)) void step(Acc& acc, const SpanWeights<Q>& w, const SpanRecord<S>* x) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512i dot = (__m512i)w.bias;
#pragma GCC unroll 4
      for (int g = 0; g < kRegs; ++g) {
        dot = _mm512_dpbusd_epi32(dot, _mm512_loadu_si512(x[r].q + 64 * g), (__m512i)w.w[g]);
      }
      acc[r] += __builtin_convertvector((vi32x16)dot, vf32x16) * load_vec<vf32x16>(x[r].d) * w.scale;
      if constexpr (kOffset) acc[r] += w.offset * load_vec<vf32x16>(x[r].xsum);
    }
  }

  // The span at p (whole blocks).
  inline __attribute__((always_inline)) void load(SpanWeights<Q>& w, const uint8_t* p) const {
    [&]<int... G>(std::integer_sequence<int, G...>) __attribute__((always_inline)) {
      ((w.w[G] = codes.template decode<G>(p)), ...);
    }(std::make_integer_sequence<int, kRegs>{});
    if constexpr (Q::kQK == 32) {
      ggml_ext_scale16 s[kBlocks];
      for (int k = 0; k < kBlocks; ++k) s[k] = Q::scale(reinterpret_cast<const B*>(p + k * sizeof(B)), 0);
      set_block_scales(w, s);
    } else {
      typename ScalesOf<Q>::type sc;
      sc.load_block(reinterpret_cast<const B*>(p));
      w.scale = sc.scale;
      w.offset = sc.offset + sc.scale * kCenter;
    }
    w.finish();
  }

  // 32-element blocks: lane l belongs to block l / 2.
  static inline __attribute__((always_inline)) void set_block_scales(SpanWeights<Q>& w, const ggml_ext_scale16* s) {
    w.scale = block_lanes([&](int k) { return s[k].scale; });
    if constexpr (kOffset) w.offset = block_lanes([&](int k) { return signed_offset(s[k]); }) + w.scale * kCenter;
  }
  template <class Value>
  static inline __attribute__((always_inline)) vf32x16 block_lanes(Value value) {
    static_assert(kBlocks == 8);
    const __m256 v = _mm256_setr_ps(value(0), value(1), value(2), value(3), value(4), value(5), value(6), value(7));
    const __m512i spread = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return (vf32x16)_mm512_permutexvar_ps(spread, _mm512_castps256_ps512(v));
  }

  // The last blocks of a row of 32-element blocks when fewer than a span remain: decoded chunk by chunk and
  // put in span order (zero codes and scales for the missing blocks, whose activations are zero).
  void load_tail(SpanWeights<Q>& w, const uint8_t* p, int n_blocks) const {
    alignas(64) int8_t natural[S] = {}, spanned[S];
    ggml_ext_scale16 s[kBlocks] = {};
    const ChunkCodes<Q, kOffset> chunks;
    for (int k = 0; k < n_blocks; ++k) {
      const uint8_t* b = p + k * sizeof(B);
      const vi8x16 c0 = chunks.template chunk<0, 0>(b) + chunks.kShift;
      const vi8x16 c1 = chunks.template chunk<0, 1>(b) + chunks.kShift;
      std::memcpy(natural + Q::kQK * k, &c0, 16);
      std::memcpy(natural + Q::kQK * k + 16, &c1, 16);
      s[k] = Q::scale(reinterpret_cast<const B*>(b), 0);
    }
    for (int e = 0; e < S; ++e) spanned[span_position<S>(e)] = natural[e];
    for (int g = 0; g < kRegs; ++g) w.w[g] = load_vec<vi8x64>(spanned + 64 * g);
    set_block_scales(w, s);
    w.finish();
  }

  // Blocks [begin, end) of the weight row (begin a multiple of the span).
  void run(const uint8_t* row, int64_t begin, int64_t end, float* res) {
    Acc acc = {};
    const SpanRecord<S>* x = rec + begin / kBlocks * stride;
    int64_t blk = begin;
    SpanWeights<Q> w;
    for (; blk + kBlocks <= end; blk += kBlocks, x += stride) {
      const uint8_t* p = row + blk * sizeof(B);
      prefetch_ahead<(kBlocks * sizeof(B) + 63) / 64>(p);
      load(w, p);
      step(acc, w, x);
    }
    if constexpr (kBlocks > 1) {
      if (blk < end) {
        load_tail(w, row + blk * sizeof(B), static_cast<int>(end - blk));
        step(acc, w, x);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = hsum(acc[r]);  // AVX-512: vf32 is 16 lanes
  }
};
#endif

// The row dots on activations in groups (QuantizedRows), with the weight decoders they take: on AVX-512 VNNI
// only where spans do not pay (one row of x; Q8_0 up to 4), where the 256-bit kernel was measured on Zen 4
// (which executes 512-bit operations in two halves) at 1.0-1.6x the speed of a 512-bit one.
template <class Q, bool kOffset>
struct RowCodes {
#if defined(__AVX2__)
  HalfCodes<Q, kOffset> half;
#else
  ChunkCodes<Q, kOffset> chunk;
#endif
};

#if defined(__AVX2__)
template <class Q, int MR, bool kOffset>
using RowDot = HalfRowDot<Q, MR, kOffset>;
#else
template <class Q, int MR, bool kOffset>
using RowDot = ChunkRowDot<Q, MR, kOffset>;
#endif

// Float weights: rows of x in float32, padded to whole rows of the tile.
template <class WFmt, int MR>
void float_row_dot(const typename WFmt::T* w, int64_t K, const float* x, int64_t ldx, float* res) {
  vf32 acc0[MR] = {}, acc1[MR] = {};
  int64_t k = 0;
  for (; k + 2 * kLanes <= K; k += 2 * kLanes) {
    const vf32 w0 = WFmt::load(w + k), w1 = WFmt::load(w + k + kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      acc0[r] += w0 * F32::load(x + r * ldx + k);
      acc1[r] += w1 * F32::load(x + r * ldx + k + kLanes);
    }
  }
  for (; k + kLanes <= K; k += kLanes) {
    const vf32 w0 = WFmt::load(w + k);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc0[r] += w0 * F32::load(x + r * ldx + k);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float s = hsum(acc0[r] + acc1[r]);
    for (int64_t t = k; t < K; ++t) s += WFmt::to_f32(w[t]) * x[r * ldx + t];
    res[r] = s;
  }
}

// ---------------------------------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------------------------------
// Calls body<MR>() with MR the tile instance for `rows` (1, 2, 4 or 8; the activations are padded with zero
// rows up to a multiple of 8, so the extra rows read zeros and their results are dropped).
template <class Body>
inline void with_tile(int64_t rows, Body&& body) {
  switch (tile_rows_for(rows)) {
    case 1: return body.template operator()<1>();
    case 2: return body.template operator()<2>();
    case 4: return body.template operator()<4>();
    default: return body.template operator()<8>();
  }
}

int64_t padded_rows(int64_t M) { return (M + kTileRows - 1) / kTileRows * kTileRows; }

// Walks the (row tile, weight row) pairs of the forward product over the thread pool: weight rows split
// across threads, each thread's rows taken in cache-sized slices, every row tile of x against each slice, and
// K in segments whose activations stay in L2 (`act_bytes` per element and row) while the weights stream.
template <class DotTile>
void forward_tiles(const MatmulArgs& a, int64_t row_bytes, int64_t act_bytes, DotTile&& dot_tile) {
  const int64_t slice = std::max<int64_t>(1, kL2WeightBytes / std::max<int64_t>(1, row_bytes));
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, a.K));
  const int64_t tile_rows = std::min<int64_t>(kTileRows, a.M);
  const int64_t segment = std::max<int64_t>(kSegmentAlign, kActivationBytes / (tile_rows * act_bytes) /
                                                               kSegmentAlign * kSegmentAlign);
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(a.N, grain, [&](int64_t n0, int64_t n1) {
      float res[kTileRows];
      std::vector<float> sums(std::min(slice, n1 - n0) * kTileRows);
      for (int64_t s0 = n0; s0 < n1; s0 += slice) {
        const int64_t s1 = std::min(n1, s0 + slice);
        for (int64_t m0 = 0; m0 < a.M; m0 += kTileRows) {
          const int64_t rows = std::min<int64_t>(kTileRows, a.M - m0);
          std::fill(sums.begin(), sums.end(), 0.0f);
          for (int64_t k0 = 0; k0 < a.K; k0 += segment) {
            for (int64_t n = s0; n < s1; ++n) {
              dot_tile(n, m0, rows, k0, std::min(a.K, k0 + segment), res);
              for (int64_t r = 0; r < rows; ++r) sums[(n - s0) * kTileRows + r] += res[r];
            }
          }
          for (int64_t n = s0; n < s1; ++n) {
            for (int64_t r = 0; r < rows; ++r) out[(m0 + r) * a.N + n] = Out::from_f32(sums[(n - s0) * kTileRows + r]);
          }
        }
      }
    });
  });
}

// The forward product on quantized activations: x's rows quantized into `act` (quantize_row, rows over the
// threads), then every (row tile, weight row) through the row dot Dot<Q, MR, kOffset> (act_bytes: the
// activations' bytes per element and row).
template <template <class, int, bool> class Dot, class Q, bool kOffset, class Act, class Codes>
void forward_on_rows(const MatmulArgs& a, Act&& act, const Codes& codes, int64_t act_bytes) {
  act.resize(a.M, a.K);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    parallel_for(a.M, std::max<int64_t>(1, 16384 / a.K), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize_row<In>(x + m * a.K, a.K, act, m);
    });
  });
  const int64_t row_bytes = a.K / Q::kQK * sizeof(typename Q::B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  forward_tiles(a, row_bytes, act_bytes, [&](int64_t n, int64_t m0, int64_t rows, int64_t k0, int64_t k1,
                                             float* res) {
    with_tile(rows, [&]<int MR>() {
      Dot<Q, MR, kOffset>(act, m0, codes).run(w + n * row_bytes, k0 / Q::kQK, k1 / Q::kQK, res);
    });
  });
}

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
template <class Q, bool kOffset>
void forward_spans(const MatmulArgs& a) {
  constexpr int S = kSpan<Q>;
  forward_on_rows<SpanRowDot, Q, kOffset>(a, SpanRows<S>{}, SpanCodes<Q, kOffset>{},
                                          (sizeof(SpanRecord<S>) + S - 1) / S);
}
#endif

template <class Q, bool kOffset>
void forward_quantized(const MatmulArgs& a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
  // Spans pay once the per-row float work outweighs their decode: from 2 rows of x; for Q8_0, whose split gathers
  // cost more, from 5. Q8_0 in 256-element spans against the 128-element ones they replaced (this 2-core VM,
  // alternating runs, bench_matmul.py, 14336x4096 and 4096x14336): 8 rows 0.77-0.95x the time in 7 of 8 pairs
  // (1.02x in one); 2 rows 0.94-1.39x, 4 rows 1.05-1.21x, so the group kernels keep up to 4.
  if (a.M > (kSplitSpan<Q> ? 4 : 1)) return forward_spans<Q, kOffset>(a);
#endif
  forward_on_rows<RowDot, Q, kOffset>(a, QuantizedRows{}, RowCodes<Q, kOffset>{}, sizeof(ActRecord) / kGroup);
}

template <class Q>
void forward_quantized(const MatmulArgs& a) {
  if (has_offset<Q>()) {
    forward_quantized<Q, true>(a);
  } else {
    forward_quantized<Q, false>(a);
  }
}

// x as float32 rows (zero rows appended up to a multiple of the tile).
std::vector<float> float_rows(const MatmulArgs& a, int64_t cols) {
  std::vector<float> xf(padded_rows(a.M) * cols, 0.0f);
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    for (int64_t i = 0; i < a.M * cols; ++i) xf[i] = In::to_f32(x[i]);
  });
  return xf;
}

template <class WFmt>
void forward_float(const MatmulArgs& a) {
  const std::vector<float> xf = float_rows(a, a.K);
  const auto* w = static_cast<const typename WFmt::T*>(a.w);
  forward_tiles(a, a.K * sizeof(typename WFmt::T), sizeof(float), [&](int64_t n, int64_t m0, int64_t rows,
                                                                         int64_t k0, int64_t k1, float* res) {
    with_tile(rows, [&]<int MR>() {
      float_row_dot<WFmt, MR>(w + n * a.K + k0, k1 - k0, xf.data() + m0 * a.K + k0, a.K, res);
    });
  });
}

// The transposed product out (M, K) = x (M, N) @ W (N, K): threads own strips of whole blocks of K; each
// decodes its strip of every weight row once and adds it, times x[:, n], into an accumulator strip.
template <class DecodeStrip>
void transposed(const MatmulArgs& a, int64_t block, DecodeStrip&& decode) {
  std::vector<float> xt(a.N * a.M);  // x transposed: column n of x is contiguous
  GGML_EXT_FLOAT_SWITCH(a.x_type, In, {
    const auto* x = static_cast<const typename In::T*>(a.x);
    for (int64_t m = 0; m < a.M; ++m) {
      for (int64_t n = 0; n < a.N; ++n) xt[n * a.M + m] = In::to_f32(x[m * a.N + n]);
    }
  });
  const int64_t n_blocks = a.K / block;
  // Strips of at most ~128 KB of accumulators.
  const int64_t strip_blocks =
      std::max<int64_t>(1, std::min<int64_t>(n_blocks, (int64_t(32) << 10) / std::max<int64_t>(1, a.M * block)));
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(n_blocks, strip_blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t s0 = b0; s0 < b1; s0 += strip_blocks) {
        const int64_t s1 = std::min(b1, s0 + strip_blocks), width = (s1 - s0) * block;
        std::vector<float> acc(a.M * width, 0.0f), w(width);
        for (int64_t n = 0; n < a.N; ++n) {
          decode(n, s0, s1, w.data());
          const float* xn = xt.data() + n * a.M;
          for (int64_t m = 0; m < a.M; ++m) {
            const vf32 c = splat(xn[m]);
            float* dst = acc.data() + m * width;
            int64_t k = 0;
            for (; k + kLanes <= width; k += kLanes) F32::store(dst + k, F32::load(dst + k) + c * F32::load(w.data() + k));
            for (; k < width; ++k) dst[k] += xn[m] * w[k];
          }
        }
        for (int64_t m = 0; m < a.M; ++m) {
          for (int64_t k = 0; k < width; ++k) out[m * a.K + s0 * block + k] = Out::from_f32(acc[m * width + k]);
        }
      }
    });
  });
}

inline void store_values16(float* y, const vf32x16& v) { std::memcpy(y, &v, sizeof v); }

template <class Q>
void transposed_quantized(const MatmulArgs& a) {
  using B = typename Q::B;
  const int64_t row_bytes = a.K / Q::kQK * sizeof(B);
  const auto* w = static_cast<const uint8_t*>(a.w);
  const vi8x16 table = codebook_table(Q::layout(0).codebook);
  transposed(a, Q::kQK, [&](int64_t n, int64_t b0, int64_t b1, float* dst) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const uint8_t* p = w + n * row_bytes + blk * sizeof(B);
      float* y = dst + (blk - b0) * Q::kQK;
      [&]<int... C>(std::integer_sequence<int, C...>) {
        (store_values16(y + 16 * C, values16(codes16(p, Q::layout(C), table), Q::scale(reinterpret_cast<const B*>(p), C))),
         ...);
      }(std::make_integer_sequence<int, Q::kQK / 16>{});
    }
  });
}

template <class WFmt>
void transposed_float(const MatmulArgs& a) {
  const auto* w = static_cast<const typename WFmt::T*>(a.w);
  transposed(a, 1, [&](int64_t n, int64_t k0, int64_t k1, float* dst) {
    const auto* src = w + n * a.K;
    for (int64_t k = k0; k < k1; ++k) dst[k - k0] = WFmt::to_f32(src[k]);
  });
}

void zero_output(const MatmulArgs& a, int64_t count) {
  std::memset(a.out, 0, count * float_type_bytes(a.out_type));
}

#define GGML_EXT_MATMUL_CASE(NAME, name, id, qk, bytes)                             \
  case GGML_EXT_TYPE_##NAME:                                                        \
    return a.transpose ? transposed_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a)   \
                       : forward_quantized<GGML_EXT_BLOCK_FORMAT(name, qk)>(a);

}  // namespace

void quantized_matmul(const MatmulArgs& a) {
  if (a.M == 0) return;
  // An empty sum: zeros (forward with K == 0, transposed with N == 0).
  if (!a.transpose && a.K == 0) return zero_output(a, a.M * a.N);
  if (a.transpose && a.N == 0) return zero_output(a, a.M * a.K);
  if (a.N == 0 || a.K == 0) return;
  switch (a.w_type) {
    case GGML_EXT_TYPE_F32: return a.transpose ? transposed_float<F32>(a) : forward_float<F32>(a);
    case GGML_EXT_TYPE_F16: return a.transpose ? transposed_float<F16>(a) : forward_float<F16>(a);
    case GGML_EXT_TYPE_BF16: return a.transpose ? transposed_float<BF16>(a) : forward_float<BF16>(a);
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_MATMUL_CASE)
    default: return;  // the primitive validated the type
  }
}
#undef GGML_EXT_MATMUL_CASE

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(quantized_matmul, MatmulArgs)

}  // namespace ggml_ext::cpu
