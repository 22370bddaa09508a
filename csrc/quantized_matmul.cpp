#include "csrc/quantized_matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "csrc/dequantize.h"
#include "csrc/ggml_types.h"
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/packed_rows.h"
#include "mlx/transforms.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "quantized_matmul";
constexpr const char* kMulMat = "mul_mat";

// Elements per weight row held by `row_bytes` bytes of blocks.
int64_t row_elements(int type, int64_t row_bytes) {
  const auto info = ggml_type_info(type, kOp);
  return row_bytes / info.type_size * info.block_size;
}

// The CUDA dense route: from this many rows of x per weight matrix on (past the decode kernels' 8), the product
// is our dequantize kernel (the weight in x's dtype, bfloat16 for float32 x: a temporary of N x K elements, freed
// after the product) followed by MLX's own matmul (cuBLAS), as llama.cpp's cuBLAS path does. The primitive's own
// kernels keep precise_x, mul_mat's float32 results of half x and MLX_GGML_EXT_CUDA_DENSE_ROWS=0 (no temporary). H200, ncu
// kernel times (bench/results/h200-2026-11-25y-kernel-times.json), Q4_0 on 14336x4096 / 4096x14336: m=16 76 / 79
// us against the tiles' 102 / 351, m=512 139 / 128 against 430 / 477 (MLX's float16 matmul alone: 95 / 83).
constexpr int64_t kDenseRows = 9;

int64_t dense_rows() {
  const char* v = std::getenv("MLX_GGML_EXT_CUDA_DENSE_ROWS");
  if (!v || !*v) return kDenseRows;
  char* end = nullptr;
  const long long rows = std::strtoll(v, &end, 10);
  if (*end != '\0' || rows < 0) {
    throw std::invalid_argument(cat("[", kOp, "] MLX_GGML_EXT_CUDA_DENSE_ROWS must be a row count (0: never), got '",
                                    v, "'."));
  }
  return rows == 0 ? std::numeric_limits<int64_t>::max() : rows;
}

// Float32 x on the dense route too (MLX_GGML_EXT_CUDA_DENSE_FLOAT32=0 turns it off; read once): the forward product
// without precise_x, x and the dequantized weight in bfloat16 (as the tensor-core tiles round them), MLX's
// bfloat16 matmul with float32 sums, the result cast back to float32 (so also rounded to bfloat16 once). H200,
// Llama-1B-shaped models with float32 activations, prefill 512 tok/s, 2 alternated rounds: Q4_0 38.7k / 35.1k
// against the int8 tiles' 27.9k / 28.5k and the bfloat16 tiles' 20.9k / 20.0k; Q4_K 32.7k / 45.2k against
// 26.9k / 28.4k and 22.5k / 22.2k. Kernel-only at 4096x14336, 512 rows (float16 x): dequantize + cuBLAS
// 128-132 us, the int8 tiles 456-503 us.
bool dense_float32() {
  static const bool on = [] {
    const char* v = std::getenv("MLX_GGML_EXT_CUDA_DENSE_FLOAT32");
    if (!v || !*v || std::strcmp(v, "1") == 0) return true;
    if (std::strcmp(v, "0") == 0) return false;
    throw std::invalid_argument(cat("[", kOp, "] MLX_GGML_EXT_CUDA_DENSE_FLOAT32 must be 0 or 1, got '", v, "'."));
  }();
  return on;
}

// Whether the product of x (rows of K) with the weight w (A3, A2, N, row_bytes) takes the dense route.
bool takes_dense_route(const mx::array& x, const mx::array& w, int type, bool transpose, mx::Dtype out_dtype,
                       bool precise_x, const mx::Stream& stream) {
#if defined(MLX_GGML_EXT_BACKEND_CUDA)
  if (stream.device != mx::Device::gpu || out_dtype != x.dtype()) return false;
  const bool half_x = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  const bool quantized = type != GGML_EXT_TYPE_F32 && type != GGML_EXT_TYPE_F16 && type != GGML_EXT_TYPE_BF16;
  const bool float32_x = x.dtype() == mx::float32 && quantized && !transpose && !precise_x && dense_float32();
  if (!half_x && !float32_x) return false;
  const bool one_matrix = w.shape(0) * w.shape(1) == 1;
  const int64_t rows = one_matrix ? static_cast<int64_t>(x.size()) / std::max(1, x.shape(-1)) : x.shape(2);
  return rows >= dense_rows();
#else
  (void)x, (void)w, (void)type, (void)transpose, (void)out_dtype, (void)precise_x, (void)stream;
  return false;
#endif
}

