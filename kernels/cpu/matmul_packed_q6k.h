// The product kernels of Q6_K_R8 (kernels/cpu/packed_rows.h); the driver is in matmul_packed_rows.h. Per
// 256-element block and row, with c the codes 0..63 (centre 32) and s a sub-block of 16
//     sum_i w_i x_i = d sc_s (dx * sum_i c_i q_i - 32 Q_s)
// (q: x's codes, dx their scale (per 32 elements), Q_s = dx sum_i q_i: the codes' sum, what the centre multiplies;
// the plain kernels' scheme for Q6_K). One unit of ql for t = 0 / 2, one for t = 1 / 3 and one of qh give 8
// elements of each of 8 rows for every t = 0..3 (elements 32 t + 8 u .. + 8 of a half).
#pragma once
#include <cstdint>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_packed_lanes.h"
#include "kernels/cpu/packed_rows.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
// Codes of one t from a unit's low-bit byte vector (its nibble at bit 0 after `shifted_low`'s shift) and the qh
// vector shifted so that t's two high bits sit at bits 4-5: (low & 0x0F) | (high & 0xF0), one ternary logic op,
// exact because `high` was masked to t's pair of bit pairs before the shift (0x33 or 0xCC).
inline __attribute__((always_inline)) __m512i q6_codes(__m512i shifted_low, __m512i shifted_high) {
  return _mm512_ternarylogic_epi32(shifted_low, shifted_high, _mm512_set1_epi8(0x0F), 0xE4);  // c ? a : b, bitwise
}

template <int MR>
inline void packed_dot(const block_q6_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums& sums,
                       float* res) {
  const __m512i mask_03 = _mm512_set1_epi8(0x33), mask_cc = _mm512_set1_epi8(static_cast<char>(0xCC));
  // lane l <- lane l / 2 of the sub-block's 8 rows (held in lanes 0-7, resp. 8-15, of a two-sub-block vector)
  const __m512i pair_lanes[2] = {_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                 _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8)};
  __m512 acc[MR], acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m] = acc_offsets[m] = _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const block_q6_k_r8& B = blk[b];
    prefetch_ahead<(sizeof(block_q6_k_r8) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m512 d8 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.d))));
    const __m512 d16 = _mm512_shuffle_f32x4(d8, d8, 0x44);  // [d | d]
    // d sc of sub-blocks 2p (lanes 0-7, the rows) and 2p + 1 (lanes 8-15), for every use below
    __m512 sc_d[8];
    for (int p = 0; p < 8; ++p) {
      sc_d[p] = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.scales[2 * p])))),
          d16);
    }
    for (int n = 0; n < 2; ++n) {
      for (int half = 0; half < 2; ++half) {  // units 2 half, 2 half + 1: sub-blocks 8 n + 2 t + half
        __m512i codes[4][2];
        for (int k = 0; k < 2; ++k) {
          const int u = 2 * half + k;
          const q6_k_r8_unit& unit = B.units[n][u];
          const __m512i a = _mm512_loadu_si512(unit.ql_a), c = _mm512_loadu_si512(unit.ql_b);
          const __m512i h = _mm512_loadu_si512(unit.qh);
          const __m512i h03 = _mm512_and_si512(h, mask_03), hcc = _mm512_and_si512(h, mask_cc);
          codes[0][k] = q6_codes(a, _mm512_slli_epi16(h03, 4));
          codes[1][k] = q6_codes(c, _mm512_slli_epi16(hcc, 2));
          codes[2][k] = q6_codes(_mm512_srli_epi16(a, 4), h03);
          codes[3][k] = q6_codes(_mm512_srli_epi16(c, 4), _mm512_srli_epi16(hcc, 2));
        }
        for (int t = 0; t < 4; ++t) {
          const int sub = 8 * n + 2 * t + half;
          const __m512 scale = _mm512_permutexvar_ps(pair_lanes[sub & 1], sc_d[sub >> 1]);
          const ActRecord* rec = tile.records(4 * b + 2 * n + (t >> 1));
          const int at = 32 * (t & 1) + 16 * half;
          for (int m = 0; m < MR; ++m) {
            const int8_t* q = rec[m].q + at;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[t][0], _mm512_set1_epi64(load_vec<long long>(q)));
            dot = _mm512_dpbusd_epi32(dot, codes[t][1], _mm512_set1_epi64(load_vec<long long>(q + 8)));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(rec[m].d[t & 1])), acc[m]);
          }
        }
      }
    }
    // The centre's term, two sub-blocks at a time: d sc of s and s + 1 against [Q_s | Q_s+1] (times -32 at the end).
    for (int p = 0; p < 8; ++p) {
      for (int m = 0; m < MR; ++m) {
        const float* q = sums.q_of(m, 16 * b + 2 * p);
        const __m512 xs = _mm512_mask_broadcastss_ps(_mm512_set1_ps(q[0]), 0xFF00, _mm_set_ss(q[1]));
        acc_offsets[m] = _mm512_fmadd_ps(sc_d[p], xs, acc_offsets[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {  // the centre's term times -32
    _mm256_storeu_ps(res + 8 * m, _mm256_fmadd_ps(rows_of_halves(acc_offsets[m]), _mm256_set1_ps(-32.0f),
                                                  rows_of_lane_pairs(acc[m])));
  }
}
#elif defined(__AVX2__)
// AVX2: half a unit at a time (rows 4 h .. 4 h + 3, 32 bytes), the codes as (low & 0x0F) | (high & 0x30) with the
// qh bits of t shifted to bits 4-5 (16-bit shifts: what crosses from the neighbouring byte is masked off). The two
// units of a sub-block add in int16 (2 * 2 * 63 * 127 < 32767) before one madd into int32 pairs of lanes.
inline __m256 q6_sub_block_scales(const block_q6_k_r8& B, int sub, __m256 d) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(B.scales[sub])))), d);
}

