// CUDA eval_gpu of the fused ops: GLU through kernels/cuda/glu.cu; attention has no CUDA kernel (the op
// refuses the GPU when the graph is built, pointing to mx.fast.scaled_dot_product_attention).
#include "csrc/attention.h"
#include "csrc/backend/cuda/launch.h"
#include "csrc/glu.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext {

namespace kc = ggml_ext::cuda;

void GLU::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  // Inputs row-contiguous (the op inserted the copies); an unfused gate has out's size and may be donated.
  auto& enc = cuda::begin(stream(), inputs, out, fused_ ? nullptr : &inputs[0]);
  if (out.size() == 0) return;
  const auto l = layout(out);
  const auto& up = fused_ ? inputs[0] : inputs[1];
  kc::GluArgs args{mx::gpu_ptr<void>(inputs[0]),
                   static_cast<const char*>(mx::gpu_ptr<void>(up)) + l.up_offset * static_cast<int64_t>(out.itemsize()),
                   mx::gpu_ptr<void>(out), l.rows, l.cols, l.in_stride, params_.alpha, params_.limit};
  cuda::launch(enc, kc::glu_launch(args, float_type(out.dtype()), static_cast<int>(kind_)), args);
}

MLX_GGML_EXT_NO_GPU_KERNEL(Attention)

}  // namespace mlx_ggml_ext