// The dense route: x (..., Kx) against one matrix, or x (B3, B2, M, Kx) against w's batches with ggml's
// broadcasting (b batch i uses a batch i / ratio, so B3 splits as (A3, B3 / A3), and B2 likewise).
mx::array dense_product(const mx::array& x, const mx::array& w, int type, bool transpose, const mx::Stream& s) {
  const int64_t A3 = w.shape(0), A2 = w.shape(1), N = w.shape(2);
  const int K = static_cast<int>(row_elements(type, w.shape(3)));
  const mx::array deq = dequantize(w, type, {static_cast<int>(A3), static_cast<int>(A2), static_cast<int>(N), K},
                                   x.dtype(), s);
  if (A3 * A2 == 1) {
    const mx::array m = mx::reshape(deq, {static_cast<int>(N), K}, s);
    return mx::matmul(x, transpose ? m : mx::transpose(m, s), s);
  }
  const int B3 = x.shape(0), B2 = x.shape(1), M = x.shape(2), Kx = x.shape(3);
  const int a3 = static_cast<int>(A3), a2 = static_cast<int>(A2), n = static_cast<int>(N);
  const auto x6 = mx::reshape(x, {a3, B3 / a3, a2, B2 / a2, M, Kx}, s);
  auto w6 = mx::reshape(deq, {a3, 1, a2, 1, n, K}, s);
  if (!transpose) w6 = mx::swapaxes(w6, -1, -2, s);
  const auto out = mx::matmul(x6, w6, s);
  return mx::reshape(out, {B3, B2, M, out.shape(-1)}, s);
}

mx::array product_node(const mx::array& x, const mx::array& w, int type, bool transpose, mx::Dtype out_dtype,
                       mx::StreamOrDevice s, bool precise_x = false) {
  auto stream = mx::to_stream(s);
  if (takes_dense_route(x, w, type, transpose, out_dtype, precise_x, stream)) {
    if (x.dtype() != mx::float32) return dense_product(x, w, type, transpose, stream);
    // Float32 x: the product in bfloat16, its gradient the float32 transposed product QuantizedMatmul::vjp gives
    // (MLX's gradient of the casts and the bfloat16 matmul would be bfloat16's).
    auto forward = [w, type, transpose, stream](const std::vector<mx::array>& in) {
      const mx::array y = dense_product(mx::astype(in[0], mx::bfloat16, stream), w, type, transpose, stream);
      return std::vector<mx::array>{mx::astype(y, mx::float32, stream)};
    };
    auto backward = [w, type, transpose, stream](const std::vector<mx::array>&, const std::vector<mx::array>& cot,
                                                 const std::vector<mx::array>&) {
      return std::vector<mx::array>{product_node(cot[0], w, type, !transpose, mx::float32, stream)};
    };
    return mx::custom_vjp(forward, backward)({x})[0];
  }
  refuse_packed_rows_on_gpu(type, stream.device, kOp);
  auto prim = std::make_shared<QuantizedMatmul>(stream, type, transpose, out_dtype, precise_x && !transpose);
  std::vector<mx::array> inputs = {kernel_input(x, stream), row_contiguous(w, stream)};
  auto shape = prim->output_shapes(inputs)[0];
  return mx::array(std::move(shape), out_dtype, std::move(prim), std::move(inputs));
}

}  // namespace

