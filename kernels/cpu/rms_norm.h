#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight[r / rows_per_weight], rows of `dim`
// contiguous elements, float32 math, one rounding to `type`. weight may be null.
struct RmsNormArgs {
  const void* x;
  const void* weight;
  void* y;
  FloatType type;
  int64_t rows;
  int64_t dim;
  int64_t rows_per_weight;
  float eps;
};

void rms_norm(const RmsNormArgs& args);

}  // namespace ggml_ext::cpu
