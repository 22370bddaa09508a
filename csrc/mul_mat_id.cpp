#include "csrc/mul_mat_id.h"

#include "csrc/ggml_types.h"
#include "csrc/quantized_matmul.h"
#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/mul_mat_id.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "mul_mat_id";
constexpr const char* kShapelessHint = " (a function compiled with shapeless=True called with other shapes?)";

mx::array product_node(const mx::array& x, const mx::array& w, const mx::array& ids, int type, bool transpose,
                       const mx::Stream& s) {
  refuse_packed_rows_on_gpu(type, s.device, kOp);
  auto prim = std::make_shared<MulMatId>(s, type, transpose);
  std::vector<mx::array> inputs = {kernel_input(x, s), row_contiguous(w, s), kernel_input(ids, s)};
  auto shape = prim->output_shapes(inputs)[0];
  return mx::array(std::move(shape), x.dtype(), std::move(prim), std::move(inputs));
}

// ids are data: when they are already computed (typical in tests and in eager code), a bad one is a ValueError
// now; otherwise the kernel checks them before reading any weight.
void check_ids_if_available(const mx::array& ids, int64_t E) {
  if (!ids.is_available() || ids.dtype() != mx::int32 ||
      !ids.flags().row_contiguous) {
    return;
  }
  const int64_t bad = ggml_ext::cpu::first_bad_id(ids.data<int32_t>(), static_cast<int64_t>(ids.size()), E);
  if (bad >= 0) throw std::invalid_argument(bad_id_message(bad, ids.data<int32_t>()[bad], ids.shape(1), E));
}

[[noreturn]] void throw_not_differentiable(int arg, const char* what) {
  if (arg == 1) {
    throw std::invalid_argument(cat("[", kOp, "] the expert weights are raw ggml blocks (uint8 bytes), which have "
                                    "no ", what, "; mul_mat_id is differentiable in x only. Train a float adapter "
                                    "beside the quantized experts instead."));
  }
  throw std::invalid_argument(cat("[", kOp, "] ids are integer expert indices and have no ", what,
                                  "; mul_mat_id is differentiable in x only (route through the gate's scores)."));
}

}  // namespace

std::string bad_id_message(int64_t index, int64_t id, int64_t n_used, int64_t E) {
  return cat("[", kOp, "] ids[", index / std::max<int64_t>(1, n_used), ", ", index % std::max<int64_t>(1, n_used),
             "] = ", id, " is not an expert index: there are E = ", E, " experts (ids must be in [0, ", E, ")).");
}

mx::array mul_mat_id(const mx::array& w, int ggml_type, const mx::Shape& w_shape, const mx::array& x,
                     const mx::array& ids, mx::StreamOrDevice s) {
  check_float_dtype(x, kOp, "x");
  if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    throw type_error(cat("[", kOp, "] ids must be an integer array (expert indices), got ", dtype_str(ids.dtype()),
                         "."));
  }
  const auto wb = weight_bytes(w, ggml_type, kOp, "w", s);
  const mx::Shape logical = w.dtype() == mx::uint8 ? w_shape : w.shape();
  if (logical.size() != 3) {
    throw std::invalid_argument(cat("[", kOp, "] w must be 3-D experts (E, N, K), got shape ", shape_str(logical),
                                    "."));
  }
  if (x.ndim() != 3 || ids.ndim() != 2) {
    throw std::invalid_argument(cat("[", kOp, "] x must be (T, n_used or 1, K) and ids (T, n_used), got x ",
                                    shape_str(x.shape()), " and ids ", shape_str(ids.shape()), "."));
  }
  const int E = logical[0], N = logical[1], K = logical[2];
  if (x.shape(2) != K) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " has K = ", x.shape(2),
                                    " but the experts ", shape_str(logical), " take K = ", K, "."));
  }
  if (x.shape(0) != ids.shape(0) || (x.shape(1) != 1 && x.shape(1) != ids.shape(1))) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " does not fit ids ",
                                    shape_str(ids.shape()), ": x needs (T, n_used or 1, K) with the same T."));
  }
  const int64_t row_bytes = checked_row_bytes(wb.type, K, kOp);
  if (static_cast<int64_t>(wb.bytes.size()) != static_cast<int64_t>(E) * N * row_bytes) {
    throw std::invalid_argument(cat("[", kOp, "] ", ggml_type_info(wb.type, kOp).name, " experts of shape ",
                                    shape_str(logical), " need ", static_cast<int64_t>(E) * N, " x ", row_bytes,
                                    " bytes, got data of shape ", shape_str(wb.bytes.shape()), "."));
  }
  const auto stream = mx::to_stream(s);
  const mx::array ids32 = ids.dtype() == mx::int32 ? ids : mx::astype(ids, mx::int32, stream);
  check_ids_if_available(ids32, E);
  const auto w3 = reshape_shared(wb.bytes, {E, N, static_cast<int>(row_bytes)}, stream);
  return product_node(x, w3, ids32, wb.type, /*transpose=*/false, stream);
}

bool MulMatId::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const MulMatId&>(other);
  return type_ == o.type_ && transpose_ == o.transpose_;
}