WeightBytes weight_bytes(const mx::array& w, int ggml_type, const char* op, const char* arg,
                         mx::StreamOrDevice s) {
  if (w.dtype() == mx::uint8) {
    if (ggml_type < 0) {
      throw type_error(cat("[", op, "] ", arg, " is uint8 (raw ggml blocks): give its ggml type."));
    }
    ggml_type_info(ggml_type, op);
    return {w, ggml_type};
  }
  check_float_dtype(w, op, arg);
  const int type = w.dtype() == mx::float32   ? GGML_EXT_TYPE_F32
                   : w.dtype() == mx::float16 ? GGML_EXT_TYPE_F16
                                              : GGML_EXT_TYPE_BF16;
  if (ggml_type >= 0 && ggml_type != type) {
    throw type_error(cat("[", op, "] ", arg, " is a ", dtype_str(w.dtype()), " array but ggml_type says ",
                         ggml_type_info(ggml_type, op).name, "; pass raw blocks as uint8."));
  }
  if (w.ndim() == 0) throw std::invalid_argument(cat("[", op, "] ", arg, " must have at least one dimension."));
  mx::Shape shape = w.shape();
  shape.back() *= static_cast<int>(w.itemsize());
  return {mx::reshape(mx::view(row_contiguous(w, s), mx::uint8, s), shape, s), type};
}

int64_t checked_row_bytes(int type, int64_t K, const char* op) {
  const auto info = ggml_type_info(type, op);
  if (K % info.block_size != 0) {
    throw std::invalid_argument(cat("[", op, "] K = ", K, " is not a multiple of ", info.name,
                                    "'s block size ", info.block_size, "; ", info.name,
                                    " weights need rows of whole blocks."));
  }
  return ggml_row_bytes(info, K, op);
}

namespace {

// ggml's broadcasting of a's batch axis over b's (b's a multiple of a's); an empty axis of a only pairs with an
// empty one of b (no division by 0).
bool batch_broadcasts(int64_t a_axis, int64_t b_axis) { return a_axis == 0 ? b_axis == 0 : b_axis % a_axis == 0; }

mx::Shape padded_to_4d(const mx::Shape& shape) {
  mx::Shape out(4 - shape.size(), 1);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w_blocks, int ggml_type, mx::StreamOrDevice s,
                           bool precise_x) {
  check_float_dtype(x, kOp, "x");
  if (x.ndim() == 0) throw std::invalid_argument(cat("[", kOp, "] x must have at least one dimension."));
  const auto w = weight_bytes(w_blocks, ggml_type, kOp, "w", s);
  const auto info = ggml_type_info(w.type, kOp);
  const int64_t K = x.shape(-1);
  const int64_t row_bytes = checked_row_bytes(w.type, K, kOp);
  if (w.bytes.ndim() != 2 || w.bytes.shape(1) != row_bytes) {
    throw std::invalid_argument(cat("[", kOp, "] x has K = ", K, ", so a ", info.name, " weight (N, ", K,
                                    ") needs blocks of shape (N, ", row_bytes, ") (bytes per row), got ",
                                    shape_str(w.bytes.shape()), "."));
  }
  // x keeps its shape (so mx.compile(shapeless=True) can vary it); the weight is one unbatched matrix.
  auto w4 = reshape_shared(w.bytes, {1, 1, w.bytes.shape(0), static_cast<int>(row_bytes)}, s);
  return product_node(x, w4, w.type, /*transpose=*/false, x.dtype(), s, precise_x);
}

mx::array mul_mat(const mx::array& a, int ggml_type, const mx::Shape& a_shape, const mx::array& b,
                  mx::StreamOrDevice s) {
  check_float_dtype(b, kMulMat, "b");
  const auto w = weight_bytes(a, ggml_type, kMulMat, "a", s);
  const mx::Shape logical = a.dtype() == mx::uint8 ? a_shape : a.shape();  // blocks carry their shape apart
  if (logical.empty() || logical.size() > 4 || b.ndim() < 1 || b.ndim() > 4) {
    throw std::invalid_argument(cat("[", kMulMat, "] a and b must have 1 to 4 dimensions (ggml tensors), got a ",
                                    shape_str(logical), " and b ", shape_str(b.shape()), "."));
  }
  const auto a4 = padded_to_4d(logical), b4 = padded_to_4d(b.shape());
  const int64_t K = a4[3];
  if (b4[3] != K) {
    throw std::invalid_argument(cat("[", kMulMat, "] a ", shape_str(logical), " and b ", shape_str(b.shape()),
                                    " must agree on K (the last axis, ggml's ne0): ", K, " != ", b4[3], "."));
  }
  if (!batch_broadcasts(a4[1], b4[1]) || !batch_broadcasts(a4[0], b4[0])) {
    throw std::invalid_argument(cat("[", kMulMat, "] b's batch axes ", shape_str(b.shape()),
                                    " must be multiples of a's ", shape_str(logical),
                                    " (ggml broadcasts a over b: B2 % A2 == 0 and B3 % A3 == 0)."));
  }
  const int64_t row_bytes = checked_row_bytes(w.type, K, kMulMat);
  const int64_t a_rows = static_cast<int64_t>(a4[0]) * a4[1] * a4[2];
  if (static_cast<int64_t>(w.bytes.size()) != a_rows * row_bytes) {
    throw std::invalid_argument(cat("[", kMulMat, "] a ", ggml_type_info(w.type, kMulMat).name, " tensor of shape ",
                                    shape_str(logical), " needs ", a_rows, " x ", row_bytes,
                                    " bytes, got data of shape ", shape_str(w.bytes.shape()), "."));
  }
  auto w4 = reshape_shared(w.bytes, {a4[0], a4[1], a4[2], static_cast<int>(row_bytes)}, s);
  auto out = product_node(mx::reshape(b, b4, s), w4, w.type, /*transpose=*/false, mx::float32, s);
  const size_t nd = std::max(logical.size(), static_cast<size_t>(b.ndim()));
  mx::Shape out_shape(out.shape().end() - nd, out.shape().end());
  return mx::reshape(out, out_shape, s);
}

bool QuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatmul&>(other);
  return type_ == o.type_ && transpose_ == o.transpose_ && out_dtype_ == o.out_dtype_ && precise_x_ == o.precise_x_;
}

