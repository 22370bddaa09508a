// What the packed kernels (matmul_packed_q4k.h, _q6k.h, _qk32.h) share at the end of a row: their 16-lane
// accumulators folded into the 8 weight rows' results.
#pragma once
#include <cstdint>

#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX512F__)
// Lanes 2r and 2r + 1 (row r's two halves of every unit) added: row r in lane r.
inline __m256 rows_of_lane_pairs(__m512 acc) {
  const __m512 pairs = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_srli_epi64(_mm512_castps_si512(acc), 32)));
  return _mm512_castps512_ps256(
      _mm512_permutexvar_ps(_mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0), pairs));
}

// Lanes r and 8 + r added (two terms of row r side by side).
inline __m256 rows_of_halves(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}
#endif

#if defined(__AVX2__)
// The AVX2 kernels' two halves of a unit (rows 0-3 and 4-7, each row in a pair of lanes) as the 8 rows' sums in
// row order: hadd gives [r0 r1 r4 r5 | r2 r3 r6 r7], the permutation puts them in place.
inline __m256 rows_of_half_pairs(__m256 rows0to3, __m256 rows4to7) {
  return _mm256_permutevar8x32_ps(_mm256_hadd_ps(rows0to3, rows4to7), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}
// Lanes 2r and 2r + 1 of a half get row 4 h + r's scale: d of the 8 rows spread over half h's pairs of lanes.
inline __m256 half_pairs(__m256 d, int h) {
  return _mm256_permutevar8x32_ps(d, h ? _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)
                                       : _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}
#endif

// The portable kernels' per-row sums into res[8 m + r].
template <int MR>
inline void store_rows(const float (&acc)[MR][kPackedRows], float* res) {
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < kPackedRows; ++r) res[8 * m + r] = acc[m][r];
  }
}

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
