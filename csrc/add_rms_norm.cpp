// The residual add fused with rms_norm (csrc/rms_norm.h): one node where a decode step had two. Its
// transformations are those of the unfused graph, h = x + residual and rms_norm(h), which they build: they are not
// on the speed path, and RMSNorm's own vjp/jvp/vmap then give exactly the unfused op's numbers.
#include "csrc/rms_norm.h"
#include "mlx/transforms.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "add_rms_norm";

// The unfused graph over the primitive's inputs (x, residual[, weight]), already of one dtype.
GraphFn unfused(float eps, mx::Stream s) {
  return [eps, s](const std::vector<mx::array>& in) {
    auto h = mx::add(in[0], in[1], s);
    std::optional<mx::array> w;
    if (in.size() > 2) w = in[2];
    return std::vector<mx::array>{h, rms_norm(h, w, eps, s)};
  };
}

}  // namespace

std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight, float eps, mx::StreamOrDevice s) {
  const mx::Dtype norm_dtype = checked_norm_dtype(kOp, x, weight, eps);
  check_float_dtype(residual, kOp, "residual");
  const mx::Dtype dtype = mx::promote_types(norm_dtype, residual.dtype());
  if (x.shape() != residual.shape()) {
    throw std::invalid_argument(cat("[", kOp, "] x and residual must have the same shape, got ", shape_str(x.shape()),
                                    " and ", shape_str(residual.shape()), "."));
  }
  const auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(mx::astype(x, dtype, stream), stream),
                                   kernel_input(mx::astype(residual, dtype, stream), stream)};
  if (weight) inputs.push_back(kernel_input(mx::astype(*weight, dtype, stream), stream));
  return mx::array::make_arrays({x.shape(), x.shape()}, {dtype, dtype}, std::make_shared<AddRMSNorm>(stream, eps),
                                inputs);
}

std::vector<mx::array> AddRMSNorm::vjp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents, const std::vector<int>& argnums,
                                       const std::vector<mx::array>&) {
  return vjp_through(unfused(eps_, stream()), primals, cotangents, argnums);
}

std::vector<mx::array> AddRMSNorm::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                       const std::vector<int>& argnums) {
  return jvp_through(unfused(eps_, stream()), primals, tangents, argnums, stream());
}

std::pair<std::vector<mx::array>, std::vector<int>> AddRMSNorm::vmap(const std::vector<mx::array>& inputs,
                                                                     const std::vector<int>& axes) {
  return {mx::vmap(unfused(eps_, stream()), axes, {0, 0})(inputs), {0, 0}};
}

}  // namespace mlx_ggml_ext
