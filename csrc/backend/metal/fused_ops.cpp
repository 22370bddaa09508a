// Metal eval_gpu of the fused ops: GLU through kernels/metal/glu.metal (launch plan in launch_plans.h, which the
// emulator tests dispatch too; not run on Apple hardware). Attention has no Metal kernel: its op refuses a GPU
// stream when the graph is built, pointing to mx.fast.scaled_dot_product_attention.
#include "csrc/attention.h"
#include "csrc/backend/metal/metal_kernel.h"
#include "csrc/glu.h"

namespace mlx_ggml_ext {

namespace gm = ggml_ext_metal;

void GLU::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "glu";
  // Inputs row-contiguous (the op inserted the copies); an unfused gate has out's size and may be donated.
  if (fused_) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  } else {
    allocate_like_or_donate(inputs[0], out);
  }
  if (out.size() == 0) return;
  const auto l = layout(out);
  const auto& up = fused_ ? inputs[0] : inputs[1];
  const gm::GluArgs args{checked_u32(l.rows, op, "rows"), checked_u32(l.cols, op, "row length"),
                         checked_u32(l.in_stride, op, "row stride"), checked_u32(l.up_offset, op, "up offset"),
                         params_.alpha, params_.limit};
  const auto plan = gm::plan_glu(glu_kind_name(kind_), metal_dtype_suffix(out.dtype()), args);
  MetalKernel(stream(), plan.kernel)
      .input(inputs[0], 0)
      .input(up, 1)
      .output(out, 2)
      .bytes(plan.args, 3)
      .dispatch(plan.grid);
}

MLX_GGML_EXT_NO_GPU_KERNEL(Attention)

}  // namespace mlx_ggml_ext
