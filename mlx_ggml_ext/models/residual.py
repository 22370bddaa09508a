"""Each residual add of a layer fused with the norm that reads its sum (ops.add_rms_norm): two ops per layer fewer.

A decode step is a chain of small ops, and on both the CPU and CUDA each op costs host time of its own in MLX,
whatever its size; per layer mlx-lm runs, around attention and the feed-forward,

    h = x + attn(input_norm(x));  out = h + mlp(post_norm(h))       (llama and Mixtral, qwen2/3, qwen3moe, phi3)
    h = x + post_attn_norm(attn(input_norm(x)));  out = h + post_ff_norm(mlp(pre_ff_norm(h)))   (gemma3)

Each sum is read by a norm right away: post_norm (pre_ff_norm) within the layer, and the next layer's input_norm
(after the last layer, the model's final norm) across layers. The layers' calls below do each sum and its norm as
one op. The second sum's norm belongs to the next layer: the layer computes it with the next norm's weight and
leaves it pending; the next layer (or the final norm, `PendingNorm`) takes it when its input is that very sum
(the same array object, which mlx-lm's layer loop passes on unchanged), and otherwise norms its input itself.
The numbers are those of the unfused ops (the sum is rounded as an add rounds it, then normed).
"""

from __future__ import annotations

import threading

import mlx.core as mx
import mlx.nn as nn

from .. import _ext
from ..nn import GGMLRMSNorm

_pending = threading.local()  # (norm, its input, its output) of the latest fused sum


def _norm_of(norm: GGMLRMSNorm, x: mx.array) -> mx.array:
    pending = getattr(_pending, "value", None)
    if pending is not None and pending[0] is norm and pending[1] is x:
        _pending.value = None
        return pending[2]
    return norm(x)


def _sum_for_next(h: mx.array, r: mx.array, layer: nn.Module) -> mx.array:
    norm = layer._next_norm
    out, normed = _ext.add_rms_norm(h, r, norm["weight"], norm.eps)
    _pending.value = (norm, out, normed)
    return out


def _pre_norm_call(self, x: mx.array, mask=None, cache=None) -> mx.array:
    r = self["self_attn"](_norm_of(self["input_layernorm"], x), mask, cache)
    post = self["post_attention_layernorm"]
    h, normed = _ext.add_rms_norm(x, r, post["weight"], post.eps)
    return _sum_for_next(h, self[self._feed_forward](normed), self)


def _sandwich_call(self, x: mx.array, mask=None, cache=None) -> mx.array:
    if x.dtype == mx.float16:  # mlx-lm clips float16 sums to the finite range: its own call does that
        return super(type(self), self).__call__(x, mask, cache)
    r = self["self_attn"](_norm_of(self["input_layernorm"], x), mask, cache)
    pre_ff = self["pre_feedforward_layernorm"]
    h, normed = _ext.add_rms_norm(x, self["post_attention_layernorm"](r), pre_ff["weight"], pre_ff.eps)
    return _sum_for_next(h, self["post_feedforward_layernorm"](self["mlp"](normed)), self)


# The layer norms each layout needs (all GGMLRMSNorm with a weight) and its call.
LAYOUTS = {
    "pre_norm": (("input_layernorm", "post_attention_layernorm"), _pre_norm_call),
    "sandwich": (("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"), _sandwich_call),
}
LAYOUT_OF = {"llama": "pre_norm", "qwen2": "pre_norm", "qwen3": "pre_norm", "qwen3moe": "pre_norm",
             "phi3": "pre_norm", "gemma3": "sandwich"}


class PendingNorm(GGMLRMSNorm):
    """The model's final norm: takes the last layer's fused norm of its input when there is one."""

    def __call__(self, x: mx.array) -> mx.array:
        return _norm_of(self, x)


_fused_classes: dict = {}


def _fused_class(layer_class, call, feed_forward: str):
    key = (layer_class, call, feed_forward)
    if key not in _fused_classes:
        _fused_classes[key] = type(layer_class.__name__, (layer_class,),
                                   {"__call__": call, "_feed_forward": feed_forward})
    return _fused_classes[key]


def _is_weighted_norm(module) -> bool:
    return isinstance(module, GGMLRMSNorm) and "weight" in module


def fuse_residual_norms(model: nn.Module, architecture: str) -> bool:
    """Gives each layer of `model` the fused call of its layout, and the final norm the pending check. Leaves the
    model as it is (returns False) for another architecture or where a norm is not a weighted GGMLRMSNorm."""
    layout = LAYOUT_OF.get(architecture)
    inner = getattr(model, "model", None)
    if layout is None or inner is None or not _is_weighted_norm(inner.get("norm")):
        return False
    names, call = LAYOUTS[layout]
    layers = model.layers
    if not layers or not all(_is_weighted_norm(layer.get(n)) for layer in layers for n in names):
        return False
    final = PendingNorm(inner.norm.weight.shape[0], inner.norm.eps)
    final.weight = inner.norm.weight
    inner.norm = final
    for i, layer in enumerate(layers):
        feed_forward = "block_sparse_moe" if "block_sparse_moe" in layer else "mlp"  # mlx-lm's Mixtral: the former
        layer.__class__ = _fused_class(type(layer), call, feed_forward)
        # A plain attribute (not a child module: the norm belongs to the next layer's parameters).
        object.__setattr__(layer, "_next_norm", layers[i + 1].input_layernorm if i + 1 < len(layers) else final)
    return True
