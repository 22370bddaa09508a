// ggml's flash_attn_ext as an MLX primitive, in mlx-lm's (B, H, T, D) layout: a drop-in for
// mx.fast.scaled_dot_product_attention on the CPU (where MLX's falls back to unfused matmuls).
#pragma once
#include <optional>

#include "csrc/utils.h"

namespace mlx_ggml_ext {

// q (B, Hq, Tq, D), k (B, Hk, Tk, D), v (B, Hk, Tk, Dv), Hq a multiple of Hk; float dtypes promoted to one.
// mask: additive float (or bool: True keeps) broadcastable to (B, Hq, Tq, Tk); causal: key j visible to query i
// when j <= i + Tk - Tq. sinks: (Hq,) per-head logits that join each row's softmax denominator only.
// Output (B, Hq, Tq, Dv) in the common dtype. CPU, CUDA and Metal (the latter checked only in the project's
// Metal emulator).
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                    bool causal, float scale, float softcap, const std::optional<mx::array>& sinks = std::nullopt,
                    mx::StreamOrDevice s = {});

// Inputs: q, k, v (one dtype, any strides), optionally the mask as float32 (4-D, each axis 1 or full,
// row-contiguous), then optionally the sinks as float32, row-contiguous: (Hq,), or (B, Hq) under vmap.
class Attention : public mx::UnaryPrimitive {
 public:
  // The head dims the CUDA kernel takes (its shared-memory tiles; kernels/cuda/kernels.h's kAttentionMaxHeadDim,
  // which the CUDA glue asserts equal): checked where the graph is built, in builds without the CUDA headers too.
  static constexpr int kMaxCudaHeadDim = 512;
  // The Metal kernel's (kernels/metal/params.h's kAttentionMaxHeadDim: its three kernels by head dim, up to 128,
  // 256 and 512; the Metal glue asserts them equal).
  static constexpr int kMaxMetalHeadDim = 512;

  Attention(mx::Stream stream, float scale, float softcap, bool causal, bool has_sinks)
      : mx::UnaryPrimitive(stream), scale_(scale), softcap_(softcap), causal_(causal), has_sinks_(has_sinks) {}

  MLX_GGML_EXT_EVAL_OVERRIDES

  MLX_GGML_EXT_TRANSFORM_OVERRIDES

  const char* name() const override { return "GGMLExtAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), inputs[0].shape(1), inputs[0].shape(2), inputs[2].shape(3)}};
  }

  float scale() const { return scale_; }
  float softcap() const { return softcap_; }
  bool causal() const { return causal_; }
  bool has_sinks() const { return has_sinks_; }
  // Where the optional inputs are among `inputs` (-1: absent).
  int mask_index(const std::vector<mx::array>& inputs) const {
    return static_cast<int>(inputs.size()) > 3 + has_sinks_ ? 3 : -1;
  }
  int sinks_index(const std::vector<mx::array>& inputs) const {
    return has_sinks_ ? static_cast<int>(inputs.size()) - 1 : -1;
  }
  // The fields the backends' argument structs share: shapes, parameters, the mask's element strides (0 on
  // a broadcast axis) and the sinks' batch stride (0 for (Hq,), Hq for (B, Hq)). Pointers are each backend's.
  template <class Args>
  void describe(const std::vector<mx::array>& inputs, Args& args) const {
    const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
    args.batch = q.shape(0);
    args.q_heads = q.shape(1);
    args.kv_heads = k.shape(1);
    args.q_len = q.shape(2);
    args.kv_len = k.shape(2);
    args.head_dim = q.shape(3);
    args.v_dim = v.shape(3);
    args.scale = scale_;
    args.softcap = softcap_;
    args.causal = causal_;
    if (const int i = mask_index(inputs); i >= 0) {  // row-contiguous
      int64_t stride = 1;
      for (int ax = 3; ax >= 0; --ax) {
        args.mask_strides[ax] = inputs[i].shape(ax) == 1 ? 0 : stride;
        stride *= inputs[i].shape(ax);
      }
    }
    if (const int i = sinks_index(inputs); i >= 0) args.sinks_batch_stride = inputs[i].ndim() == 2 ? q.shape(1) : 0;
  }

 private:
  float scale_, softcap_;
  bool causal_, has_sinks_;
};

}  // namespace mlx_ggml_ext
