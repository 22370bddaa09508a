// The forward product on weight rows packed 8 at a time (kernels/cpu/packed_rows.h has the layouts and why).
//
// Per packed block, 8 weight rows and a tile of MR rows of x (activations quantized per 32 elements, as for the
// plain kernels: QuantizedRows). The integer sums come from one unsigned-by-signed dot per 4 bytes (VNNI dpbusd;
// AVX2 maddubs) into int32 lanes: lanes 2r and 2r + 1 hold row r's first and last 4 elements of every 8, which is
// what one broadcast of 8 activation bytes against a 64-byte unit of 8 rows gives; the two lanes are added once,
// at the end of the row. The scale work per sub-block (the 8 rows' scales as floats) is done once for every row
// of x in the tile. The per-format kernels: matmul_packed_q4k.h, matmul_packed_q6k.h, matmul_packed_qk32.h (each:
// AVX-512 VNNI, AVX2 where written, portable); here the driver.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_packed_q4k.h"
#include "kernels/cpu/matmul_packed_q6k.h"
#include "kernels/cpu/matmul_packed_qk32.h"
#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/parallel.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

// Rows of x per pass of the packed kernels: 8 rows would need 16 float accumulators of 16 lanes, and the
// 512-bit kernel has 32 registers for those, the 8 units' codes and the scales.
constexpr int kPackedTileRows = 4;  // AVX2 too: 2 was measured 0.90-0.97x of 4 at 4 to 64 rows on Zen 4

// Every (row tile of x, group of 8 weight rows) of the forward product on activations already quantized:
// groups split across threads, each thread's groups taken in cache-sized slices that every tile of x reads.
// `fold` activation rows make one output row (2 for x with its residual).
template <class P>
void forward_packed(const MatmulArgs& a, const QuantizedRows& act, int fold) {
  using Packed = typename P::Packed;
  const int64_t blocks = a.K / P::kQK, groups = a.N / kPackedRows, M = a.M * fold;
  const int64_t group_bytes = blocks * static_cast<int64_t>(sizeof(Packed));
  const int64_t slice = std::max<int64_t>(1, (int64_t(192) << 10) / group_bytes);
  const auto* w = static_cast<const Packed*>(a.w);
  GGML_EXT_FLOAT_SWITCH(a.out_type, Out, {
    auto* out = static_cast<typename Out::T*>(a.out);
    parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
      float res[kPackedTileRows * kPackedRows];
      for (int64_t s0 = g0; s0 < g1; s0 += slice) {
        const int64_t s1 = std::min(g1, s0 + slice);
        for (int64_t m0 = 0; m0 < M; m0 += kPackedTileRows) {
          const int64_t rows = std::min<int64_t>(kPackedTileRows, M - m0);
          // Tiles of the activations are 1, 2, 4 or 8 rows: a pass starts at a multiple of its own height.
          const int64_t tile0 = m0 / act.tile * act.tile;
          TileView view(act, tile0);
          view.rec += m0 - tile0;
          const ChunkSums sums(act, m0);
          for (int64_t g = s0; g < s1; ++g) {
            const Packed* group = w + g * blocks;
            switch (rows) {
              case 1: packed_dot<1>(group, 0, blocks, view, sums, res); break;
              case 2: packed_dot<2>(group, 0, blocks, view, sums, res); break;
              case 3: packed_dot<3>(group, 0, blocks, view, sums, res); break;
              default: packed_dot<4>(group, 0, blocks, view, sums, res); break;
            }
            for (int64_t m = 0; m < rows; m += fold) {
              for (int r = 0; r < kPackedRows; ++r) {
                const float sum = fold == 2 ? res[8 * m + r] + res[8 * (m + 1) + r] : res[8 * m + r];
                out[(m0 + m) / fold * a.N + g * kPackedRows + r] = Out::from_f32(sum);
              }
            }
          }
        }
      }
    });
  });
}

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
