// CUDA eval_gpu of the fused ops: GLU through kernels/cuda/glu.cu, attention through kernels/cuda/attention.cu
// (one kernel node, or two when the keys are split: the splits' partial results, then their combine).
#include "csrc/attention.h"
#include "csrc/backend/cuda/launch.h"
#include "csrc/glu.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext {

namespace kc = ggml_ext::cuda;
static_assert(Attention::kMaxCudaHeadDim == kc::kAttentionMaxHeadDim, "the graph-time check and the kernel agree");

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

void Attention::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  // q, k and v are read through their strides (a KV cache's slice in place); the mask and sinks row-contiguous.
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
  auto& enc = cuda::begin(stream(), inputs, out);
  if (out.size() == 0) return;
  kc::AttentionArgs args{};
  args.q = mx::gpu_ptr<void>(q);
  args.k = mx::gpu_ptr<void>(k);
  args.v = mx::gpu_ptr<void>(v);
  args.y = mx::gpu_ptr<void>(out);
  for (int ax = 0; ax < 4; ++ax) {
    args.q_strides[ax] = q.strides()[ax];
    args.k_strides[ax] = k.strides()[ax];
    args.v_strides[ax] = v.strides()[ax];
  }
  describe(inputs, args);
  if (const int i = mask_index(inputs); i >= 0) args.mask = mx::gpu_ptr<float>(inputs[i]);
  if (const int i = sinks_index(inputs); i >= 0) args.sinks = mx::gpu_ptr<float>(inputs[i]);
  const auto plan = kc::attention_plan(args, float_type(out.dtype()));
  if (!plan.steps[0].kernel) {
    throw std::invalid_argument(cat("[attention] no CUDA kernel for q ", shape_str(q.shape()), ", k ",
                                    shape_str(k.shape()), ", v ", shape_str(v.shape()), " (head dims up to ",
                                    kc::kAttentionMaxHeadDim, "; at most 65535 kv heads x batches and query blocks)."));
  }
  cuda::launch_plan(enc, plan, args, inputs, out);
}

}  // namespace mlx_ggml_ext