// mx.compile(shapeless=True) calls this with each new call's shapes, bypassing the op's checks: the same rules
// again, so other shapes fail clearly instead of reading out of bounds.
std::vector<mx::Shape> MulMatId::output_shapes(const std::vector<mx::array>& inputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  const auto& ids = inputs[2];
  const auto info = ggml_type_info(type_, kOp);
  if (x.ndim() != 3 || w.ndim() != 3 || ids.ndim() != 2 || w.shape(2) % info.type_size != 0) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), ", ", info.name, " experts ",
                                    shape_str(w.shape()), " and ids ", shape_str(ids.shape()),
                                    " do not make a product: x (T, n_used or 1, K), experts (E, N, bytes per row), "
                                    "ids (T, n_used)", kShapelessHint, "."));
  }
  if (is_packed_rows(type_) && w.shape(1) % ggml_ext::cpu::kPackedRows != 0) {
    throw std::invalid_argument(cat("[", kOp, "] ", info.name, " experts ", shape_str(w.shape()), " must have a multiple "
                                    "of ", ggml_ext::cpu::kPackedRows, " rows (they hold groups of 8 interleaved rows)",
                                    kShapelessHint, "."));
  }
  const int64_t K = w.shape(2) / info.type_size * info.block_size;
  const int64_t x_cols = transpose_ ? w.shape(1) : K;
  const bool slots_fit = x.shape(1) == ids.shape(1) || (!transpose_ && x.shape(1) == 1);
  if (x.shape(2) != x_cols || x.shape(0) != ids.shape(0) || !slots_fit) {
    throw std::invalid_argument(cat("[", kOp, "] x ", shape_str(x.shape()), " does not fit the ", info.name,
                                    " experts ", shape_str(w.shape()), " and ids ", shape_str(ids.shape()),
                                    " (rows of ", x_cols, ", the same T, n_used or 1 slots)", kShapelessHint, "."));
  }
  return {{x.shape(0), ids.shape(1), static_cast<int>(transpose_ ? K : w.shape(1))}};
}

std::vector<mx::array> MulMatId::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                     const std::vector<int>& argnums, const std::vector<mx::array>&) {
  std::vector<mx::array> grads;
  for (int arg : argnums) {
    if (arg != 0) throw_not_differentiable(arg, "gradient");
    // Linear in x: the transposed product on the same experts; a broadcast x gathers its slots' gradients.
    auto g = product_node(cotangents[0], primals[1], primals[2], type_, !transpose_, stream());
    if (primals[0].shape(1) != g.shape(1)) g = mx::sum(g, 1, /*keepdims=*/true, stream());
    grads.push_back(mx::astype(g, primals[0].dtype(), stream()));
  }
  return grads;
}

std::vector<mx::array> MulMatId::jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                                     const std::vector<int>& argnums) {
  for (int arg : argnums) {
    if (arg != 0) throw_not_differentiable(arg, "tangent");
  }
  return {product_node(tangents[0], primals[1], primals[2], type_, transpose_, stream())};
}

// Every mapped axis becomes part of the tokens: x (V, T, X, Kx) -> (V T, X, Kx), ids (V, T, U) -> (V T, U). A
// batch of expert sets (V, E, N, bytes) becomes V E experts, version v's ids offset by v E.
std::pair<std::vector<mx::array>, std::vector<int>> MulMatId::vmap(const std::vector<mx::array>& inputs,
                                                                    const std::vector<int>& axes) {
  const auto s = stream();
  auto x = inputs[0], w = inputs[1], ids = inputs[2];
  const int x_axis = axes[0], w_axis = axes.size() > 1 ? axes[1] : -1, ids_axis = axes.size() > 2 ? axes[2] : -1;
  const int V = x_axis >= 0 ? x.shape(x_axis) : w_axis >= 0 ? w.shape(w_axis) : ids.shape(ids_axis);
  auto front = [&](mx::array a, int axis) {
    if (axis >= 0) return mx::moveaxis(a, axis, 0, s);
    mx::Shape shape = a.shape();
    shape.insert(shape.begin(), V);
    return mx::broadcast_to(mx::expand_dims(a, 0, s), shape, s);
  };
  x = front(x, x_axis);
  ids = front(ids, ids_axis);
  if (w_axis >= 0) {
    w = mx::moveaxis(w, w_axis, 0, s);
    const int E = w.shape(1);
    w = mx::reshape(w, {V * E, w.shape(2), w.shape(3)}, s);
    ids = mx::add(ids, mx::reshape(mx::multiply(mx::arange(V, mx::int32, s), mx::array(E, mx::int32), s),
                                   {V, 1, 1}, s), s);
  }
  const int T = x.shape(1);
  x = mx::reshape(x, {V * T, x.shape(2), x.shape(3)}, s);
  ids = mx::reshape(ids, {V * T, ids.shape(2)}, s);
  auto out = product_node(x, w, ids, type_, transpose_, s);
  return {{mx::reshape(out, {V, T, out.shape(1), out.shape(2)}, s)}, {0}};
}

}  // namespace mlx_ggml_ext
