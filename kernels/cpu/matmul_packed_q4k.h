// The product kernels of Q4_K_R8 (kernels/cpu/packed_rows.h), one per instruction set; the driver and the
// math are in matmul_packed_rows.h. Per 256-element block and row, with c the codes 0..15 and s a sub-block of 32
//     sum_i w_i x_i = d sc_s (dx_s * sum_i c_i q_i + 8 res_s) - dmin m_s X_s
// (q: x's codes, dx_s their scale, X_s the exact sum of x, res_s = X_s - dx_s sum q_i: what x's rounding left out,
// which the codes' centre 8 multiplies: centring lets the activations' rounding errors cancel, as in the plain
// kernels).
#pragma once
#include <cstdint>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_packed_lanes.h"
#include "kernels/cpu/packed_rows.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
// res[m * 8 + r] = row r of the group's blocks [b0, b1) against row m of the tile (m < MR).
template <int MR>
inline void packed_dot(const block_q4_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile,
                           const ChunkSums& sums, float* res) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // Byte 4l of an int32 lane l <- byte l / 2 of 8 scale bytes (the others zeroed by the mask): row l / 2's scale in
  // both of its lanes.
  const __m512i pair_bytes = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __mmask64 low_byte_of_lane = 0x1111111111111111ull;
  const __m512i pair_lanes = pair_bytes;  // lane l <- lane l / 2 (the same indices as dwords)
  // [8 d | -dmin] per row: what the residual sums (times sc) and the exact sums (times m) are multiplied by.
  const __m512 eight_minus_one = _mm512_castsi512_ps(
      _mm512_mask_blend_epi32(0xFF00, _mm512_castps_si512(_mm512_set1_ps(8.0f)),
                              _mm512_castps_si512(_mm512_set1_ps(-1.0f))));
  __m512 acc[MR], acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m] = acc_offsets[m] = _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const block_q4_k_r8& B = blk[b];
    prefetch_ahead<(sizeof(block_q4_k_r8) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m512 d_dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(B.d)));
    const __m512 d_pairs = _mm512_permutexvar_ps(pair_lanes, d_dmin);
    const __m512 offset_scale = _mm512_mul_ps(d_dmin, eight_minus_one);
    for (int j = 0; j < 4; ++j) {
      __m512i lo[4], hi[4];
      for (int u = 0; u < 4; ++u) {
        const __m512i w = _mm512_loadu_si512(B.qs[j][u]);
        lo[u] = _mm512_and_si512(w, low4);
        hi[u] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      }
      __m512 sc_d[2];
      for (int h = 0; h < 2; ++h) {
        const __m512i sc8 = _mm512_set1_epi64(load_vec<long long>(B.scale_min[2 * j + h]));
        sc_d[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(low_byte_of_lane, pair_bytes, sc8)),
                                d_pairs);
      }
      const ActRecord* rec = tile.records(4 * b + j);
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = rec[m].q;
        __m512i dot_lo = _mm512_setzero_si512(), dot_hi = _mm512_setzero_si512();
        for (int u = 0; u < 4; ++u) {
          dot_lo = _mm512_dpbusd_epi32(dot_lo, lo[u], _mm512_set1_epi64(load_vec<long long>(q + 8 * u)));
          dot_hi = _mm512_dpbusd_epi32(dot_hi, hi[u],
                                       _mm512_set1_epi64(load_vec<long long>(q + 32 + 8 * u)));
        }
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_lo), _mm512_mul_ps(sc_d[0], _mm512_set1_ps(rec[m].d[0])), acc[m]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_hi), _mm512_mul_ps(sc_d[1], _mm512_set1_ps(rec[m].d[1])), acc[m]);
      }
    }
    // The residual and offset terms: [sc | m] of the 8 rows per sub-block against [res_s | X_s].
    for (int s = 0; s < 8; ++s) {
      const __m512 scale_min = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.scale_min[s])))),
          offset_scale);
      for (int m = 0; m < MR; ++m) {
        const __m512 xs = _mm512_mask_broadcastss_ps(_mm512_set1_ps(*sums.block_residual_of(m, 8 * b + s)), 0xFF00,
                                                     _mm_set_ss(*sums.block_x_of(m, 8 * b + s)));
        acc_offsets[m] = _mm512_fmadd_ps(scale_min, xs, acc_offsets[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(res + 8 * m, _mm256_add_ps(rows_of_lane_pairs(acc[m]), rows_of_halves(acc_offsets[m])));
  }
}
#elif defined(__AVX2__)
// AVX2: a unit's 64 bytes as two 32-byte halves (rows 0-3, rows 4-7), each with the same pair lanes; the dot is
// maddubs (unsigned codes by signed activations, in int16 pairs: 2 * 15 * 127 per unit, so 4 units add up in
// int16 without overflow) then one madd per sub-block into int32.
template <int MR>
inline void packed_dot(const block_q4_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile,
                           const ChunkSums& sums, float* res) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  // Bytes 0..7 of an xmm <- the scales of rows 4h .. 4h + 3, each twice (a pair of lanes per row).
  const __m128i pair_bytes[2] = {_mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm_setr_epi8(4, 4, 5, 5, 6, 6, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0)};
  __m256 acc[MR][2], acc_offsets[MR];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = acc_offsets[m] = _mm256_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const block_q4_k_r8& B = blk[b];
    prefetch_ahead<(sizeof(block_q4_k_r8) + 63) / 64>(reinterpret_cast<const uint8_t*>(&B));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.d)));
    const __m256 minus_dmin = _mm256_sub_ps(_mm256_setzero_ps(),
                                            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.dmin))));
    const __m256 eight_d = _mm256_mul_ps(d, _mm256_set1_ps(8.0f));
    for (int j = 0; j < 4; ++j) {
      const ActRecord* rec = tile.records(4 * b + j);
      for (int h = 0; h < 2; ++h) {
        const __m256 d_pairs = half_pairs(d, h);
        __m256 sc_d[2];
        for (int i = 0; i < 2; ++i) {
          const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(B.scale_min[2 * j + i]));
          sc_d[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(sc, pair_bytes[h]))),
                                  d_pairs);
        }
        __m256i lo16[MR], hi16[MR];
        for (int m = 0; m < MR; ++m) lo16[m] = hi16[m] = _mm256_setzero_si256();
        for (int u = 0; u < 4; ++u) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B.qs[j][u][4 * h]));
          const __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
          for (int m = 0; m < MR; ++m) {
            const int8_t* q = rec[m].q;
            lo16[m] = _mm256_add_epi16(lo16[m], _mm256_maddubs_epi16(lo, _mm256_set1_epi64x(load_vec<long long>(q + 8 * u))));
            hi16[m] = _mm256_add_epi16(
                hi16[m], _mm256_maddubs_epi16(hi, _mm256_set1_epi64x(load_vec<long long>(q + 32 + 8 * u))));
          }
        }
        for (int m = 0; m < MR; ++m) {
          acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(lo16[m], ones)),
                                      _mm256_mul_ps(sc_d[0], _mm256_set1_ps(rec[m].d[0])), acc[m][h]);
          acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(hi16[m], ones)),
                                      _mm256_mul_ps(sc_d[1], _mm256_set1_ps(rec[m].d[1])), acc[m][h]);
        }
      }
    }
    // The residual and offset terms, per sub-block: the 8 rows' sc (times 8 d) and m (times -dmin).
    for (int s = 0; s < 8; ++s) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B.scale_min[s]));
      const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), eight_d);
      const __m256 mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))), minus_dmin);
      for (int m = 0; m < MR; ++m) {
        acc_offsets[m] = _mm256_fmadd_ps(sc, _mm256_set1_ps(*sums.block_residual_of(m, 8 * b + s)), acc_offsets[m]);
        acc_offsets[m] = _mm256_fmadd_ps(mn, _mm256_set1_ps(*sums.block_x_of(m, 8 * b + s)), acc_offsets[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm256_storeu_ps(res + 8 * m, _mm256_add_ps(rows_of_half_pairs(acc[m][0], acc[m][1]), acc_offsets[m]));
  }
}
#else
// Portable: the same sums per row and sub-block, one element at a time.
template <int MR>
inline void packed_dot(const block_q4_k_r8* blk, int64_t b0, int64_t b1, const TileView& tile,
                           const ChunkSums& sums, float* res) {
  float acc[MR][kPackedRows] = {};
  for (int64_t b = b0; b < b1; ++b) {
    const block_q4_k_r8& B = blk[b];
    for (int r = 0; r < kPackedRows; ++r) {
      const float d = GGML_EXT_HALF_TO_FLOAT(B.d[r]), dmin = GGML_EXT_HALF_TO_FLOAT(B.dmin[r]);
      for (int s = 0; s < 8; ++s) {
        const int j = s / 2, h = s % 2;
        const float sc = d * B.scale_min[s][r], mn = dmin * B.scale_min[s][8 + r];
        const ActRecord* rec = tile.records(4 * b + j);
        for (int m = 0; m < MR; ++m) {
          int32_t dot = 0;
          for (int u = 0; u < 4; ++u) {
            for (int i = 0; i < 8; ++i) {
              const int code = h ? B.qs[j][u][r][i] >> 4 : B.qs[j][u][r][i] & 0xF;
              dot += code * rec[m].q[32 * h + 8 * u + i];
            }
          }
          acc[m][r] += sc * (rec[m].d[h] * static_cast<float>(dot) + 8.0f * *sums.block_residual_of(m, 8 * b + s)) -
                       mn * *sums.block_x_of(m, 8 * b + s);
        }
      }
    }
  }
  store_rows(acc, res);
}
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
