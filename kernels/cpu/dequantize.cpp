// Dequantize: each block is decoded 16 elements at a time from its shared layout and scale functions
// (kernels/common/ggml_blocks.h, which the reference decoders use too) with byte and float vectors, and
// stored as full vectors; threads take contiguous runs of blocks.
//
// Built with -ffp-contract=off (cmake/cpu_variants.cmake): a decoder's d*q + m or dl*q - ml must round twice,
// as ggml and gguf do, for float32 output to be bit-identical.
#include "kernels/cpu/dequantize.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__F16C__)
#include <immintrin.h>
// Scales in hardware: a signalling NaN scale comes out quiet, as any product with it does anyway.
#define GGML_EXT_HALF_TO_FLOAT(h) _cvtsh_ss(h)
#endif
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

// The 64-byte vectors below only cross always-inline helpers of this file: no ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

// Elements per thread part: below this, waking a thread costs more than it saves.
constexpr int64_t kGrainElements = 32768;

// float16 input converted with integer operations: bit for bit, NaN payloads included (the hardware
// conversion quiets signalling NaNs; numpy, and so gguf, keeps them).
struct F16Exact : F16 {
  static vf32 load(const uint16_t* p) {
    typedef int32_t vi32 __attribute__((vector_size(kLanes * 4)));
    vu16 h;
    std::memcpy(&h, p, sizeof h);
    const vu32 w = __builtin_convertvector(h, vu32);
    const vu32 magnitude = w & 0x7fffu;
    const vu32 normal = (magnitude << 13) + (112u << 23);      // rebias the exponent 15 -> 127
    const vu32 inf_nan = normal + (112u << 23);                 // exponent all ones stays all ones
    const vf32 subnormal = __builtin_convertvector((vi32)magnitude, vf32) * 5.9604644775390625e-8f;  // m * 2^-24
    const vu32 is_inf_nan = (vu32)(magnitude >= 0x7c00u);
    const vu32 is_subnormal = (vu32)(magnitude < 0x400u);
    const vu32 bits = (normal & ~(is_inf_nan | is_subnormal)) | (inf_nan & is_inf_nan) |
                      ((vu32)subnormal & is_subnormal);
    return (vf32)(bits | ((w & 0x8000u) << 16));
  }
};

// 16 lanes whatever the variant's width: GCC lowers these to 1, 2 or 4 native vectors.
typedef uint8_t vu8x16 __attribute__((vector_size(16)));
typedef int8_t vi8x16 __attribute__((vector_size(16)));
typedef int16_t vi16x16 __attribute__((vector_size(32)));
typedef int32_t vi32x16 __attribute__((vector_size(64)));
typedef float vf32x16 __attribute__((vector_size(64)));

// A block type with its shared layout and scale functions (kernels/common/ggml_blocks.h).
template <class Block, int QK, ggml_ext_layout16 (*Layout)(int), ggml_ext_scale16 (*Scale)(const Block*, int)>
struct BlockFormat {
  using B = Block;
  static constexpr int kQK = QK;
  static ggml_ext_layout16 layout(int chunk) { return Layout(chunk); }
  static ggml_ext_scale16 scale(const Block* b, int chunk) { return Scale(b, chunk); }
};

#define GGML_EXT_BLOCK_FORMAT(name, qk) \
  BlockFormat<block_##name, qk, ggml_ext_layout16_##name, ggml_ext_scale16_##name<const block_##name*>>

