// Q4_K with 8 weight rows interleaved ("Q4_K_R8"): a CPU-only copy of a Q4_K matrix, made once at load, in
// which one 64-byte vector holds 8 bytes of each of 8 rows. A one-row product then multiplies 8 weight rows by
// one broadcast of 8 activation bytes, unpacks the scales of 8 rows together and never sums lanes within a row:
// about a third of the instructions per weight of the row-by-row kernels, which on AVX-512 are compute-bound
// at two threads where this layout is memory-bound (docs/performance.md). GPUs never see it: the primitives
// refuse it on CUDA and Metal.
//
// A packed block covers rows 8g .. 8g + 7 and elements [256 b, 256 b + 256) of them, 1,184 bytes where the 8
// Q4_K blocks took 1,152 (the 6-bit scales stored as bytes). A group's blocks follow each other along K, groups
// follow each other along N; as an MLX array the bytes are shaped (N, K / 256 * 148), 148 = 1184 / 8, so that the
// shape logic of the plain types (N rows, a byte width per row) holds, although row n's bytes are not row n's.
// Plain C++ (no ISA namespace): the repacking op in csrc/ and the kernels share it.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/ggml_blocks.h"

namespace ggml_ext::cpu {

constexpr int kPackedRows = 8;
// The type id of a packed copy: outside ggml's id range, never written to a file.
constexpr int kTypeQ4KR8 = 1012;

struct block_q4_k_r8 {
  uint16_t d[8];            // row r's super-block scale (f16 bits)
  uint16_t dmin[8];         // row r's super-block min scale
  uint8_t scale_min[8][16];  // [sub-block s][r]: scale of row r (r < 8), min of row r - 8 (r >= 8), 0..63
  uint8_t qs[4][4][8][8];    // [64-element chunk j][unit u][row r][byte]: row r's Q4_K bytes qs[32 j + 8 u ..+ 8]
};
static_assert(sizeof(block_q4_k_r8) == 1184, "block_q4_k_r8 size");
constexpr int64_t kPackedQ4KRowBytes = sizeof(block_q4_k_r8) / kPackedRows;  // 148 per row and 256 elements

// Byte b of a unit holds, in its low nibble, element 64 j + 8 u + b of its row (sub-block 2 j) and, in its high
// nibble, element 64 j + 32 + 8 u + b (sub-block 2 j + 1): Q4_K's own nibble order, 8 bytes at a time.
inline void pack_q4_k_block(const block_q4_k* const rows[kPackedRows], block_q4_k_r8* out) {
  for (int r = 0; r < kPackedRows; ++r) {
    out->d[r] = rows[r]->d;
    out->dmin[r] = rows[r]->dmin;
    for (int s = 0; s < 8; ++s) {
      out->scale_min[s][r] = static_cast<uint8_t>(ggml_ext_k4_scale(rows[r]->scales, s));
      out->scale_min[s][8 + r] = static_cast<uint8_t>(ggml_ext_k4_min(rows[r]->scales, s));
    }
    for (int j = 0; j < 4; ++j) {
      for (int u = 0; u < 4; ++u) std::memcpy(out->qs[j][u][r], rows[r]->qs + 32 * j + 8 * u, 8);
    }
  }
}

// Row r's Q4_K block back from a packed block (bit for bit the block that was packed).
inline void unpack_q4_k_block(const block_q4_k_r8* in, int r, block_q4_k* out) {
  out->d = in->d[r];
  out->dmin = in->dmin[r];
  uint8_t* q = out->scales;
  for (int s = 0; s < 4; ++s) {
    const int sc_lo = in->scale_min[s][r], m_lo = in->scale_min[s][8 + r];
    const int sc_hi = in->scale_min[s + 4][r], m_hi = in->scale_min[s + 4][8 + r];
    q[s] = static_cast<uint8_t>(sc_lo | ((sc_hi >> 4) << 6));
    q[s + 4] = static_cast<uint8_t>(m_lo | ((m_hi >> 4) << 6));
    q[s + 8] = static_cast<uint8_t>((sc_hi & 0xF) | ((m_hi & 0xF) << 4));
  }
  for (int j = 0; j < 4; ++j) {
    for (int u = 0; u < 4; ++u) std::memcpy(out->qs + 32 * j + 8 * u, in->qs[j][u][r], 8);
  }
}

// A whole (N, K) Q4_K matrix (rows of `blocks` blocks) into the packed layout (N a multiple of 8) and back.
inline void pack_q4_k_rows(const uint8_t* src, int64_t N, int64_t blocks, uint8_t* dst) {
  auto* out = reinterpret_cast<block_q4_k_r8*>(dst);
  const auto* in = reinterpret_cast<const block_q4_k*>(src);
  for (int64_t g = 0; g < N / kPackedRows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      const block_q4_k* rows[kPackedRows];
      for (int r = 0; r < kPackedRows; ++r) rows[r] = in + (g * kPackedRows + r) * blocks + b;
      pack_q4_k_block(rows, out + g * blocks + b);
    }
  }
}

inline void unpack_q4_k_rows(const uint8_t* src, int64_t N, int64_t blocks, uint8_t* dst) {
  const auto* in = reinterpret_cast<const block_q4_k_r8*>(src);
  auto* out = reinterpret_cast<block_q4_k*>(dst);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < blocks; ++b) {
      unpack_q4_k_block(in + n / kPackedRows * blocks + b, static_cast<int>(n % kPackedRows), out + n * blocks + b);
    }
  }
}

}  // namespace ggml_ext::cpu