// mx.compile(shapeless=True) calls this with the shapes of each new call, bypassing the op's checks: the same
// rules are checked again here, so another K (or weight) fails clearly instead of reading out of bounds.
std::vector<mx::Shape> QuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  const auto info = ggml_type_info(type_, kOp);
  const char* hint = " (a function compiled with shapeless=True called with other shapes?)";
  if (x.ndim() == 0 || w.ndim() != 4 || w.shape(3) % info.type_size != 0) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " and ", info.name, " blocks ",
                                    shape_str(w.shape()), " do not make a product: the blocks need (..., N, "
                                    "bytes per row) with whole ", info.type_size, "-byte blocks", hint, "."));
  }
  if (is_packed_rows(type_) && w.shape(2) % ggml_ext::cpu::kPackedRows != 0) {
    throw std::invalid_argument(cat("[", kOp, "] ", info.name, " blocks ", shape_str(w.shape()), " must have a multiple of ",
                                    ggml_ext::cpu::kPackedRows, " rows (they hold groups of 8 interleaved rows)",
                                    hint, "."));
  }
  const int64_t K = transpose_ ? w.shape(2) : row_elements(type_, w.shape(3));
  if (x.shape(-1) != K) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " has ", x.shape(-1),
                                    " elements per row but the ", info.name, " weight ", shape_str(w.shape()),
                                    " takes ", K, hint, "."));
  }
  if (w.shape(0) * w.shape(1) != 1 &&
      (x.ndim() != 4 || !batch_broadcasts(w.shape(0), x.shape(0)) || !batch_broadcasts(w.shape(1), x.shape(1)))) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " does not broadcast with the weight "
                                    "batches ", shape_str(w.shape()), " (B2 % A2 == 0 and B3 % A3 == 0)", hint, "."));
  }
  mx::Shape shape = x.shape();
  shape.back() = transpose_ ? static_cast<int>(row_elements(type_, w.shape(3))) : w.shape(2);
  return {shape};
}

namespace {
[[noreturn]] void throw_weight_not_differentiable(const char* what) {
  throw std::invalid_argument(cat("[", kOp, "] the weight is raw ggml blocks (uint8 bytes), which have no ",
                                  what, "; quantized_matmul and mul_mat are differentiable in x (b) only. "
                                  "Train a float adapter (e.g. LoRA) beside the quantized weight instead."));
}
}  // namespace

