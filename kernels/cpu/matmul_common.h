// What every regime of the CPU quantized matmul shares (kernels/cpu/matmul.cpp has the design): the sizes of
// groups, activation blocks and row tiles, the weight prefetch, and how the row dots see a format's codes
// (centering, CodeForm, a group's chunk layouts, the portable chunk decoder). Included by matmul.cpp's
// translation unit only (through the matmul_*.h headers): the kernels are templates instantiated there.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

typedef int8_t vi8x64 __attribute__((vector_size(64)));

constexpr int kGroup = 64;         // weight elements per step: four 16-element chunks
constexpr int kActBlock = 32;      // elements per activation scale
constexpr int kTileRows = 8;       // rows of x per weight pass
// How far ahead of the decoder the weight row is prefetched: 4 KB rather than 1 made one row of x on 4096x14336
// 1.1-1.2x faster (rows of 8-14 KB stalled on DRAM) and changed little elsewhere.
constexpr int64_t kPrefetchBytes = 4096;
// Asks for the kLines 64-byte lines kPrefetchBytes ahead of p in a weight row (the decoders' loops, once per step).
template <int kLines>
inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t* p) {
#pragma GCC unroll 4
  for (int i = 0; i < kLines; ++i) __builtin_prefetch(p + kPrefetchBytes + 64 * i);
}

template <class V>
inline __attribute__((always_inline)) V load_vec(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Formats with an offset (d * q + m; kOffset) have their unsigned codes centered, d * (q - c) + (m + d * c):
// the activation's rounding errors then cancel instead of adding up (about 3.6 times less error for 4 bits).
template <class Q, bool kOffset>
constexpr int code_center() {
  if (!kOffset) return 0;
  const ggml_ext_layout16 l = Q::layout(0);
  return (l.lo_mask + 1) * (l.hi_word ? 2 : l.hi_mask + 1) / 2;
}

// Whether a format adds a per-chunk offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): asked of its scale function.
template <class Q>
bool has_offset() {
  typename Q::B probe{};
  return Q::scale(&probe, 0).offset_op != 0;
}

// How the group kernels' integer dots see a format's codes (their activations are signed bytes; spans have their
// own scheme, see SpanRowDot). Plain codes stay unsigned as stored (0..63 at most), so a dot is one
// unsigned-by-signed multiply (VNNI's dpbusd, AVX2's maddubs); what the zero point and the centering take off
// every code (kZero) is taken off once per chunk, through the activations' per-chunk code sums. Signed codes
// (Q8_0, codebooks) are made unsigned by adding 128 where VNNI is available (kZero = 128, the same correction);
// elsewhere they stay signed and the dot multiplies |w| by q with w's sign.
template <class Q, bool kOffset>
struct CodeForm {
  static constexpr ggml_ext_layout16 kLayout = Q::layout(0);
  static constexpr bool kSigned = kLayout.lo_signed || kLayout.codebook != GGML_EXT_CODEBOOK_NONE;
#if defined(__AVX512VNNI__)
  static constexpr bool kFlip = kSigned;  // signed codes + 128
#else
  static constexpr bool kFlip = false;
#endif
  static constexpr bool kUnsigned = !kSigned || kFlip;
  static constexpr int kZero = kFlip ? 128 : kSigned ? 0 : kLayout.zero + code_center<Q, kOffset>();
  // The codebook as the dot takes it (flipped with the codes).
  static vi8x16 table() {
    const vi8x16 t = codebook_table(kLayout.codebook);
    return kFlip ? t ^ static_cast<int8_t>(-128) : t;
  }
};

// The signed offset a chunk adds per unit of x (0 for formats without one).
inline __attribute__((always_inline)) float signed_offset(const ggml_ext_scale16& s) {
  return s.offset_op == 0 ? 0.0f : s.offset_op > 0 ? s.offset : -s.offset;
}

// ---------------------------------------------------------------------------------------------------
// Weight groups. A group is 64 consecutive elements of a row: chunks 4G..4G+3 of a 256-element block, or
// chunks 0, 1 of two consecutive 32-element blocks (G = 0).
// ---------------------------------------------------------------------------------------------------
// The chunk layout of chunk c of group G (c may run past 3 for 32-element blocks: chunk c of the blocks from the
// group's first), with its byte offsets counted from the group's first block.
template <class Q>
constexpr ggml_ext_layout16 group_chunk_layout(int G, int c) {
  if (Q::kQK == 32) {
    ggml_ext_layout16 l = Q::layout(c & 1);
    const int block_offset = static_cast<int>(sizeof(typename Q::B)) * (c >> 1);
    l.lo += block_offset;
    l.hi += block_offset;
    return l;
  }
  return Q::layout(4 * G + c);
}

// Portable codes: four 16-element chunks through the shared decoder.
template <class Q, bool kOffset>
struct ChunkCodes {
  static constexpr int8_t kShift = static_cast<int8_t>(-code_center<Q, kOffset>());
  vi8x16 table = codebook_table(Q::layout(0).codebook);

  template <int G, int C>
  inline __attribute__((always_inline)) vi8x16 chunk(const uint8_t* base) const {
    constexpr ggml_ext_layout16 kLayout = group_chunk_layout<Q>(G, C);  // constant: codes16's branches fold
    return codes16(base, kLayout, table);
  }

};

// 16 bytes as 16 floats (widening in steps: GCC 12 scalarizes a direct conversion).
inline __attribute__((always_inline)) vf32x16 widen_bytes(vu8x16 v) {
  typedef uint16_t vu16x16 __attribute__((vector_size(32)));
  return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(v, vu16x16), vi32x16), vf32x16);
}

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
