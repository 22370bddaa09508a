// The product kernels of the packed 32-element formats, Q4_0_R8, IQ4_NL_R8, Q5_0_R8 and Q8_0_R8
// (kernels/cpu/packed_rows.h); the driver is in matmul_packed_rows.h. Per block and row, with c the codes as
// unsigned bytes, o the format's offset (Q8_0: its signed codes flipped by 128; Q4_0 / Q5_0: codes 0..15 / 0..31
// stand for c - 8 / c - 16; IQ4_NL: its codebook's signed values flipped by 128) and q x's codes over the same 32
// elements (one activation scale dx):
//     sum_i w_i x_i = d (dx * sum_i c_i q_i - o Q)
// where Q = dx sum_i q_i (the codes' sum, as the plain kernels take it): the unsigned-by-signed dot on the codes as
// stored, and the offset taken off once per block. The formats differ only in how a unit's 64 code bytes are
// loaded (CodesOf below; an object, as IQ4_NL's holds its codebook in a register).
#pragma once
#include <cstdint>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_packed_lanes.h"
#include "kernels/cpu/packed_rows.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
#define GGML_EXT_PACKED_QK32_SIMD 1
#define GGML_EXT_PACKED_QK32_AVX2 0
#elif defined(__AVX2__)
#define GGML_EXT_PACKED_QK32_SIMD 0
#define GGML_EXT_PACKED_QK32_AVX2 1
#else
#define GGML_EXT_PACKED_QK32_SIMD 0
#define GGML_EXT_PACKED_QK32_AVX2 0
#endif

// The nibble of element 8 u + i of row r (units 0, 1: low nibbles of vectors 0, 1; units 2, 3: their high ones).
inline int nibble(const uint8_t (&qs)[2][8][8], int u, int r, int i) {
  return u < 2 ? qs[u][r][i] & 0xF : qs[u & 1][r][i] >> 4;
}
#if GGML_EXT_PACKED_QK32_SIMD
inline void load_nibbles(const uint8_t (&qs)[2][8][8], __m512i codes[4]) {
  const __m512i low = _mm512_set1_epi8(0xF);
  for (int h = 0; h < 2; ++h) {
    const __m512i v = _mm512_loadu_si512(qs[h]);
    codes[h] = _mm512_and_si512(v, low);
    codes[h + 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  }
}
#endif

#if GGML_EXT_PACKED_QK32_AVX2
// AVX2 works on half a unit at a time: rows 4 h .. 4 h + 3 (32 bytes). The nibbles of that half of every unit.
inline void load_nibbles(const uint8_t (&qs)[2][8][8], int h, __m256i codes[4]) {
  const __m256i low = _mm256_set1_epi8(0xF);
  for (int v = 0; v < 2; ++v) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[v][4 * h]));
    codes[v] = _mm256_and_si256(w, low);
    codes[v + 2] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
  }
}
#endif

// Per format: the offset of its codes, one code (portable), the codes of a block (AVX-512: 4 units of 64 bytes,
// unsigned), half of them (AVX2: 4 units' rows 4 h .. 4 h + 3; kSignedHalf: as the signed values, whose products
// maddubs takes by the sign trick, since unsigned codes up to 255 would saturate its int16 pairs).
template <class Packed>
struct CodesOf;
template <>
struct CodesOf<block_q8_0_r8> {
  static constexpr float kOffset = 128.0f;
  int code(const block_q8_0_r8& B, int u, int r, int i) const { return B.qs[u][r][i] + 128; }
#if GGML_EXT_PACKED_QK32_SIMD
  void load(const block_q8_0_r8& B, __m512i codes[4]) const {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int u = 0; u < 4; ++u) codes[u] = _mm512_xor_si512(_mm512_loadu_si512(B.qs[u]), flip);
  }
#endif
#if GGML_EXT_PACKED_QK32_AVX2
  static constexpr bool kSignedHalf = true;
  void load_half(const block_q8_0_r8& B, int h, __m256i codes[4]) const {
    for (int u = 0; u < 4; ++u) codes[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B.qs[u][4 * h]));
  }
