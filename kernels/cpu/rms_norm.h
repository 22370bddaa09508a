#pragma once
#include <cstdint>

#include "kernels/cpu/types.h"

namespace ggml_ext::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight[r / rows_per_weight], rows of `dim`
// contiguous elements, float32 math, one rounding to `type`. weight may be null.
// With `residual` (the fused residual add of a transformer layer): sum[r] = x[r] + residual[r], rounded to `type`
// and written, and y is the norm of that rounded sum (what an add followed by rms_norm gives).
struct RmsNormArgs {
  const void* x;
  const void* weight;
  void* y;
  FloatType type;
  int64_t rows;
  int64_t dim;
  int64_t rows_per_weight;
  float eps;
  const void* residual = nullptr;
  void* sum = nullptr;  // written where residual is set
};

void rms_norm(const RmsNormArgs& args);

}  // namespace ggml_ext::cpu
