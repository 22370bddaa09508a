"""mlx-lm's attention with q, k and v split into heads and rotated by one op (ops.rope_qkv).

mlx-lm's attention modules project x into q, k and v, then reshape, transpose and rotate each: with the stacked
projections (models/projections.py) a product, a split into three, three reshapes, three transposes and two ropes,
twelve graph nodes a layer. A decode token's time is mostly per-node host time on a GPU (MLX builds and encodes
every node) and a noticeable part of it on the CPU, so the layer's call here takes the stacked product and one
rope_qkv node instead, and its KVCache's update (two slice updates and two slices) two ops.kv_cache_append nodes;
the rest is as mlx-lm writes it (its module's attention function, o_proj).

It applies where the attention is one of the classes below (their calls are that same math; Qwen 3's and Gemma 3's
with a norm of each q and k head first, which the op takes too), its rope a plain GGMLRoPE and its q and k (and v)
one product in that order: v can be a product of its own (a Q4_K_M file's v
weights often have another block type than q and k). The call checks per call that the projections are still those
(a LoRA layer put in their place afterwards takes mlx-lm's call again), and falls back to mlx-lm's call for
per-sequence cache offsets (batched caches).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, RotatingKVCache

from .. import _ext
from ..nn import GGMLRMSNorm
from .projections import ProjectionSlice
from .rope import GGMLRoPE

# The attention classes whose call is the math above, with the names of their head counts and whether they norm
# each q and k head (q_norm, k_norm) before the rotation.
ATTENTION_CLASSES = {
    ("mlx_lm.models.llama", "Attention"): ("n_heads", "n_kv_heads", False),
    ("mlx_lm.models.qwen2", "Attention"): ("n_heads", "n_kv_heads", False),
    ("mlx_lm.models.mixtral", "MixtralAttention"): ("num_heads", "num_key_value_heads", False),
    ("mlx_lm.models.phi3", "Attention"): ("n_heads", "n_kv_heads", False),
    ("mlx_lm.models.qwen3", "Attention"): ("n_heads", "n_kv_heads", True),
    ("mlx_lm.models.qwen3_moe", "Attention"): ("n_heads", "n_kv_heads", True),
    ("mlx_lm.models.gemma3_text", "Attention"): ("n_heads", "n_kv_heads", True),
}


def _product_plan(attention: nn.Module):
    """(name of the q/k(/v) product, the modules that must stay in place, with_v), or None."""
    if "qkv_proj" in attention:  # phi3: one projection in the file already
        return "qkv_proj", (attention["qkv_proj"],), True
    if "fused_proj" not in attention:
        return None
    parts = [attention.get(name) for name in ("q_proj", "k_proj", "v_proj")]
    stacked = [isinstance(p, ProjectionSlice) and p._product.linear is attention["fused_proj"] for p in parts]
    if not (stacked[0] and stacked[1] and parts[0]._index == 0 and parts[1]._index == 1):
        return None
    with_v = stacked[2] and parts[2]._index == 2
    return "fused_proj", tuple(parts if with_v else parts[:2]), with_v


def _call(self, x: mx.array, mask=None, cache=None) -> mx.array:
    offset = 0 if cache is None else cache.offset
    name, kept, with_v = self._rope_qkv_plan
    if type(offset) is not int or any(self[n] is not m for n, m in zip(self._rope_qkv_names, kept)):
        return super(type(self), self).__call__(x, mask, cache)
    B, L, _ = x.shape
    rope, (heads, kv_heads) = self["rope"], self._rope_qkv_heads
    # Arguments valid by construction (checked at install): the extension directly.
    norms = {}
    if self._rope_qkv_normed:
        q_norm, k_norm = self["q_norm"], self["k_norm"]
        norms = dict(q_norm=q_norm["weight"], k_norm=k_norm["weight"], norm_eps=q_norm.eps)
    out = _ext.rope_qkv(self[name](x), GGMLRoPE._positions(offset, L), heads, kv_heads, rope.dims, rope._mode,
                        rope.base, rope.scale, freq_factors=rope._factors, with_v=with_v, **norms)
    q, k = out[0], out[1]
    # One token: (B, 1, H, D) and (B, H, 1, D) are the same row-major array, so one reshape does a reshape and a
    # transpose (one graph node instead of two).
    if with_v:
        v = out[2]
    elif L == 1:
        v = self["v_proj"](x).reshape(B, kv_heads, 1, -1)
    else:
        v = self["v_proj"](x).reshape(B, L, kv_heads, -1).transpose(0, 2, 1, 3)
    if cache is not None:
        k, v = _update_cache(cache, k, v) if self._rope_qkv_fold_cache else cache.update_and_fetch(k, v)
    o = self._rope_qkv_attention(q, k, v, cache, self.scale, mask)
    return self["o_proj"](o.reshape(B, 1, -1) if L == 1 else o.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _update_cache(cache, k: mx.array, v: mx.array):
    """mlx-lm's KVCache.update_and_fetch with one ops.kv_cache_append node per cache (mlx-lm's builds two: a slice
    update and a slice), which writes the new rows into the cache's buffer; mlx-lm's own for every other cache class
    (quantized, batched). cache.keys then holds the rows so far (a view of a longer buffer), which mlx-lm's methods
    read as they read a full cache (keys.shape[2] >= offset). A RotatingKVCache (Gemma's sliding layers) appends the
    same way one token at a time until its window is full: until then mlx-lm writes row `offset` too (_idx ==
    offset) and returns the rows so far; at a full window keys holds exactly max_size rows, from where mlx-lm's
    rotation takes over."""
    keys, values, offset = cache.keys, cache.values, cache.offset
    if keys is None or k.dtype != keys.dtype or v.dtype != values.dtype:
        return cache.update_and_fetch(k, v)
    rotating = type(cache) is RotatingKVCache
    if rotating:
        if k.shape[2] != 1 or offset + 1 > cache.max_size or cache._idx != offset:
            return cache.update_and_fetch(k, v)
    elif type(cache) is not KVCache:
        return cache.update_and_fetch(k, v)
    cache.keys = k = _ext.kv_cache_append(keys, k, offset, cache.step)
    cache.values = v = _ext.kv_cache_append(values, v, offset, cache.step)
    cache.offset = k.shape[2]
    if rotating:
        cache._idx = cache.offset
    return k, v


_classes: dict = {}


def use_rope_qkv(attention: nn.Module, attention_fn, fold_cache: bool = True) -> bool:
    """Gives `attention` the call above where it applies (True); `attention_fn(q, k, v, cache, scale, mask)` is the
    attention of its module (models/fused.py's dispatching one); `fold_cache`: its cache updated by one
    ops.kv_cache_append node per cache where it can be (else always mlx-lm's update_and_fetch)."""
    known = ATTENTION_CLASSES.get((type(attention).__module__, type(attention).__name__))
    plan = _product_plan(attention)
    if known is None or plan is None or type(attention.get("rope")) is not GGMLRoPE:
        return False
    heads, kv_heads = (int(getattr(attention, c)) for c in known[:2])
    name, kept, with_v = plan
    total = heads + kv_heads * (2 if with_v else 1)
    width = getattr(attention[name], "output_dims", None)
    if not isinstance(width, int) or width % total or (width // total) % 2 or attention.rope.dims > width // total:
        return False
    normed = known[2]
    if normed:  # the package's norms, with weights of the head size and one epsilon
        norms = [attention.get("q_norm"), attention.get("k_norm")]
        if not all(isinstance(n, GGMLRMSNorm) and "weight" in n and tuple(n.weight.shape) == (width // total,)
                   for n in norms) or norms[0].eps != norms[1].eps:
            return False
    cls = type(attention)
    if cls not in _classes:
        _classes[cls] = type(cls.__name__, (cls,), {"__call__": _call})
    attention.__class__ = _classes[cls]
    # Plain attributes, not child modules (the projections are registered under their own names already).
    for key, value in (("_rope_qkv_plan", plan), ("_rope_qkv_heads", (heads, kv_heads)),
                       ("_rope_qkv_normed", normed),
                       ("_rope_qkv_names", ("qkv_proj",) if name == "qkv_proj" else ("q_proj", "k_proj", "v_proj")),
                       ("_rope_qkv_attention", attention_fn), ("_rope_qkv_fold_cache", fold_cache)):
        object.__setattr__(attention, key, value)
    return True