template <int MR>
inline void packed_dot(const block_q6_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums& sums,
                       float* res) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  __m256 acc[MR][2], acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = acc_offsets[m] = _mm256_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const block_q6_k_r8& B = blk[b];
    prefetch_ahead<(sizeof(block_q6_k_r8) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.d)));
    for (int n = 0; n < 2; ++n) {
      for (int half = 0; half < 2; ++half) {  // units 2 half, 2 half + 1: sub-blocks 8 n + 2 t + half
        __m256 sc_d[4];  // of the 8 rows, per t
        for (int t = 0; t < 4; ++t) sc_d[t] = q6_sub_block_scales(B, 8 * n + 2 * t + half, d);
        for (int h = 0; h < 2; ++h) {
          __m256i codes[4][2];
          for (int k = 0; k < 2; ++k) {
            const q6_k_r8_unit& unit = B.units[n][2 * half + k];
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit.ql_a[4 * h]));
            const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit.ql_b[4 * h]));
            const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit.qh[4 * h]));
            codes[0][k] = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
            codes[1][k] = _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
            codes[2][k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hb, bits45));
            codes[3][k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4),
                                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
          }
          for (int t = 0; t < 4; ++t) {
            const __m256 scale = half_pairs(sc_d[t], h);
            const ActRecord* rec = tile.records(4 * b + 2 * n + (t >> 1));
            const int at = 32 * (t & 1) + 16 * half;
            for (int m = 0; m < MR; ++m) {
              const int8_t* q = rec[m].q + at;
              const __m256i pairs = _mm256_add_epi16(
                  _mm256_maddubs_epi16(codes[t][0], _mm256_set1_epi64x(load_vec<long long>(q))),
                  _mm256_maddubs_epi16(codes[t][1], _mm256_set1_epi64x(load_vec<long long>(q + 8))));
              acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)),
                                          _mm256_mul_ps(scale, _mm256_set1_ps(rec[m].d[t & 1])), acc[m][h]);
            }
          }
        }
      }
    }
    // The centre's term per sub-block: d sc of the 8 rows against Q_s (times -32 at the end).
    for (int sub = 0; sub < 16; ++sub) {
      const __m256 sc_d = q6_sub_block_scales(B, sub, d);
      for (int m = 0; m < MR; ++m) {
        acc_offsets[m] = _mm256_fmadd_ps(sc_d, _mm256_set1_ps(*sums.q_of(m, 16 * b + sub)), acc_offsets[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(res + 8 * m, _mm256_fmadd_ps(acc_offsets[m], _mm256_set1_ps(-32.0f),
                                                  rows_of_half_pairs(acc[m][0], acc[m][1])));
  }
}
#else
// Portable: one element at a time.
template <int MR>
inline void packed_dot(const block_q6_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile, const ChunkSums& sums,
                       float* res) {
  float acc[MR][kPackedRows] = {};
  for (int64_t b = b0; b < b1; ++b) {
    const block_q6_k_r8& B = blk[b];
    for (int r = 0; r < kPackedRows; ++r) {
      const float d = GGML_EXT_HALF_TO_FLOAT(B.d[r]);
      for (int n = 0; n < 2; ++n) {
        for (int t = 0; t < 4; ++t) {
          for (int half = 0; half < 2; ++half) {
            const int s = 8 * n + 2 * t + half;
            const ActRecord* rec = tile.records(4 * b + 2 * n + (t >> 1));
            const float sc = d * B.scales[s][r];
            for (int m = 0; m < MR; ++m) {
              int32_t dot = 0;
              for (int k = 0; k < 2; ++k) {
                const int u = 2 * half + k;
                for (int i = 0; i < 8; ++i) {
                  const q6_k_r8_unit& unit = B.units[n][u];
                  const int low = ((t & 1 ? unit.ql_b : unit.ql_a)[r][i] >> (4 * (t >> 1))) & 0xF;
                  const int high = (unit.qh[r][i] >> (2 * t)) & 3;
                  dot += (low | (high << 4)) * rec[m].q[32 * (t & 1) + 8 * u + i];
                }
              }
              acc[m][r] += sc * (rec[m].d[t & 1] * static_cast<float>(dot) - 32.0f * *sums.q_of(m, 16 * b + s));
            }
          }
        }
      }
    }
  }
  store_rows(acc, res);
}
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
