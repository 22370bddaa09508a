// KVCacheAppend's eval_gpu on Metal: the output's memory (the cache's buffer, or a new one from MLX's allocator),
// then a dispatch per copy of kernels/metal/kv_cache.metal (the new rows; the old ones first when they move to a
// new buffer). Written against MLX 0.32's Metal backend; not run on Apple hardware (the kernel and its launch
// plan run in tests/test_metal_emulation_kv_cache.py).
#include "csrc/backend/metal/metal_kernel.h"
#include "csrc/kv_cache.h"

namespace mlx_ggml_ext {

namespace gm = ggml_ext_metal;

void KVCacheAppend::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "kv_cache_append";
  output_shapes(inputs);  // throws on inputs that do not fit (never writes past the buffer below)
  // The kernel binds its source by input, not by address (place's pointers are unused here).
  const auto copies = place(inputs, out, [](const mx::array&) -> void* { return nullptr; });
  for (const auto& copy : copies) {
    gm::RowsCopyArgs args{checked_u32(copy.batch, op, "batch"), checked_u32(copy.heads, op, "heads"),
                          checked_u32(copy.rows, op, "rows"), checked_u32(copy.dim, op, "head dim"), {},
                          checked_u32(copy.dst_rows, op, "cache rows"), checked_u32(copy.row0, op, "offset")};
    checked_u32(copy.rows * copy.dim, op, "elements per head");
    checked_u32(copy.batch * copy.heads, op, "batch x heads");
    // the source's strides, as place() recorded them in copy.strides
    checked_strides(inputs[copy.input], op, copy.input == 0 ? "cache" : "rows", args.strides);
    const auto plan = gm::plan_rows_copy(static_cast<uint32_t>(copy.element_bytes), args);
    MetalKernel(stream(), plan.kernel)
        .input(inputs[copy.input], 0)
        .output(out, 1)
        .bytes(plan.args, 2)
        .dispatch(plan.grid);
  }
}

}  // namespace mlx_ggml_ext