inline vu8x16 load16(const uint8_t* p) {
  vu8x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The codebook of a layout as a byte vector (unused for plain codes).
inline vi8x16 codebook_table(int codebook) {
  vi8x16 t = {};
  if (codebook != GGML_EXT_CODEBOOK_NONE) {
    for (int k = 0; k < 16; ++k) t[k] = static_cast<int8_t>(ggml_ext_codebook_value(codebook, k));
  }
  return t;
}

// ggml_ext_code16 of the layout for all 16 elements at once.
inline __attribute__((always_inline)) vi8x16 codes16(const uint8_t* block, const ggml_ext_layout16& l,
                                                     vi8x16 table) {
  vu8x16 part = (load16(block + l.lo) >> l.lo_shift) & static_cast<uint8_t>(l.lo_mask);
  if (l.hi_word) {
    // Bits hi_shift + j of the little-endian word: hi_shift is 0 or 16, so they are two whole bytes, one
    // per half of the lanes; byte tests keep this in byte vectors on every ISA.
    const uint8_t first = block[l.hi + l.hi_shift / 8], second = block[l.hi + l.hi_shift / 8 + 1];
    const vu8x16 bytes = {first, first, first, first, first, first, first, first,
                          second, second, second, second, second, second, second, second};
    const vu8x16 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    part |= (vu8x16)((bytes & bit) != 0) & static_cast<uint8_t>(1u << l.hi_pos);
  } else if (l.hi_mask) {
    part |= ((load16(block + l.hi) >> l.hi_shift) & static_cast<uint8_t>(l.hi_mask)) << l.hi_pos;
  }
  if (l.codebook != GGML_EXT_CODEBOOK_NONE) return __builtin_shuffle(table, part);
  return (vi8x16)part - static_cast<int8_t>(l.zero);
}

// ggml_ext_apply_scale16 for all 16 codes: the same two roundings (no contraction in this file).
inline __attribute__((always_inline)) vf32x16 values16(vi8x16 codes, const ggml_ext_scale16& s) {
  // Widening in two steps: GCC 12 scalarizes a direct int8 -> int32 conversion.
  const vi32x16 wide = __builtin_convertvector(__builtin_convertvector(codes, vi16x16), vi32x16);
  vf32x16 v = __builtin_convertvector(wide, vf32x16) * s.scale;
  if (s.offset_op < 0) v = v - s.offset;  // both NaN: the first operand's, the product's, as in gguf
  if (s.offset_op > 0) {
    // An addition's operands may be swapped by the compiler, which changes the NaN returned when both are
    // NaN: keep the product's explicitly. The NaN mask comes from the bits by arithmetic (GCC 12 scalarizes
    // compares of 16-lane vectors below AVX-512).
    const vf32x16 sum = v + s.offset;
    const vi32x16 nan = ~((((vi32x16)v & 0x7fffffff) - 0x7f800001) >> 31);
    v = (vf32x16)(((vi32x16)v & nan) | ((vi32x16)sum & ~nan));
  }
  return v;
}

template <class Fmt>
inline __attribute__((always_inline)) void store16(typename Fmt::T* y, const vf32x16& v) {
  if constexpr (std::is_same_v<Fmt, F32>) {
    std::memcpy(y, &v, sizeof v);
  } else {
    float tmp[16];
    std::memcpy(tmp, &v, sizeof v);
    for (int i = 0; i < 16; i += kLanes) Fmt::store(y + i, F32::load(tmp + i));
  }
}

template <class Fmt, class Q>
void dequantize_blocks(const DequantizeArgs& a, int64_t begin, int64_t end) {
  const auto* src = static_cast<const uint8_t*>(a.blocks);
  auto* out = static_cast<typename Fmt::T*>(a.out);
  const vi8x16 table = codebook_table(Q::layout(0).codebook);
  for (int64_t i = begin; i < end; ++i) {
    const uint8_t* block = src + i * sizeof(typename Q::B);
    const auto* b = reinterpret_cast<const typename Q::B*>(block);
    // Unrolled: each chunk's layout is a constant and the block's float16 scales are converted once.
    [&]<int... c>(std::integer_sequence<int, c...>) {
      (store16<Fmt>(out + i * Q::kQK + 16 * c, values16(codes16(block, Q::layout(c), table), Q::scale(b, c))), ...);
    }(std::make_integer_sequence<int, Q::kQK / 16>{});
  }
}

template <class Fmt, class Q>
void run_blocks(const DequantizeArgs& a) {
  parallel_for(a.n_blocks, std::max<int64_t>(1, kGrainElements / Q::kQK),
               [&](int64_t b, int64_t e) { dequantize_blocks<Fmt, Q>(a, b, e); });
}

template <class Out, class In>
void run_convert(const DequantizeArgs& a) {
  // F32/F16/BF16 "blocks": a conversion, exact into float32.
  const auto* x = static_cast<const typename In::T*>(a.blocks);
  auto* y = static_cast<typename Out::T*>(a.out);
  parallel_for(a.n_blocks, kGrainElements, [&](int64_t b, int64_t e) { convert_floats<Out, In>(x, y, b, e); });
}

#define GGML_EXT_DEQUANTIZE_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return run_blocks<Fmt, GGML_EXT_BLOCK_FORMAT(name, qk)>(a);

template <class Fmt>
void dequantize_to(const DequantizeArgs& a) {
  switch (a.type) {
    case GGML_EXT_TYPE_F32: return run_convert<Fmt, F32>(a);
    case GGML_EXT_TYPE_F16: return run_convert<Fmt, F16Exact>(a);
    case GGML_EXT_TYPE_BF16: return run_convert<Fmt, BF16>(a);
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_DEQUANTIZE_CASE)
    default: return;  // the primitive validated the type
  }
}
#undef GGML_EXT_DEQUANTIZE_CASE

}  // namespace

void dequantize(const DequantizeArgs& a) {
  GGML_EXT_FLOAT_SWITCH(a.out_type, Fmt, dequantize_to<Fmt>(a));
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(dequantize, DequantizeArgs)

}  // namespace ggml_ext::cpu
