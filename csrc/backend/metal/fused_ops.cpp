// Metal eval_gpu of the fused ops: GLU through kernels/metal/glu.metal, attention through
// kernels/metal/attention.metal (one dispatch, or two when the keys are split: the splits' partial results,
// then their combine). Launch plans in launch_plans.h, which the emulator tests dispatch too; not run on Apple
// hardware.
#include <cstdint>
#include <limits>

#include "csrc/attention.h"
#include "csrc/backend/metal/metal_kernel.h"
#include "csrc/glu.h"

namespace mlx_ggml_ext {

namespace gm = ggml_ext_metal;

static_assert(Attention::kMaxMetalHeadDim == gm::kAttentionMaxHeadDim, "the graph-time check and the kernel agree");

namespace {

// What Attention::describe fills, before the checked narrowing to the kernel's 32-bit argument block.
struct AttentionShape {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_dim;
  float scale, softcap;
  bool causal;
  int64_t mask_strides[4] = {0, 0, 0, 0};
  int64_t sinks_batch_stride = 0;
};

}  // namespace

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

void Attention::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  constexpr const char* op = "attention";
  // q, k and v are read through their strides (a KV cache's slice in place); the mask and sinks row-contiguous.
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  AttentionShape shape{};
  describe(inputs, shape);
  gm::AttentionArgs args{};
  args.batch = checked_u32(shape.batch, op, "batch");
  args.q_heads = checked_u32(shape.q_heads, op, "query heads");
  args.kv_heads = checked_u32(shape.kv_heads, op, "kv heads");
  args.q_len = checked_u32(shape.q_len, op, "queries");
  args.kv_len = checked_u32(shape.kv_len, op, "keys");
  args.head_dim = checked_u32(shape.head_dim, op, "head dim");
  args.v_dim = checked_u32(shape.v_dim, op, "value dim");
  checked_strides(q, op, "q", args.q_strides);
  checked_strides(k, op, "k", args.k_strides);
  checked_strides(v, op, "v", args.v_strides);
  const int mask = mask_index(inputs), sinks = sinks_index(inputs);
  for (int ax = 0; ax < 4; ++ax) args.mask_strides[ax] = checked_u32(shape.mask_strides[ax], op, "mask stride");
  args.has_mask = mask >= 0;
  args.has_sinks = sinks >= 0;
  args.sinks_batch_stride = checked_u32(shape.sinks_batch_stride, op, "sinks' batch stride");
  args.scale = shape.scale;
  args.softcap = shape.softcap;
  args.causal = shape.causal;
  const auto plan = gm::plan_attention(metal_dtype_suffix(out.dtype()), args, gm::line_offset(k.data<uint8_t>()),
                                       gm::line_offset(v.data<uint8_t>()));
  if (plan.main.kernel.empty()) {
    throw std::invalid_argument(cat("[", op, "] no Metal kernel for q ", shape_str(q.shape()), ", k ",
                                    shape_str(k.shape()), ", v ", shape_str(v.shape()), " (head dims up to ",
                                    gm::kAttentionMaxHeadDim, "; grid counts within 32 bits)."));
  }
  // An absent mask or sinks is never read: q stands in for its buffer (as the partials with one split).
  MetalKernel main(stream(), plan.main.kernel);
  main.input(q, 0).input(k, 1).input(v, 2).input(mask >= 0 ? inputs[mask] : q, 3);
  main.input(sinks >= 0 ? inputs[sinks] : q, 4).output(out, 5).bytes(plan.main.args, 7);
  if (plan.combine.kernel.empty()) {
    main.input(q, 6).dispatch(plan.main.grid);
    return;
  }
  const uint64_t partial_floats = plan.partials_bytes / 4;
  if (partial_floats > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument(cat("[", op, "] q ", shape_str(q.shape()), " with ", plan.main.args.splits,
                                    " key splits needs more partial results than one buffer holds."));
  }
  mx::array partials(mx::Shape{static_cast<int32_t>(partial_floats)}, mx::float32, nullptr, {});
  partials.set_data(mx::allocator::malloc(partials.nbytes()));
  main.output(partials, 6).dispatch(plan.main.grid);
  MetalKernel(stream(), plan.combine.kernel)
      .input(sinks >= 0 ? inputs[sinks] : q, 4)
      .output(out, 5)
      .temporary_input(partials, 6)  // kept alive until the GPU is done with it
      .bytes(plan.combine.args, 7)
      .dispatch(plan.combine.grid);
}

}  // namespace mlx_ggml_ext
