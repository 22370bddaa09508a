// Elementwise float-format conversion over [begin, end) in the variant's vector width: what dequantize
// does for F32/F16/BF16 "blocks" and quantize does to produce them.
#pragma once
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {

template <class Out, class In>
void convert_floats(const typename In::T* x, typename Out::T* y, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) Out::store(y + i, In::load(x + i));
  for (; i < end; ++i) y[i] = Out::from_f32(In::to_f32(x[i]));
}

}  // namespace ggml_ext::cpu::GGML_EXT_ISA
