// The chunk scales and offsets of 256-element blocks as 16-lane float vectors (ChunkScales and the vector forms
// of the K-quants and IQ4_XS, chosen by ScalesOf): what the portable, AVX2 and AVX-512 row dots scale with.
#pragma once
#include <cstddef>
#include <cstring>

#include "kernels/cpu/matmul_common.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

// Chunk scales and offsets: per block for 256-element blocks (16 chunks, one lane each), then spread over a
// group's lanes; per block for 32-element ones (the row dots call the scale function). The generic form calls
// the shared scale function per chunk; the common formats have vector forms below that compute the same values.
template <class Q>
struct ChunkScales {
  using B = typename Q::B;
  vf32x16 scale, offset;  // 256-element blocks: chunk c in lane c

  inline __attribute__((always_inline)) void load_block(const B* b) {
    float sc[16], off[16];
    for (int c = 0; c < 16; ++c) {
      const auto s = Q::scale(b, c);
      sc[c] = s.scale;
      off[c] = signed_offset(s);
    }
    scale = load_vec<vf32x16>(sc);
    offset = load_vec<vf32x16>(off);
  }
};

// Bytes shifted as 16-bit lanes: x86 has no byte shift (GCC spells a byte shift right as a 16-bit shift and a
// mask, and a byte shift left as repeated adds, one per bit). Right by n, a byte's top n bits take the next byte's
// low bits, and left by n, its low n bits the previous byte's top bits: the callers mask those off, or shift left
// only bytes below 1 << (8 - n). Little-endian lanes (x86, arm64): byte 2i is the low half of lane i.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "byte shifts by 16-bit lanes");
typedef uint16_t vu16x8 __attribute__((vector_size(16)));
template <int n>
inline __attribute__((always_inline)) vu8x16 lane_shift_right(vu8x16 v) {
  return (vu8x16)((vu16x8)v >> n);
}
template <int n>
inline __attribute__((always_inline)) vu8x16 lane_shift_left(vu8x16 v) {
  return (vu8x16)((vu16x8)v << n);
}

// Q4_K and Q5_K: the 8 six-bit scales and mins unpacked with byte shuffles, converted together.
// The block's 8 scales (lanes 0..7) and 8 mins (lanes 8..15) as bytes (get_scale_min_k4).
template <class B>
inline __attribute__((always_inline)) vu8x16 k4_scale_min_bytes(const B* b) {
  const vu8x16 q = load16(b->scales);  // 12 bytes of scales, then the block's next field
  // lanes 0..7: scale j, lanes 8..15: min j (get_scale_min_k4); the masks drop what the shifts bring over
  const vu8x16 low_idx = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11};
  const vu8x16 low_mask = {63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0};
  const vu8x16 nibble_mask = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15};
  const vu8x16 high_idx = {0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7};
  const vu8x16 high_keep = {0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30};
  const vu8x16 low = shuffle_bytes(q, low_idx);
  const vu8x16 high_nibbles = lane_shift_right<4>(low);                   // bits 4..7 to 0..3
  const vu8x16 top_bits = lane_shift_right<2>(shuffle_bytes(q, high_idx));  // bits 6..7 to 4..5
  return (low & low_mask) | (high_nibbles & nibble_mask) | (top_bits & high_keep);
}

template <class Q>
struct K4Scales : ChunkScales<Q> {
  inline __attribute__((always_inline)) void load_block(const typename Q::B* b) {
    const vf32x16 values = widen_bytes(k4_scale_min_bytes(b));
    const float d = GGML_EXT_HALF_TO_FLOAT(b->d), dmin = GGML_EXT_HALF_TO_FLOAT(b->dmin);
    const vf32x16 dl = values * d, ml = values * (-dmin);
    // chunk c belongs to sub-block c / 2
    this->scale = __builtin_shufflevector(dl, dl, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    this->offset = __builtin_shufflevector(ml, ml, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  }
};

// 16 signed byte scales times one float scale.
inline __attribute__((always_inline)) vf32x16 int8_scales_times(vi8x16 s, float d) {
  return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(s, vi16x16), vi32x16), vf32x16) * d;
}

// Q6_K: 16 int8 scales, one per chunk.
struct Q6KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q6_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q6_k* b) {
    vi8x16 s;
    std::memcpy(&s, b->scales, sizeof s);
    scale = int8_scales_times(s, GGML_EXT_HALF_TO_FLOAT(b->d));
    offset = vf32x16{};
  }
};

// Q2_K: 16 bytes, scale in the low nibble and min in the high one, one per chunk.
struct Q2KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q2_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q2_k* b) {
    const vu8x16 v = load16(b->scales);
    scale = widen_bytes(v & 15) * GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = widen_bytes(v >> 4) * -GGML_EXT_HALF_TO_FLOAT(b->dmin);
  }
};

