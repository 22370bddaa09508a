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
#else
#define GGML_EXT_PACKED_QK32_SIMD 0
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
};
template <>
struct CodesOf<block_q4_0_r8> {
  static constexpr float kOffset = 8.0f;
  int code(const block_q4_0_r8& B, int u, int r, int i) const { return nibble(B.qs, u, r, i); }
#if GGML_EXT_PACKED_QK32_SIMD
  void load(const block_q4_0_r8& B, __m512i codes[4]) const { load_nibbles(B.qs, codes); }
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
#else
// Portable (and the AVX2 variant's, which has no kernel of its own for these): one element at a time.
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

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
