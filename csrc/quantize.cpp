#include "csrc/quantize.h"

#include <limits>
#include <optional>

#include "csrc/ggml_types.h"
#include "kernels/common/ggml_blocks.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "quantize";

bool can_quantize(int type) {
  switch (type) {
    case GGML_EXT_TYPE_F32: case GGML_EXT_TYPE_F16: case GGML_EXT_TYPE_BF16:
    case GGML_EXT_TYPE_Q4_0: case GGML_EXT_TYPE_Q4_1: case GGML_EXT_TYPE_Q5_0: case GGML_EXT_TYPE_Q5_1:
    case GGML_EXT_TYPE_Q8_0: case GGML_EXT_TYPE_MXFP4:
    case GGML_EXT_TYPE_Q2_K: case GGML_EXT_TYPE_Q3_K: case GGML_EXT_TYPE_Q4_K: case GGML_EXT_TYPE_Q5_K:
    case GGML_EXT_TYPE_Q6_K: case GGML_EXT_TYPE_IQ4_NL: case GGML_EXT_TYPE_IQ4_XS:
      return true;
    default:
      return false;
  }
}

// The types whose quantizer searches scales, and so can weigh each element's error (the others are
// byte-exact with gguf, which has no such input).
bool takes_imatrix(int type) {
  switch (type) {
    case GGML_EXT_TYPE_Q2_K: case GGML_EXT_TYPE_Q3_K: case GGML_EXT_TYPE_Q4_K: case GGML_EXT_TYPE_Q5_K:
    case GGML_EXT_TYPE_Q6_K: case GGML_EXT_TYPE_IQ4_NL: case GGML_EXT_TYPE_IQ4_XS:
      return true;
    default:
      return false;
  }
}

mx::Shape bytes_shape(const mx::Shape& in_shape, int type) {
  const auto info = ggml_type_info(type, kOp);
  mx::Shape shape = in_shape;
  shape.back() = static_cast<int>(ggml_row_bytes(info, shape.back(), kOp));
  return shape;
}

mx::array quantize_node(const mx::array& w, const std::optional<mx::array>& imatrix, int type,
                        mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {row_contiguous(w, stream)};
  if (imatrix) inputs.push_back(row_contiguous(*imatrix, stream));
  return mx::array(bytes_shape(w.shape(), type), mx::uint8, std::make_shared<Quantize>(stream, type), inputs);
}

void check_imatrix(const mx::array& imatrix, const mx::array& w, const GGMLTypeInfo& info) {
  if (!takes_imatrix(info.id)) {
    throw std::invalid_argument(cat("[", kOp, "] ", info.name, " is quantized exactly as gguf does and takes no "
                                    "imatrix (it weighs Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)."));
  }
  if (imatrix.dtype() != mx::float32) {
    throw type_error(cat("[", kOp, "] imatrix must be float32, got ", dtype_str(imatrix.dtype()), "."));
  }
  if (imatrix.ndim() != 1 || imatrix.shape(0) != w.shape(-1)) {
    throw std::invalid_argument(cat("[", kOp, "] imatrix must have shape (", w.shape(-1), ",): one weight per "
                                    "column of w ", shape_str(w.shape()), "; got ", shape_str(imatrix.shape()), "."));
  }
}

}  // namespace

mx::array quantize(const mx::array& w, int ggml_type, const std::optional<mx::array>& imatrix, mx::StreamOrDevice s) {
  const auto info = ggml_type_info(ggml_type, kOp);
  if (!can_quantize(ggml_type)) {
    throw not_implemented_error(cat("[", kOp, "] quantizing to ", info.name, " is not implemented (supported: "
                                    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                                    "IQ4_NL, IQ4_XS)."));
  }
  check_float_dtype(w, kOp, "w");
  if (w.ndim() == 0) {
    throw std::invalid_argument(cat("[", kOp, "] w must have at least one dimension, got a 0-d array."));
  }
  const int64_t row_bytes = ggml_row_bytes(info, w.shape(-1), kOp);
  if (imatrix) check_imatrix(*imatrix, w, info);
  int64_t rows = 1;
  for (int i = 0; i + 1 < w.ndim(); ++i) rows *= w.shape(i);
  if (rows > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(cat("[", kOp, "] w of shape ", shape_str(w.shape()), " has more than 2^31 - 1 rows."));
  }
  return mx::reshape(quantize_node(w, imatrix, ggml_type, s), {static_cast<int>(rows), static_cast<int>(row_bytes)}, s);
}

bool Quantize::is_equivalent(const mx::Primitive& other) const {
  return type_ == static_cast<const Quantize&>(other).type_;
}

std::vector<mx::Shape> Quantize::output_shapes(const std::vector<mx::array>& inputs) {
  return {bytes_shape(inputs[0].shape(), type_)};
}

std::vector<mx::array> Quantize::vjp(const std::vector<mx::array>&, const std::vector<mx::array>&,
                                     const std::vector<int>&, const std::vector<mx::array>&) {
  throw std::invalid_argument(cat("[", kOp, "] the output is integer ggml blocks, which have no gradient; for "
                                  "quantization-aware training use a straight-through estimator in float."));
}

std::vector<mx::array> Quantize::jvp(const std::vector<mx::array>&, const std::vector<mx::array>&,
                                     const std::vector<int>&) {
  throw std::invalid_argument(cat("[", kOp, "] the output is integer ggml blocks, which have no tangent; for "
                                  "quantization-aware training use a straight-through estimator in float."));
}

std::pair<std::vector<mx::array>, std::vector<int>> Quantize::vmap(const std::vector<mx::array>& inputs,
                                                                   const std::vector<int>& axes) {
  const auto s = stream();
  auto w = inputs[0];
  if (inputs.size() > 1 && axes[1] >= 0) {
    throw std::invalid_argument(cat("[", kOp, "] vmap over the imatrix is not supported: pass one (K,) imatrix "
                                    "for the whole batch."));
  }
  int ax = axes[0];
  // A batch along the quantized axis moves to the front; the others map straight through.
  if (ax == w.ndim() - 1) {
    w = mx::moveaxis(w, ax, 0, s);
    ax = 0;
  }
  std::optional<mx::array> imatrix;
  if (inputs.size() > 1) imatrix = inputs[1];
  return {{quantize_node(w, imatrix, type_, s)}, {ax}};
}

}  // namespace mlx_ggml_ext