#endif
};
template <>
struct CodesOf<block_q4_0_r8> {
  static constexpr float kOffset = 8.0f;
  int code(const block_q4_0_r8& B, int u, int r, int i) const { return nibble(B.qs, u, r, i); }
#if GGML_EXT_PACKED_QK32_SIMD
  void load(const block_q4_0_r8& B, __m512i codes[4]) const { load_nibbles(B.qs, codes); }
#endif
#if GGML_EXT_PACKED_QK32_AVX2
  static constexpr bool kSignedHalf = false;
  void load_half(const block_q4_0_r8& B, int h, __m256i codes[4]) const { load_nibbles(B.qs, h, codes); }
#endif
};
template <>
struct CodesOf<block_iq4_nl_r8> {
  static constexpr float kOffset = 128.0f;
  int code(const block_iq4_nl_r8& B, int u, int r, int i) const {
    return ggml_ext_iq4nl_value(nibble(B.qs, u, r, i)) + 128;
  }
#if GGML_EXT_PACKED_QK32_SIMD
  // The codebook flipped to unsigned (value + 128), in every 128-bit lane: one byte shuffle per unit looks its
  // nibbles up.
  const __m512i table = [] {
    alignas(16) uint8_t t[16];
    for (int k = 0; k < 16; ++k) t[k] = static_cast<uint8_t>(ggml_ext_iq4nl_value(k) + 128);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }();
  void load(const block_iq4_nl_r8& B, __m512i codes[4]) const {
    load_nibbles(B.qs, codes);
    for (int u = 0; u < 4; ++u) codes[u] = _mm512_shuffle_epi8(table, codes[u]);
  }
#endif
#if GGML_EXT_PACKED_QK32_AVX2
  // The codebook's signed values in both 128-bit lanes, looked up by one byte shuffle per unit.
  static constexpr bool kSignedHalf = true;
  const __m256i values = [] {
    alignas(16) int8_t t[16];
    for (int k = 0; k < 16; ++k) t[k] = static_cast<int8_t>(ggml_ext_iq4nl_value(k));
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }();
  void load_half(const block_iq4_nl_r8& B, int h, __m256i codes[4]) const {
    load_nibbles(B.qs, h, codes);
    for (int u = 0; u < 4; ++u) codes[u] = _mm256_shuffle_epi8(values, codes[u]);
  }
#endif
};
template <>
struct CodesOf<block_q5_0_r8> {
  static constexpr float kOffset = 16.0f;
  int code(const block_q5_0_r8& B, int u, int r, int i) const {
    return nibble(B.qs, u, r, i) | (((B.qh[u][r] >> i) & 1) << 4);
  }
#if GGML_EXT_PACKED_QK32_SIMD
  void load(const block_q5_0_r8& B, __m512i codes[4]) const {
    load_nibbles(B.qs, codes);
    const __m512i fifth = _mm512_set1_epi8(0x10);
    for (int u = 0; u < 4; ++u) {
      const __mmask64 set = _cvtu64_mask64(load_vec<unsigned long long>(B.qh[u]));
      codes[u] = _mm512_mask_add_epi8(codes[u], set, codes[u], fifth);
    }
  }
#endif
#if GGML_EXT_PACKED_QK32_AVX2
  // The half's 32 fifth bits (bit 8 r + i: row 4 h + r, element i of the unit) spread to one byte each: byte j
  // takes the bits' byte j / 8 and keeps bit j % 8, which a compare turns into 0x10 or 0.
  static constexpr bool kSignedHalf = false;
  void load_half(const block_q5_0_r8& B, int h, __m256i codes[4]) const {
    load_nibbles(B.qs, h, codes);
    const __m256i byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i fifth = _mm256_set1_epi8(0x10);
    for (int u = 0; u < 4; ++u) {
      const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(load_vec<int>(B.qh[u] + 4 * h)), byte_of_bit);
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, bit_of_byte), bit_of_byte);
      codes[u] = _mm256_or_si256(codes[u], _mm256_and_si256(set, fifth));
    }
  }
#endif
};

#if GGML_EXT_PACKED_QK32_SIMD
template <int MR, class Packed>
  requires requires { CodesOf<Packed>::kOffset; }
