// The group row dot on AVX2 (HalfRowDot, also AVX-512's for one row of x): half a group per 256-bit step, with
// the AVX2 forms of the chunk scales (HalfScales) and the K-quants' integer scales (IntChunkScales).
#pragma once
#include <bit>
#include <cstring>
#include <utility>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_block_scales.h"
#include "kernels/cpu/matmul_common.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

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

// A row's 8 lane sums added pairwise (halves, then pairs): the order every AVX2 row dot ends with.
inline __attribute__((always_inline)) float pairwise_sum(vf32x8 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class Q, bool kOffset>
struct HalfCodes {
  using Form = CodeForm<Q, kOffset>;
  static constexpr bool kUnsigned = Form::kUnsigned;
  static constexpr int kZero = Form::kZero;
  __m256i table = _mm256_broadcastsi128_si256((__m128i)Form::table());
  ChunkCodes<Q, kOffset> chunks;

  // The bytes at `offset` (and `offset + 16`) shifted right per chunk: elements in the low bits (the callers mask
  // off what the shift brings in from the next byte).
  template <int Offset0, int Shift0, int Offset1, int Shift1>
  static inline __attribute__((always_inline)) __m256i window(const uint8_t* base) {
    if constexpr (Offset1 == Offset0 + 16 && Shift0 == Shift1) {
      return _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Offset0)), Shift0);
    } else if constexpr (Offset1 == Offset0) {
      // Both chunks in the same 16 bytes (the low and high nibbles of Q4_0, IQ4_NL, IQ4_XS, ...): the bytes
      // broadcast to both halves by the load, and one shift by lane, instead of a shift and an insert.
      const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + Offset0)));
      return _mm256_srlv_epi32(v, _mm256_setr_epi32(Shift0, Shift0, Shift0, Shift0, Shift1, Shift1, Shift1, Shift1));
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
      // The high bits straight into place, one shift by hi_shift - hi_pos (K-quants' qh/hmask: 32 bytes, the
      // same shift for both chunks), when what the 16-bit shift brings over from the neighbouring byte falls
      // outside the mask: Q3_K 158 -> 146 instructions a block. Otherwise shifted down, masked and shifted up.
      constexpr int net = a.hi_shift - a.hi_pos;
      constexpr int placed_mask = a.hi_mask << a.hi_pos, mask_top = std::bit_width(static_cast<unsigned>(placed_mask));
      constexpr bool one_shift = b.hi == a.hi + 16 && b.hi_shift == a.hi_shift &&
                                 (net >= 0 ? mask_top <= 8 - net : a.hi_pos >= -net);
      if constexpr (one_shift) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + a.hi));
        const __m256i placed = net >= 0 ? _mm256_srli_epi16(v, net) : _mm256_slli_epi16(v, -net);
        part = _mm256_or_si256(part, _mm256_and_si256(placed, _mm256_set1_epi8(static_cast<char>(placed_mask))));
      } else {
        const __m256i hi = _mm256_and_si256(window<a.hi, a.hi_shift, b.hi, b.hi_shift>(base),
                                            _mm256_set1_epi8(static_cast<char>(a.hi_mask)));
        part = _mm256_or_si256(part, _mm256_slli_epi16(hi, a.hi_pos));  // hi_mask << hi_pos fits in the byte
      }
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
};

// The 8 scales and 8 mins of k4_scale_min_bytes as floats.
inline __attribute__((always_inline)) void k4_scale_min_floats(vu8x16 bytes, vf32x8& scale, vf32x8& min) {
  scale = (vf32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32((__m128i)bytes));
  min = (vf32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128((__m128i)bytes, 8)));
}

// Q4_K and Q5_K: one scale and min per 32-element sub-block, i.e. per half (HalfRowDot's kHalfScaleProducts).
template <class Q>
constexpr bool kSubBlockScales = false;
template <>
constexpr bool kSubBlockScales<GGML_EXT_BLOCK_FORMAT(q4_k, 256)> = true;
template <>
constexpr bool kSubBlockScales<GGML_EXT_BLOCK_FORMAT(q5_k, 256)> = true;

// 256-element formats whose chunk scales are small integers times one float per block (the K-quants and IQ4_XS):
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
struct K4IntScales {
  static constexpr bool kHas = true;
  static constexpr bool kSubBlockSums = true;  // sums per 32-element sub-block (sub_scale, sub_min)
  vf32x8 sub_scale, sub_min;                    // the 8 scales and mins as floats (without d, dmin)
  float d, dmin;
  // Sub-block j's scale in both int16 halves of word j: half j's multiplier is one broadcast load of it
  // (a half is one sub-block), where a byte shuffle per half would compete with the codes' shuffles.
  alignas(32) int32_t scale_pairs[8];

