// mul_mat_id by expert: a counting sort of the (token, slot) pairs by their expert, the rows of each expert
// gathered into one contiguous block, one quantized_matmul (matmul.cpp: SIMD dots, weight rows split over the
// thread pool) per expert that has rows, and the results scattered back to their pairs. An expert's weight is
// therefore streamed once per call (prefill: many tokens share it), and the product of each expert keeps every
// thread busy. The gather and scatter copy T x n_used rows; next to the weight bytes they are small.
#include "kernels/cpu/mul_mat_id.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/parallel.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {

void mul_mat_id(const MulMatIdArgs& a) {
  const int64_t pairs = a.T * a.n_used;
  if (pairs == 0) return;
  const int64_t x_cols = a.transpose ? a.N : a.K, out_cols = a.transpose ? a.K : a.N;
  const int64_t x_row = x_cols * float_type_bytes(a.x_type), out_row = out_cols * float_type_bytes(a.out_type);

  // first[e] .. first[e + 1]: the positions of expert e's pairs in `order` (pairs keep their order within one).
  std::vector<int64_t> first(a.E + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) ++first[a.ids[p] + 1];
  for (int64_t e = 0; e < a.E; ++e) first[e + 1] += first[e];
  std::vector<int64_t> order(pairs), next(first.begin(), first.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) order[next[a.ids[p]]++] = p;

  // Uninitialized (every byte is written before it is read), and the copies over the thread pool: in prefill
  // they move T x n_used rows each way.
  std::unique_ptr<uint8_t[]> own(a.scratch ? nullptr : new uint8_t[mul_mat_id_scratch_bytes(a)]);
  uint8_t* rows = a.scratch ? static_cast<uint8_t*>(a.scratch) : own.get();
  uint8_t* results = rows + mul_mat_id_results_offset(a);
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, x_row + out_row));
  const auto* x = static_cast<const uint8_t*>(a.x);
  parallel_for(pairs, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = order[i] / a.n_used, s = a.x_slots == 1 ? 0 : order[i] % a.n_used;
      std::memcpy(rows + i * x_row, x + (t * a.x_slots + s) * x_row, x_row);
    }
  });
  const auto* w = static_cast<const uint8_t*>(a.w);
  // Decode: an expert with one row is a single-row product, as fast in slices of its weight rows. Those experts'
  // slices go over the pool as one job (one wake-up of the threads for all of them instead of one per expert);
  // nested inside it, each product runs on its thread alone. (The transposed product sums over N: not sliced.)
  std::vector<std::pair<int64_t, int64_t>> slices;  // (expert, first weight row)
  int64_t singles = 0;  // experts with one pair
  for (int64_t e = 0; e < a.E; ++e) singles += first[e + 1] - first[e] == 1;
  singles = std::max<int64_t>(1, singles);
  // Each slice quantizes its row of x again and starts a new stream of weight rows: as few slices as keep every
  // thread busy (at least two per thread in all), not two per thread for every expert (8 experts at one token
  // on 2 threads: 8 slices instead of 32, the MoE decode in docs/moe.md ~1.1x faster).
  const int64_t per_expert = (2 * num_threads() + singles - 1) / singles;
  int64_t slice_rows = std::max<int64_t>(16, (a.N + per_expert - 1) / per_expert);
  // Packed experts (kernels/cpu/packed_rows.h) are sliced at whole groups of 8 rows.
  if (packed_type_info(a.w_type) != nullptr) slice_rows = (slice_rows + kPackedRows - 1) / kPackedRows * kPackedRows;
  for (int64_t e = 0; e < a.E && !a.transpose; ++e) {
    if (first[e + 1] - first[e] != 1) continue;
    for (int64_t n0 = 0; n0 < a.N; n0 += slice_rows) slices.emplace_back(e, n0);
  }
  const int64_t out_bytes = float_type_bytes(a.out_type);
  parallel_for(static_cast<int64_t>(slices.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto [e, n0] = slices[i];
      MatmulArgs m{rows + first[e] * x_row, a.x_type, w + (e * a.N + n0) * a.row_bytes, a.w_type,
                   results + first[e] * out_row + n0 * out_bytes, a.out_type, 1, std::min(slice_rows, a.N - n0), a.K,
                   false};
      ::ggml_ext::cpu::quantized_matmul(m);
    }
  });
  for (int64_t e = 0; e < a.E; ++e) {
    const int64_t count = first[e + 1] - first[e];
    if (count == 0 || (count == 1 && !a.transpose)) continue;
    MatmulArgs m{rows + first[e] * x_row, a.x_type, w + e * a.N * a.row_bytes, a.w_type,
                 results + first[e] * out_row, a.out_type, count, a.N, a.K, a.transpose};
    ::ggml_ext::cpu::quantized_matmul(m);  // the ISA in use
  }
  auto* out = static_cast<uint8_t*>(a.out);
  parallel_for(pairs, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) std::memcpy(out + order[i] * out_row, results + i * out_row, out_row);
  });
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(mul_mat_id, MulMatIdArgs)

}  // namespace ggml_ext::cpu
