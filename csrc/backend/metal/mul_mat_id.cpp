// Metal eval_gpu of MulMatId (kernels/metal/mul_mat_id.metal: the ids read by the kernels, a bad one giving its
// pair a row of NaN). Forward: the pairs grouped by expert on the GPU into a scratch buffer
// (mul_mat_id_groups.metal), then the grouped product reading it; no host round trip. Checked in the project's
// Metal emulator (tests/test_metal_emulation.py); not run on Apple hardware.
#include "csrc/mul_mat_id.h"

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "csrc/backend/metal/metal_kernel.h"
#include "csrc/ggml_types.h"

namespace mlx_ggml_ext {

void MulMatId::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "mul_mat_id";
  const auto& x = inputs[0];    // (T, X, Kx), row-contiguous: the op inserted the copies
  const auto& w = inputs[1];    // (E, N, row_bytes) uint8
  const auto& ids = inputs[2];  // (T, n_used) int32
  output_shapes(inputs);        // throws on inputs that do not fit (shapeless compile)
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  check_block_alignment(w, type_, op);
  const auto info = ggml_type_info(type_, op);
  const int64_t row_bytes = w.shape(2), K = row_bytes / info.type_size * info.block_size;
  checked_u32(static_cast<int64_t>(ids.size()), op, "tokens x n_used");  // the grid's pairs
  checked_u32(K + 15, op, "K + 15");  // the kernels count K's runs of 16 as (K + 15) / 16
  const ggml_ext_metal::MulMatIdArgs args{checked_u32(ids.shape(0), op, "tokens"),
                                          checked_u32(ids.shape(1), op, "n_used"),
                                          checked_u32(x.shape(1), op, "x slots"),
                                          checked_u32(w.shape(0), op, "experts"),
                                          checked_u32(w.shape(1), op, "N"),
                                          checked_u32(K, op, "K"),
                                          checked_u32(row_bytes, op, "row bytes"),
                                          ggml_ext_metal::line_offset(w.data<uint8_t>()),
                                          ggml_ext_metal::line_offset(x.data<uint8_t>())};
  const auto plan = ggml_ext_metal::plan_mul_mat_id(kernel_type_name(type_, op), metal_dtype_suffix(out.dtype()),
                                                    transpose_, args);
  if (plan.group.kernel.empty()) {  // the transposed product reads the ids itself
    MetalKernel(stream(), plan.product.kernel)
        .input(x, 0)
        .input(w, 1)
        .input(ids, 2)
        .output(out, 3)
        .bytes(plan.product.args, 4)
        .dispatch(plan.product.grid);
    return;
  }
  // The scratch's int32 entries (offsets, cursors and sorted pairs) must fit an MLX shape.
  const uint64_t scratch_entries = plan.scratch_bytes / 4;
  if (scratch_entries > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument(cat("[", op, "] ", w.shape(0), " experts and ", ids.size(),
                                    " (token, slot) pairs are too many for the Metal kernels' scratch."));
  }
  mx::array scratch(mx::Shape{static_cast<int32_t>(scratch_entries)}, mx::int32, nullptr, {});
  scratch.set_data(mx::allocator::malloc(scratch.nbytes()));
  MetalKernel(stream(), plan.group.kernel)
      .input(ids, 2)
      .bytes(plan.group.args, 4)
      .output(scratch, 5)
      .dispatch(plan.group.grid);
  MetalKernel(stream(), plan.product.kernel)
      .input(x, 0)
      .input(w, 1)
      .output(out, 3)
      .bytes(plan.product.args, 4)
      .temporary_input(scratch, 5)  // kept alive until the GPU is done with it
      .dispatch(plan.product.grid);
}

}  // namespace mlx_ggml_ext
