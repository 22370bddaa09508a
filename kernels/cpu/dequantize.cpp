// Dequantize: each block is decoded 16 elements at a time from its shared layout and scale functions
// (kernels/common/ggml_blocks.h, which the reference decoders use too) with byte and float vectors, and
// stored as full vectors; threads take contiguous runs of blocks. The decoded types (IQ grids, ternary) have no
// layout: their reference decoders (kernels/common/iq_decoders.h) write each chunk.
//
// Built with -ffp-contract=off (cmake/cpu_variants.cmake): a decoder's d*q + m or dl*q - ml must round twice,
// as ggml and gguf do, for float32 output to be bit-identical.
#include "kernels/cpu/dequantize.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/cpu/block_codes.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

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

// Decoded types: their reference decoder per chunk (the same float operations, so the same bits).
template <class Fmt, class D>
void run_decoded(const DequantizeArgs& a) {
  parallel_for(a.n_blocks, std::max<int64_t>(1, kGrainElements / D::kQK), [&](int64_t begin, int64_t end) {
    const auto* blocks = static_cast<const typename D::B*>(a.blocks);
    auto* out = static_cast<typename Fmt::T*>(a.out);
    for (int64_t i = begin; i < end; ++i) {
      for (int c = 0; c < D::kQK / 16; ++c) {
        float y[16];
        D::chunk(blocks + i, c, y);
        vf32x16 v;
        std::memcpy(&v, y, sizeof v);
        store16<Fmt>(out + i * D::kQK + 16 * c, v);
      }
    }
  });
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
#define GGML_EXT_DEQUANTIZE_DECODED_CASE(NAME, name, id, qk, bytes) \
  case GGML_EXT_TYPE_##NAME: return run_decoded<Fmt, GGML_EXT_DECODED_FORMAT(name)>(a);

template <class Fmt>
void dequantize_to(const DequantizeArgs& a) {
  switch (a.type) {
    case GGML_EXT_TYPE_F32: return run_convert<Fmt, F32>(a);
    case GGML_EXT_TYPE_F16: return run_convert<Fmt, F16Exact>(a);
    case GGML_EXT_TYPE_BF16: return run_convert<Fmt, BF16>(a);
    GGML_EXT_FOR_EACH_LAYOUT_QUANT_TYPE(GGML_EXT_DEQUANTIZE_CASE)
    GGML_EXT_FOR_EACH_DECODED_QUANT_TYPE(GGML_EXT_DEQUANTIZE_DECODED_CASE)
    default: return;  // the primitive validated the type
  }
}
#undef GGML_EXT_DEQUANTIZE_CASE
#undef GGML_EXT_DEQUANTIZE_DECODED_CASE

}  // namespace

void dequantize(const DequantizeArgs& a) {
  GGML_EXT_FLOAT_SWITCH(a.out_type, Fmt, dequantize_to<Fmt>(a));
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(dequantize, DequantizeArgs)

}  // namespace ggml_ext::cpu