std::vector<mx::array> QuantizedMatmul::vjp(const std::vector<mx::array>& primals,
                                            const std::vector<mx::array>& cotangents,
                                            const std::vector<int>& argnums, const std::vector<mx::array>&) {
  std::vector<mx::array> grads;
  for (int arg : argnums) {
    if (arg != 0) throw_weight_not_differentiable("gradient");
    // The product is linear in x: its transpose applied to the cotangent, on the same blocks.
    grads.push_back(product_node(cotangents[0], primals[1], type_, !transpose_, primals[0].dtype(), stream()));
  }
  return grads;
}

std::vector<mx::array> QuantizedMatmul::jvp(const std::vector<mx::array>& primals,
                                            const std::vector<mx::array>& tangents, const std::vector<int>& argnums) {
  for (int arg : argnums) {
    if (arg != 0) throw_weight_not_differentiable("tangent");
  }
  return {product_node(tangents[0], primals[1], type_, transpose_, out_dtype_, stream(), precise_x_)};
}

std::pair<std::vector<mx::array>, std::vector<int>> QuantizedMatmul::vmap(const std::vector<mx::array>& inputs,
                                                                           const std::vector<int>& axes) {
  const auto s = stream();
  auto x = inputs[0];
  auto w = inputs[1];
  int x_axis = axes[0];
  const int w_axis = axes.size() > 1 ? axes[1] : -1;
  if (w_axis < 0 && w.shape(0) * w.shape(1) == 1) {
    // One weight matrix: every axis of x but the last is rows, so the mapped axis is one more.
    if (x_axis == x.ndim() - 1) {
      x = mx::moveaxis(x, x_axis, 0, s);
      x_axis = 0;
    }
    return {{product_node(x, w, type_, transpose_, out_dtype_, s, precise_x_)}, {x_axis}};
  }
  if (w_axis < 0) {
    // Batched weights, x mapped: the mapped axis joins x's rows (M) within each batch.
    x = mx::moveaxis(x, x_axis, 2, s);  // (B3, B2, V, M, K)
    const int V = x.shape(2);
    auto x4 = mx::reshape(x, {x.shape(0), x.shape(1), V * x.shape(3), x.shape(4)}, s);
    auto out = product_node(x4, w, type_, transpose_, out_dtype_, s, precise_x_);
    return {{mx::reshape(out, {x.shape(0), x.shape(1), V, x.shape(3), out.shape(3)}, s)}, {2}};
  }
  // A batch of weights: the mapped axis becomes the outermost batch of both, (V * B3, ...) against
  // (V * A3, ...), which ggml's broadcasting pairs batch by batch.
  w = mx::moveaxis(w, w_axis, 0, s);
  const int V = w.shape(0);
  if (x_axis < 0) {
    mx::Shape shape = x.shape();
    shape.insert(shape.begin(), V);
    x = mx::broadcast_to(x, shape, s);
  } else {
    x = mx::moveaxis(x, x_axis, 0, s);
  }
  const mx::Shape x_shape = x.shape();  // (V, ..., K)
  mx::Shape x4 = x_shape;
  if (x.ndim() != 5) {  // x's own axes were all rows: (V, 1, 1, rows, K)
    const int rows = static_cast<int>(x.size() / std::max<int64_t>(1, static_cast<int64_t>(V) * x_shape.back()));
    x4 = {V, 1, 1, rows, x_shape.back()};
  }
  auto w4 = mx::reshape(w, {V * w.shape(1), w.shape(2), w.shape(3), w.shape(4)}, s);
  auto out = product_node(mx::reshape(x, {V * x4[1], x4[2], x4[3], x4[4]}, s), w4, type_, transpose_, out_dtype_, s, precise_x_);
  mx::Shape out_shape = x_shape;
  out_shape.back() = out.shape(3);
  return {{mx::reshape(out, out_shape, s)}, {0}};
}

}  // namespace mlx_ggml_ext
