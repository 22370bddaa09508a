// Weight rows interleaved 8 at a time: Q4_K ("Q4_K_R8"), Q6_K ("Q6_K_R8"), Q4_0, IQ4_NL, Q5_0 and Q8_0 ("Q4_0_R8"
// etc.). A CPU-only copy of a matrix, made once at load, in which one 64-byte vector holds 8 bytes of each of 8 rows.
// A one-row product then multiplies 8 weight rows by one broadcast of 8 activation bytes, unpacks the scales of 8
// rows together and never sums lanes within a row (docs/performance.md has what that gains). GPUs never see it: the
// primitives refuse it on CUDA and Metal.
//
// A packed block covers rows 8g .. 8g + 7 and one block-step of K (256 elements; 32 for the 32-element types): for
// Q4_K 1,184 bytes where the 8 Q4_K blocks took 1,152 (the 6-bit scales stored as bytes), for the others the blocks'
// own bytes (Q6_K 1,680, Q4_0 and IQ4_NL 144, Q5_0 176, Q8_0 272). A group's blocks follow each other along K,
// groups follow each other along N; as an MLX array the bytes are shaped (N, K / 256 * 148) for Q4_K and like the
// plain rows for the others, so that the shape logic of the plain types (N rows, a byte width per row) holds,
// although row n's bytes are not row n's.
// Plain C++ (no ISA namespace): the repacking op in csrc/, the type table of csrc/ggml_types.cpp and the kernels
// share it.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/ggml_blocks.h"