  inline __attribute__((always_inline)) void load_block(const B* b) {
    const vu8x16 sub = k4_scale_min_bytes(b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(scale_pairs),
                       _mm256_cvtepu8_epi16((__m128i)__builtin_shufflevector(sub, sub, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4,
                                                                              5, 5, 6, 6, 7, 7)));
    asm("" : "+m"(scale_pairs));  // kept in memory: GCC would otherwise extract each word with two shuffles
    k4_scale_min_floats(sub, sub_scale, sub_min);
    d = GGML_EXT_HALF_TO_FLOAT(b->d);
    dmin = GGML_EXT_HALF_TO_FLOAT(b->dmin);
  }
  template <int H>
  inline __attribute__((always_inline)) __m256i half() const {
    return _mm256_set1_epi32(scale_pairs[H]);
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
// IQ4_XS: with its scales unpacked one at a time this gained nothing (160.7 / 162.2 us, 256x4096, one row of x,
// Zen 3); with the byte-lane unpacking of iq4xs_scale_bytes it is measured in the commit that added both.
template <>
struct IntChunkScales<GGML_EXT_BLOCK_FORMAT(iq4_xs, 256)> : IntChunkScalesBase {
  inline __attribute__((always_inline)) void load_block(const block_iq4_xs* b) {
    set((vi8x16)(iq4xs_scale_bytes(b) - 32), GGML_EXT_HALF_TO_FLOAT(b->d));
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
#if defined(__AVX512VNNI__)
  // Q4_K and Q5_K: one scale per half, applied in float per half (see run).
  static constexpr bool kHalfScaleProducts = kOffset && kSubBlockScales<Q>;
#else
  static constexpr bool kHalfScaleProducts = false;  // the integer-scale path (IntChunkScales) instead
#endif
  // Independent FMA chains of the 256-element paths (FMA latency 4 cycles): with one row of x a block's 8 halves
  // would otherwise wait on each other.
  static constexpr int kChains = MR == 1 ? 4 : MR == 2 ? 2 : 1;
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

  // The chains' sums per row of x, into acc.
  static inline __attribute__((always_inline)) void fold_chains(Acc& acc, Acc (&chains)[kChains]) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      for (int c = 1; c < kChains; ++c) chains[0][r] += chains[c][r];
      acc[r] = chains[0][r];
    }
  }

  // Half H (0..7) of a block with 16 chunk scales: chunks 2H and 2H + 1's products with x's scale, 4 lanes each.
  template <int H>
  static inline __attribute__((always_inline)) void chunk_pair_half(Acc& acc, __m256i w, const vf32x8 (*products)[2],
                                                                   const ActRecord* rec, int h) {
    constexpr int c = 2 * H % 8;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf32x8 p = products[r][H / 4];
      acc[r] += __builtin_convertvector((vi32x8)Codes::dot(w, rec[r].q + 32 * h), vf32x8) *
                __builtin_shufflevector(p, p, c, c, c, c, c + 1, c + 1, c + 1, c + 1);
    }
  }