inline void packed_dot(const Packed* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums& sums,
                       float* res) {
  using Codes = CodesOf<Packed>;
  const Codes codes_of;
  const __m512i pair_lanes = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  __m512 acc[MR];
  __m256 acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps(), acc_offsets[m] = _mm256_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const Packed& B = blk[b];
    prefetch_ahead<(sizeof(Packed) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.d)));
    const __m512 d_pairs = _mm512_permutexvar_ps(pair_lanes, _mm512_castps256_ps512(d));
    __m512i codes[4];
    codes_of.load(B, codes);
    const ActRecord* rec = tile.records(b / 2);
    const int half = static_cast<int>(b & 1);
    for (int m = 0; m < MR; ++m) {
      const int8_t* q = rec[m].q + 32 * half;
      __m512i dot = _mm512_setzero_si512();
      for (int u = 0; u < 4; ++u) dot = _mm512_dpbusd_epi32(dot, codes[u], _mm512_set1_epi64(load_vec<long long>(q + 8 * u)));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d_pairs, _mm512_set1_ps(rec[m].d[half])), acc[m]);
      const float* code_sums = sums.q_of(m, 2 * b);
      acc_offsets[m] = _mm256_fmadd_ps(d, _mm256_set1_ps(code_sums[0] + code_sums[1]), acc_offsets[m]);
    }
  }
  for (int m = 0; m < MR; ++m) {  // the offset's term
    _mm256_storeu_ps(res + 8 * m,
                     _mm256_fmadd_ps(acc_offsets[m], _mm256_set1_ps(-Codes::kOffset), rows_of_lane_pairs(acc[m])));
  }
}
#elif GGML_EXT_PACKED_QK32_AVX2
// AVX2: per half of a block (rows 0-3, 4-7) and row of x, maddubs of the 4 units against 8 broadcast activation
// bytes each into int16 pairs, then one madd into int32 lanes (a pair per row). Unsigned codes (Q4_0, Q5_0: at most
// 31) let the 4 units add in int16 (4 * 2 * 31 * 127 < 32767) and take the offset's term as the AVX-512 kernel does;
// signed ones (Q8_0, IQ4_NL) go by the sign trick (|w| against x with w's sign), each unit's pairs into int32.
template <int MR, class Packed>
  requires requires { CodesOf<Packed>::kOffset; }
inline void packed_dot(const Packed* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums& sums,
                       float* res) {
  using Codes = CodesOf<Packed>;
  const Codes codes_of;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][2], acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = acc_offsets[m] = _mm256_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const Packed& B = blk[b];
    prefetch_ahead<(sizeof(Packed) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.d)));
    const ActRecord* rec = tile.records(b / 2);
    const int half = static_cast<int>(b & 1);
    for (int h = 0; h < 2; ++h) {
      __m256i codes[4];
      codes_of.load_half(B, h, codes);
      const __m256 d_pairs = half_pairs(d, h);
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = rec[m].q + 32 * half;
        __m256i dot;
        if constexpr (Codes::kSignedHalf) {
          dot = _mm256_setzero_si256();
          for (int u = 0; u < 4; ++u) {
            const __m256i x = _mm256_set1_epi64x(load_vec<long long>(q + 8 * u));
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(codes[u]), _mm256_sign_epi8(x, codes[u]));
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
          }
        } else {
          __m256i pairs = _mm256_setzero_si256();
          for (int u = 0; u < 4; ++u) {
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(codes[u], _mm256_set1_epi64x(load_vec<long long>(q + 8 * u))));
          }
          dot = _mm256_madd_epi16(pairs, ones);
        }
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d_pairs, _mm256_set1_ps(rec[m].d[half])),
                                    acc[m][h]);
      }
    }
    if constexpr (!Codes::kSignedHalf) {
      for (int m = 0; m < MR; ++m) {
        const float* code_sums = sums.q_of(m, 2 * b);
        acc_offsets[m] = _mm256_fmadd_ps(d, _mm256_set1_ps(code_sums[0] + code_sums[1]), acc_offsets[m]);
      }
    }
  }
  const float offset = Codes::kSignedHalf ? 0.0f : Codes::kOffset;
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(res + 8 * m, _mm256_fmadd_ps(acc_offsets[m], _mm256_set1_ps(-offset),
                                                  rows_of_half_pairs(acc[m][0], acc[m][1])));
  }
}
#else
// Portable: one element at a time.
template <int MR, class Packed>
  requires requires { CodesOf<Packed>::kOffset; }
inline void packed_dot(const Packed* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums&,
                       float* res) {
  using Codes = CodesOf<Packed>;
  const Codes codes_of;
  const int offset = static_cast<int>(Codes::kOffset);
  float acc[MR][kPackedRows] = {};
  for (int64_t b = b0; b < b1; ++b) {
    const Packed& B = blk[b];
    const ActRecord* rec = tile.records(b / 2);
    const int half = static_cast<int>(b & 1);
    for (int r = 0; r < kPackedRows; ++r) {
      const float d = GGML_EXT_HALF_TO_FLOAT(B.d[r]);
      for (int m = 0; m < MR; ++m) {
        int32_t dot = 0;
        for (int u = 0; u < 4; ++u) {
          for (int i = 0; i < 8; ++i) dot += (codes_of.code(B, u, r, i) - offset) * rec[m].q[32 * half + 8 * u + i];
        }
        acc[m][r] += d * (rec[m].d[half] * static_cast<float>(dot));
      }
    }
  }
  store_rows(acc, res);
}
#endif
#undef GGML_EXT_PACKED_QK32_SIMD
#undef GGML_EXT_PACKED_QK32_AVX2

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