namespace ggml_ext::cpu {

constexpr int kPackedRows = 8;
// The type id of a plain type's packed copy: 1000 + its id, outside ggml's id range (never written to a file).
constexpr int packed_id(int plain) { return 1000 + plain; }
constexpr int kTypeQ4KR8 = packed_id(GGML_EXT_TYPE_Q4_K);

struct block_q4_k_r8 {
  uint16_t d[8];            // row r's super-block scale (f16 bits)
  uint16_t dmin[8];         // row r's super-block min scale
  uint8_t scale_min[8][16];  // [sub-block s][r]: scale of row r (r < 8), min of row r - 8 (r >= 8), 0..63
  uint8_t qs[4][4][8][8];    // [64-element chunk j][unit u][row r][byte]: row r's Q4_K bytes qs[32 j + 8 u ..+ 8]
};
static_assert(sizeof(block_q4_k_r8) == 1184, "block_q4_k_r8 size");

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

// Q6_K the same way ("Q6_K_R8"): 8 rows' blocks in 1,680 bytes, 8 times 210, nothing added. In Q6_K, element
// 128 n + 32 t + l (n: half, t: 0..3, l: 0..31) has its low 4 bits in ql[64 n + 32 (t & 1) + l] (low nibble for
// t < 2, high for t >= 2) and its high 2 bits in qh[32 n + l] at bit 2 t; a unit here is 8 consecutive l of 8
// rows: its ql bytes for t = 0 / 2, for t = 1 / 3 and its qh bytes give 4 x 8 elements of 8 rows, and they are
// stored one after the other in the order the kernels read them (read out of order across the block, the
// same bytes streamed from DRAM 0.7x as fast on Zen 4).
struct q6_k_r8_unit {
  uint8_t ql_a[8][8];  // [row r][byte]: row r's ql[64 n + 8 u ..+ 8]
  uint8_t ql_b[8][8];  // row r's ql[64 n + 32 + 8 u ..+ 8]
  uint8_t qh[8][8];    // row r's qh[32 n + 8 u ..+ 8]
};
struct block_q6_k_r8 {
  uint16_t d[8];            // row r's super-block scale
  int8_t scales[16][8];     // [sub-block of 16 elements][row]
  q6_k_r8_unit units[2][4];  // [half n][unit u]
};
static_assert(sizeof(block_q6_k_r8) == 8 * sizeof(block_q6_k), "block_q6_k_r8 size");
constexpr int kTypeQ6KR8 = packed_id(GGML_EXT_TYPE_Q6_K);

inline void pack_q6_k_block(const block_q6_k* const rows[kPackedRows], block_q6_k_r8* out) {
  for (int r = 0; r < kPackedRows; ++r) {
    out->d[r] = rows[r]->d;
    for (int s = 0; s < 16; ++s) out->scales[s][r] = rows[r]->scales[s];
    for (int n = 0; n < 2; ++n) {
      for (int u = 0; u < 4; ++u) {
        q6_k_r8_unit& unit = out->units[n][u];
        std::memcpy(unit.ql_a[r], rows[r]->ql + 64 * n + 8 * u, 8);
        std::memcpy(unit.ql_b[r], rows[r]->ql + 64 * n + 32 + 8 * u, 8);
        std::memcpy(unit.qh[r], rows[r]->qh + 32 * n + 8 * u, 8);
      }
    }
  }
}

inline void unpack_q6_k_block(const block_q6_k_r8* in, int r, block_q6_k* out) {
  out->d = in->d[r];
  for (int s = 0; s < 16; ++s) out->scales[s] = in->scales[s][r];
  for (int n = 0; n < 2; ++n) {
    for (int u = 0; u < 4; ++u) {
      const q6_k_r8_unit& unit = in->units[n][u];
      std::memcpy(out->ql + 64 * n + 8 * u, unit.ql_a[r], 8);
      std::memcpy(out->ql + 64 * n + 32 + 8 * u, unit.ql_b[r], 8);
      std::memcpy(out->qh + 32 * n + 8 * u, unit.qh[r], 8);
    }
  }
}

// Q8_0 ("Q8_0_R8"): 8 rows' 32-element blocks in 272 bytes, 8 times 34: the 8 d, then 4 units of 8 bytes (elements
// 8 u .. 8 u + 7) of each row.
struct block_q8_0_r8 {
  uint16_t d[8];
  int8_t qs[4][8][8];  // [unit u][row r][byte]: row r's qs[8 u ..+ 8]
};
static_assert(sizeof(block_q8_0_r8) == 8 * sizeof(block_q8_0), "block_q8_0_r8 size");
constexpr int kTypeQ80R8 = packed_id(GGML_EXT_TYPE_Q8_0);

inline void pack_q8_0_block(const block_q8_0* const rows[kPackedRows], block_q8_0_r8* out) {
  for (int r = 0; r < kPackedRows; ++r) {
    out->d[r] = rows[r]->d;
    for (int u = 0; u < 4; ++u) std::memcpy(out->qs[u][r], rows[r]->qs + 8 * u, 8);
  }
}

inline void unpack_q8_0_block(const block_q8_0_r8* in, int r, block_q8_0* out) {
  out->d = in->d[r];
  for (int u = 0; u < 4; ++u) std::memcpy(out->qs + 8 * u, in->qs[u][r], 8);
}

// Q4_0 ("Q4_0_R8") and IQ4_NL ("IQ4_NL_R8"), whose blocks are alike (a scale d and 16 bytes of nibbles: element i
// in the low nibble of qs[i] for i < 16, in the high nibble of qs[i - 16] otherwise; Q4_0's value d (c - 8), IQ4_NL's
// d times a 16-entry codebook value): 8 rows in 144 bytes, 8 times 18, the nibble bytes in two 64-byte vectors as
// for Q5_0 below. One struct per plain format, so that the kernels tell them apart by type.
template <class Plain>
struct block_nibbles_r8 {
  uint16_t d[8];
  uint8_t qs[2][8][8];  // [vector h][row r][byte]: row r's qs[8 h ..+ 8]
};
using block_q4_0_r8 = block_nibbles_r8<block_q4_0>;
using block_iq4_nl_r8 = block_nibbles_r8<block_iq4_nl>;
static_assert(sizeof(block_q4_0_r8) == 8 * sizeof(block_q4_0), "block_q4_0_r8 size");
static_assert(sizeof(block_iq4_nl_r8) == 8 * sizeof(block_iq4_nl), "block_iq4_nl_r8 size");
constexpr int kTypeQ40R8 = packed_id(GGML_EXT_TYPE_Q4_0);
constexpr int kTypeIQ4NLR8 = packed_id(GGML_EXT_TYPE_IQ4_NL);

// The scales and nibble bytes of 8 rows (Q4_0, IQ4_NL; Q5_0's too) into the packed block's d and qs, and back.
template <class Plain, class Packed>
inline void pack_nibbles_block(const Plain* const rows[kPackedRows], Packed* out) {
  for (int r = 0; r < kPackedRows; ++r) {
    out->d[r] = rows[r]->d;
    for (int h = 0; h < 2; ++h) std::memcpy(out->qs[h][r], rows[r]->qs + 8 * h, 8);
  }
}

template <class Plain, class Packed>
inline void unpack_nibbles_block(const Packed* in, int r, Plain* out) {
  out->d = in->d[r];
  for (int h = 0; h < 2; ++h) std::memcpy(out->qs + 8 * h, in->qs[h][r], 8);
}

// Q5_0 ("Q5_0_R8"): 8 rows' 32-element blocks in 176 bytes, 8 times 22. Q5_0's element i (code 0..31, value
// d (code - 16)) has its low 4 bits in qs[i] (low nibble, i < 16) or qs[i - 16] (high nibble) and its fifth bit at
// bit i of qh (little endian). Here the nibble bytes of 8 rows fill two 64-byte vectors, 8 bytes of each row:
// vector h holds qs[8 h ..+ 8], whose low nibbles are elements 8 h .. 8 h + 7 (unit h) and high nibbles elements
// 16 + 8 h .. (unit h + 2). The fifth bits of unit u are 8 bytes, byte r row r's qh[u]: as a 64-bit mask, bit
// 8 r + i is the fifth bit of the element in byte 8 r + i of the unit's vector, so one masked byte add sets them.
struct block_q5_0_r8 {
  uint16_t d[8];
  uint8_t qh[4][8];     // [unit u][row r]: row r's qh[u] (the fifth bits of its elements 8 u .. 8 u + 7)
  uint8_t qs[2][8][8];  // [vector h][row r][byte]: row r's qs[8 h ..+ 8]
};
static_assert(sizeof(block_q5_0_r8) == 8 * sizeof(block_q5_0), "block_q5_0_r8 size");
constexpr int kTypeQ50R8 = packed_id(GGML_EXT_TYPE_Q5_0);

inline void pack_q5_0_block(const block_q5_0* const rows[kPackedRows], block_q5_0_r8* out) {
  pack_nibbles_block(rows, out);
  for (int r = 0; r < kPackedRows; ++r) {
    for (int u = 0; u < 4; ++u) out->qh[u][r] = rows[r]->qh[u];
  }
}

inline void unpack_q5_0_block(const block_q5_0_r8* in, int r, block_q5_0* out) {
  unpack_nibbles_block(in, r, out);
  for (int u = 0; u < 4; ++u) out->qh[u] = in->qh[u][r];
}

// A packed format, for code that handles several: the plain block, the packed one, the conversions, its name and
// type id.
template <class Plain_, class Packed_, int kPlain_, int kQK_, const char* kName_, auto kPack, auto kUnpack>
struct Packing {
  using Plain = Plain_;
  using Packed = Packed_;
  static constexpr const char* kName = kName_;
  static constexpr int kPlain = kPlain_;
  static constexpr int kType = packed_id(kPlain_);
  static constexpr int kQK = kQK_;
  static void pack(const Plain* const rows[kPackedRows], Packed* out) { kPack(rows, out); }
  static void unpack(const Packed* in, int r, Plain* out) { kUnpack(in, r, out); }
};
inline constexpr char kQ4KR8Name[] = "Q4_K_R8", kQ6KR8Name[] = "Q6_K_R8", kQ40R8Name[] = "Q4_0_R8",
                      kIQ4NLR8Name[] = "IQ4_NL_R8", kQ50R8Name[] = "Q5_0_R8", kQ80R8Name[] = "Q8_0_R8";
using PackedQ4K = Packing<block_q4_k, block_q4_k_r8, GGML_EXT_TYPE_Q4_K, 256, kQ4KR8Name, pack_q4_k_block,
                          unpack_q4_k_block>;
using PackedQ6K = Packing<block_q6_k, block_q6_k_r8, GGML_EXT_TYPE_Q6_K, 256, kQ6KR8Name, pack_q6_k_block,
                          unpack_q6_k_block>;
using PackedQ40 = Packing<block_q4_0, block_q4_0_r8, GGML_EXT_TYPE_Q4_0, 32, kQ40R8Name,
                          pack_nibbles_block<block_q4_0, block_q4_0_r8>,
                          unpack_nibbles_block<block_q4_0, block_q4_0_r8>>;
using PackedIQ4NL = Packing<block_iq4_nl, block_iq4_nl_r8, GGML_EXT_TYPE_IQ4_NL, 32, kIQ4NLR8Name,
                            pack_nibbles_block<block_iq4_nl, block_iq4_nl_r8>,
                            unpack_nibbles_block<block_iq4_nl, block_iq4_nl_r8>>;
using PackedQ50 = Packing<block_q5_0, block_q5_0_r8, GGML_EXT_TYPE_Q5_0, 32, kQ50R8Name, pack_q5_0_block,
                          unpack_q5_0_block>;
using PackedQ80 = Packing<block_q8_0, block_q8_0_r8, GGML_EXT_TYPE_Q8_0, 32, kQ80R8Name, pack_q8_0_block,
                          unpack_q8_0_block>;

// The packed types, listed once: id, name, the plain type they pack, elements per block and bytes per row of a
// block (8 rows' share of a packed block).
struct PackedTypeInfo {
  int type;
  const char* name;
  int plain;
  int block_size;
  int row_bytes;
};
template <class P>
constexpr PackedTypeInfo packed_type_entry() {
  return {P::kType, P::kName, P::kPlain, P::kQK, static_cast<int>(sizeof(typename P::Packed) / kPackedRows)};
}
template <class... P>
struct PackedFormatList {
  static constexpr PackedTypeInfo kTable[] = {packed_type_entry<P>()...};
  // Calls f(traits) for the format of packed type `type` (`plain`: for the packing of plain type `type`); false
  // when there is none.
  template <class F>
  static bool visit(int type, bool plain, F&& f) {
    return ((type == (plain ? P::kPlain : P::kType) ? (f(P{}), true) : false) || ...);
  }
};
using PackedFormats = PackedFormatList<PackedQ4K, PackedQ6K, PackedQ40, PackedIQ4NL, PackedQ50, PackedQ80>;
inline constexpr const auto& kPackedTypes = PackedFormats::kTable;

// The entry of packed type `type`, or of the packed form of plain type `plain`; nullptr if there is none.
inline const PackedTypeInfo* packed_type_info(int type) {
  for (const auto& t : kPackedTypes) {
    if (t.type == type) return &t;
  }
  return nullptr;
}
inline const PackedTypeInfo* packing_of(int plain) {
  for (const auto& t : kPackedTypes) {
    if (t.plain == plain) return &t;
  }
  return nullptr;
}

// A whole (N, K) matrix (rows of `blocks` blocks) into the packed layout (N a multiple of 8) and back.
template <class P>
void pack_rows(const uint8_t* src, int64_t N, int64_t blocks, uint8_t* dst) {
  auto* out = reinterpret_cast<typename P::Packed*>(dst);
  const auto* in = reinterpret_cast<const typename P::Plain*>(src);
  for (int64_t g = 0; g < N / kPackedRows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      const typename P::Plain* rows[kPackedRows];
      for (int r = 0; r < kPackedRows; ++r) rows[r] = in + (g * kPackedRows + r) * blocks + b;
      P::pack(rows, out + g * blocks + b);
    }
  }
}

template <class P>
void unpack_rows(const uint8_t* src, int64_t N, int64_t blocks, uint8_t* dst) {
  const auto* in = reinterpret_cast<const typename P::Packed*>(src);
  auto* out = reinterpret_cast<typename P::Plain*>(dst);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < blocks; ++b) {
      P::unpack(in + n / kPackedRows * blocks + b, static_cast<int>(n % kPackedRows), out + n * blocks + b);
    }
  }
}

}  // namespace ggml_ext::cpu
