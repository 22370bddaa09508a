#include "csrc/dequantize.h"

#include <limits>

#include "csrc/ggml_types.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "dequantize";

// The output shape for blocks of `in_shape`: the last axis counted in elements instead of bytes.
mx::Shape elements_shape(const mx::Shape& in_shape, int type) {
  const auto info = ggml_type_info(type, kOp);
  mx::Shape shape = in_shape;
  shape.back() = shape.back() / info.type_size * info.block_size;
  return shape;
}

mx::array dequantize_node(const mx::array& blocks, int type, mx::Dtype dtype, mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  return mx::array(elements_shape(blocks.shape(), type), dtype, std::make_shared<Dequantize>(stream, type, dtype),
                   {row_contiguous(blocks, stream)});
}

}  // namespace

mx::array dequantize(const mx::array& data, int ggml_type, const mx::Shape& shape, mx::Dtype dtype,
                     mx::StreamOrDevice s) {
  const auto info = ggml_type_info(ggml_type, kOp);
  if (data.dtype() != mx::uint8) {
    throw type_error(cat("[", kOp, "] data must be uint8 (raw ", info.name, " blocks), got ",
                         dtype_str(data.dtype()), "."));
  }
  if (dtype != mx::float32 && dtype != mx::float16 && dtype != mx::bfloat16) {
    throw type_error(cat("[", kOp, "] dtype must be float32, float16 or bfloat16, got ", dtype_str(dtype), "."));
  }
  if (shape.empty()) throw std::invalid_argument(cat("[", kOp, "] shape must have at least one axis, got ()."));
  int64_t rows = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw std::invalid_argument(cat("[", kOp, "] shape must be non-negative, got ", shape_str(shape), "."));
    }
    if (i + 1 < shape.size()) rows *= shape[i];
  }
  const int64_t row_bytes = ggml_row_bytes(info, shape.back(), kOp);
  if (rows > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(cat("[", kOp, "] shape ", shape_str(shape), " has more than 2^31 - 1 rows."));
  }
  const bool flat_or_rows = data.ndim() == 1 || (data.ndim() >= 1 && data.shape(-1) == row_bytes);
  if (static_cast<int64_t>(data.size()) != rows * row_bytes || !flat_or_rows) {
    throw std::invalid_argument(cat("[", kOp, "] a ", info.name, " tensor of shape ", shape_str(shape), " needs ",
                                    rows, " x ", row_bytes, " bytes (rows x bytes per row, flat or with a last "
                                    "axis of ", row_bytes, "), got data of shape ", shape_str(data.shape()), "."));
  }
  auto blocks = reshape_shared(data, {static_cast<int>(rows), static_cast<int>(row_bytes)}, s);
  return mx::reshape(dequantize_node(blocks, ggml_type, dtype, s), shape, s);
}

bool Dequantize::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Dequantize&>(other);
  return type_ == o.type_ && dtype_ == o.dtype_;
}

// mx.compile(shapeless=True) calls this with each new call's shapes, past dequantize()'s checks: rows that are
// not whole blocks must fail here, not be read past.
std::vector<mx::Shape> Dequantize::output_shapes(const std::vector<mx::array>& inputs) {
  const auto info = ggml_type_info(type_, kOp);
  const auto& blocks = inputs[0];
  if (blocks.ndim() == 0 || blocks.shape(-1) % info.type_size != 0) {
    throw std::invalid_argument(cat("[", kOp, "] ", info.name, " data of shape ", shape_str(blocks.shape()),
                                    " is not rows of whole ", info.type_size, "-byte blocks (a function compiled "
                                    "with shapeless=True called with another byte count?)."));
  }
  return {elements_shape(blocks.shape(), type_)};
}

std::vector<mx::array> Dequantize::vjp(const std::vector<mx::array>&, const std::vector<mx::array>&,
                                       const std::vector<int>&, const std::vector<mx::array>&) {
  throw std::invalid_argument(cat("[", kOp, "] the input is raw ggml blocks (uint8 bytes), which have no "
                                  "gradient; differentiate with respect to a float tensor instead."));
}

std::vector<mx::array> Dequantize::jvp(const std::vector<mx::array>&, const std::vector<mx::array>&,
                                       const std::vector<int>&) {
  throw std::invalid_argument(cat("[", kOp, "] the input is raw ggml blocks (uint8 bytes), which have no "
                                  "tangent; differentiate with respect to a float tensor instead."));
}

std::pair<std::vector<mx::array>, std::vector<int>> Dequantize::vmap(const std::vector<mx::array>& inputs,
                                                                     const std::vector<int>& axes) {
  const auto s = stream();
  auto blocks = inputs[0];
  int ax = axes[0];
  // Every axis but the bytes axis maps straight through; a batch along the bytes moves to the front.
  if (ax == blocks.ndim() - 1) {
    blocks = mx::moveaxis(blocks, ax, 0, s);
    ax = 0;
  }
  return {{dequantize_node(blocks, type_, dtype_, s)}, {ax}};
}

}  // namespace mlx_ggml_ext
