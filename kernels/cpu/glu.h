#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// The gated activations of ggml's GLU ops. swiglu_oai is gpt-oss's clamped SwiGLU (ggml_swiglu_oai):
// x = min(gate, limit), y = clamp(up, -limit, limit), out = x sigmoid(alpha x) (y + 1).
enum class GluKind : int { swiglu = 0, geglu = 1, geglu_erf = 2, swiglu_oai = 3 };

// y[r, c] = act(gate[r * in_stride + c]) * up[r * in_stride + c] for rows r < rows, columns c < cols, y rows
// of `cols` contiguous elements; float32 math, one rounding to `type`. gate and up share `type`; they may be
// two halves of one row (in_stride = 2 cols, up = gate + cols) or two arrays (in_stride = cols).
struct GluArgs {
  const void* gate;
  const void* up;
  void* y;
  FloatType type;
  GluKind kind;
  int64_t rows;
  int64_t cols;
  int64_t in_stride;
  float alpha = 1.702f, limit = 7.0f;  // swiglu_oai only
};

void glu(const GluArgs& args);

}  // namespace ggml_ext::cpu