// Q3_K: 16 six-bit scales (minus 32): low nibbles from bytes 0..7, two high bits from bytes 8..11. The 16 scales
// as stored (plus 32).
inline __attribute__((always_inline)) vu8x16 q3k_scale_bytes(const block_q3_k* b) {
  // The 12 scale bytes as bytes 4..15 of one load that starts in qs: a load from the scales would take d and 2
  // bytes past the block (for a tensor's last block at the end of a mapped file, an unmapped page), and copying
  // the 12 bytes into a zeroed vector went through the stack, where the vector's load could not be forwarded
  // from the two stores: a stall every block, which made Q3_K's one-row dot 2.2-2.7x slower (2026-11-29).
  static_assert(offsetof(block_q3_k, scales) >= 4, "q3_k: 4 bytes before the scales inside the block");
  const vu8x16 v = load16(b->scales - 4);
  const vu8x16 low_idx = {4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11};
  const vu8x16 first_half = {15, 15, 15, 15, 15, 15, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0};
  const vu8x16 high_idx = {12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15};
  const vu8x16 low = shuffle_bytes(v, low_idx), high = shuffle_bytes(v, high_idx);
  const vu8x16 q0 = {3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // high bits at shift 2 * (j / 4)
  const vu8x16 q1 = shuffle_bytes(q0, vu8x16{4, 4, 4, 4, 0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4});
  const vu8x16 q2 = shuffle_bytes(q0, vu8x16{4, 4, 4, 4, 4, 4, 4, 4, 0, 1, 2, 3, 4, 4, 4, 4});
  const vu8x16 q3 = shuffle_bytes(q0, vu8x16{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 1, 2, 3});
  const vu8x16 hbits = (high & q0) | (lane_shift_right<2>(high) & q1) | (lane_shift_right<4>(high) & q2) |
                       (lane_shift_right<6>(high) & q3);  // below 4: shifted left by 4 within their bytes
  return (low & first_half) | (lane_shift_right<4>(low) & (~first_half & 15)) | lane_shift_left<4>(hbits);
}
struct Q3KScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(q3_k, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_q3_k* b) {
    scale = (widen_bytes(q3k_scale_bytes(b)) - 32.0f) * GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = vf32x16{};
  }
};

// IQ4_XS: 8 six-bit scales (minus 32), one per pair of chunks, built in byte lanes as Q3_K's are. A per-scale
// scalar loop stored 16 floats and reloaded them as a vector (a failed store forward per block): with it IQ4_XS's
// decode took 1.9x Q4_K's time at the same size (6144 x 2048, one row of x, this 2-core Zen 3).
// Lane c (chunk c, sub-block c / 2) as stored (plus 32): the low nibble of scales_l[c / 4] (its high nibble for
// odd sub-blocks), and bits 2 (c / 2 % 4) of scales_h's byte c / 8 as bits 4-5.
inline __attribute__((always_inline)) vu8x16 iq4xs_scale_bytes(const block_iq4_xs* b) {
  // The block's first 8 bytes (d, scales_h, scales_l) in one 64-bit load, rather than a 6-byte copy of the scales
  // into a zeroed vector. Bytes 0, 1 and 8..15 of the vector are never selected.
  typedef uint64_t vu64x2 __attribute__((vector_size(16)));
  uint64_t head;
  std::memcpy(&head, b, sizeof head);
  static_assert(offsetof(block_iq4_xs, scales_h) == 2 && offsetof(block_iq4_xs, scales_l) == 4, "iq4_xs head");
  const vu8x16 v = (vu8x16)vu64x2{head, 0};
  const vu8x16 low_idx = {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
  const vu8x16 even_sub = {15, 15, 0, 0, 15, 15, 0, 0, 15, 15, 0, 0, 15, 15, 0, 0};
  const vu8x16 high_idx = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  const vu8x16 h0 = {3, 3, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0};  // sub-block % 4 == 0: bits 0-1
  const vu8x16 h1 = shuffle_bytes(h0, vu8x16{2, 2, 0, 1, 2, 2, 2, 2, 2, 2, 8, 9, 2, 2, 2, 2});
  const vu8x16 h2 = shuffle_bytes(h0, vu8x16{2, 2, 2, 2, 0, 1, 2, 2, 2, 2, 2, 2, 8, 9, 2, 2});
  const vu8x16 h3 = shuffle_bytes(h0, vu8x16{2, 2, 2, 2, 2, 2, 0, 1, 2, 2, 2, 2, 2, 2, 8, 9});
  const vu8x16 low = shuffle_bytes(v, low_idx), high = shuffle_bytes(v, high_idx);
  const vu8x16 hbits = (high & h0) | (lane_shift_right<2>(high) & h1) | (lane_shift_right<4>(high) & h2) |
                       (lane_shift_right<6>(high) & h3);  // below 4: shifted left by 4 within their bytes
  return (low & even_sub) | (lane_shift_right<4>(low) & (~even_sub & 15)) | lane_shift_left<4>(hbits);
}
struct IQ4XSScales : ChunkScales<GGML_EXT_BLOCK_FORMAT(iq4_xs, 256)> {
  inline __attribute__((always_inline)) void load_block(const block_iq4_xs* b) {
    scale = (widen_bytes(iq4xs_scale_bytes(b)) - 32.0f) * GGML_EXT_HALF_TO_FLOAT(b->d);
    offset = vf32x16{};
  }
};

template <class Q>
struct ScalesOf {
  using type = ChunkScales<Q>;
};
#define GGML_EXT_SCALES_OF(name, Scales)               \
  template <>                                           \
  struct ScalesOf<GGML_EXT_BLOCK_FORMAT(name, 256)> {   \
    using type = Scales;                                \
  };
GGML_EXT_SCALES_OF(q2_k, Q2KScales)
GGML_EXT_SCALES_OF(q3_k, Q3KScales)
GGML_EXT_SCALES_OF(q4_k, K4Scales<GGML_EXT_BLOCK_FORMAT(q4_k, 256)>)
GGML_EXT_SCALES_OF(q5_k, K4Scales<GGML_EXT_BLOCK_FORMAT(q5_k, 256)>)
GGML_EXT_SCALES_OF(q6_k, Q6KScales)
GGML_EXT_SCALES_OF(iq4_xs, IQ4XSScales)
#undef GGML_EXT_SCALES_OF

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
