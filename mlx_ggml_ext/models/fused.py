"""The package's fused CPU ops inside mlx-lm's model classes: attention, the gated feed-forward and RoPE.

On the CPU, MLX's own attention (mx.fast.scaled_dot_product_attention falls back to single-threaded matmuls there)
and the feed-forward's activation (several single-threaded elementwise passes) took most of a prefill's time;
`ops.attention` and `ops.glu` do the same math in one threaded SIMD kernel each. ops.glu has CUDA and Metal kernels
too; on a GPU the model keeps MLX's attention (mx.fast.scaled_dot_product_attention, tensor-core kernels;
ops.attention's CUDA kernel is not used by the models yet, and it has no Metal kernel).

- The feed-forward: each layer's `mlp` is replaced by a `GatedMLP` holding the same projection layers (gate and up
  stacked into one product where they share a block type: models/projections.py, as are q/k/v); a mixture of
  experts' `switch_mlp` by a `GGMLSwitchGLU` over its expert layers (gate and up experts stacked the same way,
  nn.stack_experts: one mul_mat_id for both).
- gpt-oss's experts become a `GGMLSwitchGLU` of kind "swiglu_oai" (its clamped SwiGLU, with the alpha and limit
  of mlx-lm's SwigluOAI; the experts' biases are added by GGMLSwitchLinear before the activation); its attention
  sinks go to ops.attention's `sinks=` on the CPU.
- Residual adds: each fused with the norm that reads the sum (models/residual.py), two ops per layer fewer.
- Attention: mlx-lm's attention modules call the `scaled_dot_product_attention` of their own module. That name is
  pointed at `_dispatching_attention`, which takes the package's kernel only while one of *our* models is being
  called (a thread-local flag set by `FusedOpsModel.__call__`) and otherwise is exactly mlx-lm's function, so
  other mlx-lm models in the same process are not affected. The llama-style attention modules take a call of
  their own where q, k and v come from one product: split into heads and rotated by ops.rope_qkv
  (models/qkv_attention.py).
"""

from __future__ import annotations

import importlib
import os
import threading

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as _mlx_lm_base

from .. import _ext, ops
from ..nn import GGMLSwitchGLU
from .projections import stack_attention_projections, stack_linears, stackable
from .qkv_attention import use_rope_qkv
from .residual import fuse_residual_norms
from .rope import FactorRoPE, GGMLRoPE, sharing_positions

_mlx_lm_attention = _mlx_lm_base.scaled_dot_product_attention
_active = threading.local()


def _on_cpu() -> bool:
    return mx.default_device() == mx.cpu


def _dispatching_attention(queries, keys, values, cache, scale: float, mask, sinks=None):
    if getattr(_active, "on", False) and _on_cpu() and not hasattr(cache, "bits"):
        return ops.attention(queries, keys, values, mask, scale=scale, sinks=sinks)
    return _mlx_lm_attention(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), or down(glu(gate_up(x))) where gate and up are one fused matrix (phi3)."""

    def __init__(self, mlp: nn.Module, kind: str, stack: bool = True):
        super().__init__()
        self.kind = kind
        self.down_proj = mlp.down_proj
        if "gate_up_proj" in mlp:
            self.gate_up_proj = mlp.gate_up_proj
        elif stack and stackable([mlp.gate_proj, mlp.up_proj]):  # one product in ggml's fused layout (models/projections.py)
            self.gate_up_proj = stack_linears([mlp.gate_proj, mlp.up_proj])
        else:
            self.gate_proj, self.up_proj = mlp.gate_proj, mlp.up_proj

    def __call__(self, x: mx.array) -> mx.array:
        # Submodules read as dict items: nn.Module's attribute fallback costs ~1-2 us a lookup per token.
        gate_up = self.get("gate_up_proj")
        if gate_up is not None:  # the halves as they are: ops.glu's fused layout
            return self["down_proj"](_ext.glu(gate_up(x), None, self.kind))
        return self["down_proj"](_ext.glu(self["gate_proj"](x), self["up_proj"](x), self.kind))


# ggml's activation of each architecture's feed-forward (Gemma: GELU with the tanh approximation).
GLU_KIND = {"llama": "swiglu", "qwen2": "swiglu", "qwen3": "swiglu", "qwen3moe": "swiglu", "phi3": "swiglu",
            "gemma3": "geglu"}


def use_fused_ops(model: nn.Module, architecture: str, mlx_lm_module: str, stack_projections: bool = True) -> None:
    """Swaps each layer's feed-forward for a GatedMLP and MLX's plain rotary embedding for GGMLRoPE, and routes
    the architecture's attention through `_dispatching_attention` (see the module docstring)."""
    for layer in model.layers:
        moe = layer.get("block_sparse_moe") or layer.get("mlp")
        if moe is not None and "switch_mlp" in moe:  # experts: one GGMLSwitchGLU (unsorted tokens, ops.glu)
            s = moe.switch_mlp
            moe.switch_mlp = GGMLSwitchGLU(s.gate_proj, s.up_proj, s.down_proj, GLU_KIND[architecture],
                                           stack=stack_projections)
        elif architecture == "gpt-oss":  # mlx-lm's SwitchGLU with its SwigluOAI activation
            e = layer.mlp.experts
            layer.mlp.experts = GGMLSwitchGLU(e.gate_proj, e.up_proj, e.down_proj, "swiglu_oai",
                                              alpha=e.activation._alpha, limit=e.activation._limit,
                                              stack=stack_projections)
        else:
            layer.mlp = GatedMLP(layer.mlp, GLU_KIND[architecture], stack_projections)
        if stack_projections:
            stack_attention_projections(layer.self_attn)
        # Not nn.RoPE's subclasses with scalings of their own; a FactorRoPE (llama3's rope_freqs) takes its factors.
        if type(getattr(layer.self_attn, "rope", None)) in (nn.RoPE, FactorRoPE):
            layer.self_attn.rope = GGMLRoPE(layer.self_attn.rope)
        # q, k and v into heads and rotated by one op, the cache updated by one (models/qkv_attention.py);
        # MLX_GGML_EXT_ROPE_QKV=0 keeps mlx-lm's call, MLX_GGML_EXT_KV_CACHE=0 its cache update (for A/B runs).
        if os.environ.get("MLX_GGML_EXT_ROPE_QKV", "1") != "0":
            use_rope_qkv(layer.self_attn, _dispatching_attention, os.environ.get("MLX_GGML_EXT_KV_CACHE", "1") != "0")
    module = importlib.import_module(f"mlx_lm.models.{mlx_lm_module}")
    module.scaled_dot_product_attention = _dispatching_attention
    # Each residual add with the norm after it (models/residual.py); MLX_GGML_EXT_FUSED_RESIDUAL=0 keeps them
    # apart (for A/B runs).
    if os.environ.get("MLX_GGML_EXT_FUSED_RESIDUAL", "1") != "0":
        fuse_residual_norms(model, architecture)


def fused_ops_model(model_class):
    """The class whose calls let `_dispatching_attention` take the package's attention kernel and the layers'
    GGMLRoPEs share their positions."""
    class FusedOpsModel(model_class):
        def __call__(self, *args, **kwargs):
            previous = getattr(_active, "on", False)
            _active.on = True
            try:
                with sharing_positions():  # one positions array for every layer's rope
                    return super().__call__(*args, **kwargs)
            finally:
                _active.on = previous
    FusedOpsModel.__name__ = model_class.__name__
    return FusedOpsModel