  // Half h of a record with one scale per half and row of x (products[r][c]: the half's scale times x's).
  static inline __attribute__((always_inline)) void product_half(Acc& acc, __m256i w, const vf32x8* products,
                                                                int c, const ActRecord* rec, int h) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf32x8 scale = (vf32x8)_mm256_permutexvar_ps(_mm256_set1_epi32(c), (__m256)products[r]);
      acc[r] += __builtin_convertvector((vi32x8)Codes::dot(w, rec[r].q + 32 * h), vf32x8) * scale;
    }
  }

  // What 256-element block blk adds beyond the codes' dot, from its float chunk scales and offsets.
  inline __attribute__((always_inline)) void block_chunk_sums(Acc& sums_acc, const HalfScales<Q>& sc,
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
      // Four blocks at a time for the chunk sums (8 chunks, one vector), one by one for the codes. Odd blocks
      // add into a second chain of FMAs: with one, each block waited for the previous one's FMA (4 cycles on
      // Zen 3), the bound of one row of x at small K.
      Acc acc_odd = {};
      float scale[4], offset[4];
      int64_t blk = begin;
      // block b is half b % 2 of group b / 2 (begin is even: segments hold whole groups)
      auto one = [&](int64_t b, const ActRecord* rec, int h, int i) __attribute__((always_inline)) {
        const uint8_t* p = row + b * sizeof(B);
        const auto s = Q::scale(reinterpret_cast<const B*>(p), 0);
        scale[i] = s.scale;
        offset[i] = signed_offset(s) + s.scale * kCenter;
        half(i % 2 ? acc_odd : acc, codes.template decode<0, 0>(p), (vf32x8)_mm256_set1_ps(s.scale), rec, h);
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
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r] += acc_odd[r];
    } else if constexpr (kHalfScaleProducts) {
      // Q4_K, Q5_K with VNNI: one scale per half (its sub-block's), so the float work of a half is a permute of its
      // lane of the block's scale products (sub-block scale times x's block scale, one multiply per block and row
      // of x), a conversion and an FMA; the centering and the mins are applied per sub-block from x's block sums,
      // as in the integer-scale path. The half-by-half float path this replaced (a chunk-scale broadcast, a
      // multiply and a dependent FMA per half, the 16-chunk sums per block: ~123 instructions a block, now ~94)
      // ran Q4_K 2048 x 2048, one row of x, one thread, Zen 4, at 0.174-0.209 ms, this one 0.129-0.131
      // (bench/cpu_kernel_driver.cpp; tried and slower: docs/performance.md).
      static_assert(Codes::kZero == static_cast<int>(kCenter));
      Acc chains[kChains] = {};
      vf32x8 products[MR];
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        prefetch_ahead<3>(p);
        const B* b = reinterpret_cast<const B*>(p);
        vf32x8 sub_scale, sub_min;
        k4_scale_min_floats(k4_scale_min_bytes(b), sub_scale, sub_min);
        sub_scale *= GGML_EXT_HALF_TO_FLOAT(b->d);
        sub_min *= GGML_EXT_HALF_TO_FLOAT(b->dmin);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) products[r] = sub_scale * load_vec<vf32x8>(chunk_sums.block_d_of(r, 8 * blk));
        const ActRecord* rec = tile.records(blk * 4);
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          (product_half(chains[C % kChains], codes.template decode<C / 2, C % 2>(p), products, C,
                        rec + C / 2 * tile.stride, C % 2),
           ...);
        }(std::make_integer_sequence<int, 8>{});
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          sums_acc[r] += sub_scale * (load_vec<vf32x8>(chunk_sums.block_residual_of(r, 8 * blk)) * kCenter) -
                         sub_min * load_vec<vf32x8>(chunk_sums.block_x_of(r, 8 * blk));
        }
      }
      fold_chains(acc, chains);
    } else if constexpr (IntChunkScales<Q>::kHas) {
      // At 8 rows of x the block accumulators and the row accumulators (and Q6_K's sums) take more than AVX2's 16
      // vector registers, so GCC keeps some on the stack, touched once per block; the float path this replaced
      // at 5-8 rows multiplied each half's chunk scale by x's scale, one vmulps per row and half (64 a block).
      // Prefill-sized products (256 rows of x, 2 threads, Zen 3, bench/cpu_kernel_driver.cpp alternated, 4
      // rounds, medians of 5 products each): Q4_K 8192 x 2048 92.7 -> 82.0 ms, Q6_K 2048 x 8192 95.3 -> 88.9.
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
          HalfScales<Q> sc;  // float chunk scales and offsets, for the sums
          sc.load_block(reinterpret_cast<const B*>(p));
          block_chunk_sums(sums_acc, sc, blk);
        }
      }
    } else {
      // 16 chunk scales a block (Q6_K, Q3_K, Q2_K, IQ4_XS, TQ2_0, the grid types' staged blocks): per block and row
      // of x the chunk scales times x's block scales (two multiplies), so a half's float work is the permute of
      // its two chunks' products, a conversion and an FMA, in 4 chains with one row of x. The per-half multiply
      // by x's scale and the one chain this replaces: Q6_K 2048 x 2048, one row of x, one thread, Zen 4 (AVX-512
      // variant, min of 41 in 4 alternated pairs on a noisy VM): 0.182-0.221 ms -> 0.166-0.213.
      Acc chains[kChains] = {};
      HalfScales<Q> sc;
      for (int64_t blk = begin; blk < end; ++blk) {
        const uint8_t* p = row + blk * sizeof(B);
        prefetch_ahead<3>(p);
        sc.load_block(reinterpret_cast<const B*>(p));
        vf32x8 products[MR][2];  // chunk c's scale times its block's x scale at [c / 8][c % 8]
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const vf32x8 d = load_vec<vf32x8>(chunk_sums.block_d_of(r, 8 * blk));
          products[r][0] = sc.scale[0] * __builtin_shufflevector(d, d, 0, 0, 1, 1, 2, 2, 3, 3);
          products[r][1] = sc.scale[1] * __builtin_shufflevector(d, d, 4, 4, 5, 5, 6, 6, 7, 7);
        }
        const ActRecord* rec = tile.records(blk * 4);
        [&]<int... C>(std::integer_sequence<int, C...>) __attribute__((always_inline)) {
          // C: the block's halves; chunks 2C and 2C + 1 of group C / 2
          (chunk_pair_half<C>(chains[C % kChains], codes.template decode<C / 2, C % 2>(p), products,
                              rec + C / 2 * tile.stride, C % 2),
           ...);
        }(std::make_integer_sequence<int, 8>{});
        if constexpr (kSums) block_chunk_sums(sums_acc, sc, blk);
      }
      fold_chains(acc, chains);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = pairwise_sum(acc[r] + sums_acc[r]);
  }
};

#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
