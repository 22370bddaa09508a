"""GGUF tensors into an mlx-lm model: tensor names -> module paths, and the modules that take them.

Every matrix becomes a GGMLLinear over the file's blocks (whatever its type, F16/F32 included), every set of
experts (E, N, K) a GGMLSwitchLinear, the token
table a GGMLEmbedding, and every norm a `GGMLRMSNorm` whose weight is the stored vector as it is: llama.cpp's
converter has already added Gemma's +1 to its norms, so mlx-lm's Gemma norm (which adds it at run time) is
replaced rather than fed."""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..nn import GGMLEmbedding, GGMLLinear, GGMLRMSNorm, GGMLSwitchLinear
from ..types import GGMLTensor

# mlx-lm module path inside a layer -> the GGUF tensor name inside block N.
_LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",  # phi3: Q, K and V rows in one matrix
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "pre_feedforward_layernorm": "ffn_norm",  # gemma3
    "post_feedforward_layernorm": "post_ffw_norm",  # gemma3
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",  # phi3: gate rows, then up rows
    "mlp.down_proj": "ffn_down",
    # mixture of experts: the router and the experts' three (E, N, K) tensors (qwen3moe; Mixtral as llama)
    "mlp.gate": "ffn_gate_inp",
    "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps",
    "mlp.switch_mlp.down_proj": "ffn_down_exps",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
    "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
    "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
}
# Gemma 3 normalizes the attention output before the residual: its post_attention_layernorm is that norm.
_ARCH_LAYER_TENSORS = {
    "gemma3": {"post_attention_layernorm": "post_attention_norm"},
    # gpt-oss: llama.cpp names the norm before the feed-forward post_attention_norm; the router and the experts
    # (each with a bias) sit under mlx-lm's mlp.router and mlp.experts (its SwitchGLU).
    "gpt-oss": {"post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp",
                "mlp.experts.gate_proj": "ffn_gate_exps", "mlp.experts.up_proj": "ffn_up_exps",
                "mlp.experts.down_proj": "ffn_down_exps"},
}
# Float arrays that are parameters of a module rather than modules: layer attribute path -> GGUF name in block N.
# gpt-oss's attention sinks: one logit per query head that joins the softmax's denominator.
_LAYER_ARRAYS = {"self_attn.sinks": "attn_sinks.weight"}
_TOP_TENSORS = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# Tensors read elsewhere (rope frequency factors) or that llama.cpp itself ignores.
_READ_ELSEWHERE = ("rope_freqs.weight",)

_LAYER_PATH = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(path: str, architecture: str) -> Optional[str]:
    """The GGUF tensor name (without .weight/.bias) of an mlx-lm module path, or None."""
    if path in _TOP_TENSORS:
        return _TOP_TENSORS[path]
    m = _LAYER_PATH.fullmatch(path)
    if m is None:
        return None
    inner = _ARCH_LAYER_TENSORS.get(architecture, {}).get(m.group(2)) or _LAYER_TENSORS.get(m.group(2))
    return None if inner is None else f"blk.{m.group(1)}.{inner}"


def float_vector(tensor: GGMLTensor, what: str) -> mx.array:
    """A norm weight or bias as float32 (F32/F16/BF16 only: llama.cpp keeps them unquantized)."""
    if len(tensor.shape) != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tensor.shape}")
    return float_array(tensor, tensor.shape, what)


def float_array(tensor: GGMLTensor, shape: tuple, what: str) -> mx.array:
    """A float tensor (F32/F16/BF16 only: llama.cpp keeps norms, biases and sinks unquantized) of exactly
    `shape` as float32."""
    if not tensor.ggml_type.is_float:
        raise ValueError(f"{what} is {tensor.ggml_type.name}; norm weights, biases and sinks must be F32, F16 "
                         "or BF16")
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(tensor.shape)}, the model expects {tuple(shape)}")
    out = tensor.dequantize(mx.float32).reshape(shape)
    mx.eval(out)
    return out


def _attach_layer_arrays(model: nn.Module, tensors: Mapping[str, GGMLTensor], used: set) -> None:
    """Sets each layer's float parameters named in _LAYER_ARRAYS that the model has (gpt-oss's sinks)."""
    for i, layer in enumerate(getattr(model, "layers", [])):
        for attr_path, name in _LAYER_ARRAYS.items():
            owner_path, attr = attr_path.rsplit(".", 1)
            owner = layer
            for part in owner_path.split("."):
                owner = owner.get(part) if isinstance(owner, dict) else None
            if owner is None or attr not in owner:
                continue
            full = f"blk.{i}.{name}"
            if full not in tensors:
                raise ValueError(f"the GGUF file lacks {full} (for the model's layers.{i}.{attr_path})")
            owner[attr] = float_array(tensors[full], tuple(owner[attr].shape), full)
            used.add(full)


def _norm(module: nn.Module, weight: mx.array, path: str) -> GGMLRMSNorm:
    dims = module.weight.shape[-1]
    if tuple(weight.shape) != (dims,):
        raise ValueError(f"{path}: the norm has {dims} dims but its tensor has shape {tuple(weight.shape)}")
    norm = GGMLRMSNorm(dims, eps=module.eps)
    norm.weight = weight
    return norm


def _is_norm(module: nn.Module) -> bool:
    return hasattr(module, "eps") and "weight" in module and not isinstance(module, (nn.Linear, nn.Embedding))


def attach_weights(model: nn.Module, tensors: Mapping[str, GGMLTensor], architecture: str,
                   progress: Optional[Callable[[int, int], None]] = None, *, precise_head: bool = False) -> None:
    """Replaces `model`'s embedding, Linear and norm modules by ones over `tensors`; every tensor of the
    file must find its module and every module its tensor. `precise_head`: the output head (`output`, or the
    token table as a tied head) takes x with its rounding residual (GGMLLinear's precise_x)."""
    used = set(name for name in _READ_ELSEWHERE if name in tensors)
    targets = [(p, m) for p, m in model.named_modules() if gguf_name(p, architecture) is not None]
    replacements = []
    for done, (path, module) in enumerate(targets, 1):
        name = gguf_name(path, architecture)
        weight_name, bias_name = f"{name}.weight", f"{name}.bias"
        if weight_name not in tensors:
            raise ValueError(f"the GGUF file lacks {weight_name} (for the model's {path})")
        tensor = tensors[weight_name]
        used.add(weight_name)
        if isinstance(module, nn.Embedding):
            if tuple(tensor.shape) != tuple(module.weight.shape):
                raise ValueError(f"{weight_name} has shape {tensor.shape}, the embedding {tuple(module.weight.shape)}")
            replacements.append((path, GGMLEmbedding(tensor, precise_x=precise_head)))
        elif isinstance(module, nn.Linear):
            bias = None
            if bias_name in tensors:
                used.add(bias_name)
                bias = float_vector(tensors[bias_name], bias_name)
            if tuple(tensor.shape) != tuple(module.weight.shape):
                raise ValueError(f"{weight_name} has shape {tensor.shape}, the model's {path} (out, in) = "
                                 f"{tuple(module.weight.shape)}")
            if ("bias" in module) != (bias is not None):
                raise ValueError(f"{path}: the model {'expects' if 'bias' in module else 'has no'} a bias, and "
                                 f"the file {'has' if bias is not None else 'lacks'} {bias_name}")
            replacements.append((path, GGMLLinear(tensor, bias, precise_x=precise_head and name == "output")))
        elif type(module).__name__ == "SwitchLinear":  # mlx-lm's expert projections
            shape = (module.num_experts, module.output_dims, module.input_dims)
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{weight_name} has shape {tensor.shape}, the model's {path} (experts, out, in) = "
                                 f"{shape}")
            if ("bias" in module) != (bias_name in tensors):
                raise ValueError(f"{path}: the model {'expects' if 'bias' in module else 'has no'} a bias, and "
                                 f"the file {'lacks' if 'bias' in module else 'has'} {bias_name}")
            bias = None
            if bias_name in tensors:  # one bias row per expert (gpt-oss)
                used.add(bias_name)
                bias = float_array(tensors[bias_name], shape[:2], bias_name)
            # The ids come from the model's router (top-k of the experts' gate scores: in range by construction),
            # lazily: checking them would evaluate every layer's router on its own (a GPU synchronization each).
            replacements.append((path, GGMLSwitchLinear(tensor, bias, check_ids=False)))
        elif _is_norm(module):
            replacements.append((path, _norm(module, float_vector(tensor, weight_name), path)))
        else:
            raise TypeError(f"{path}: no GGUF counterpart for a {type(module).__name__}")
        if progress is not None:
            progress(done, len(targets))
    model.update_modules(tree_unflatten(replacements))
    _attach_layer_arrays(model, tensors, used)
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"{len(unused)} tensor(s) of the file have no place in the {architecture} model: "
                         f"{', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}")


__all__ = ["gguf_name", "attach_weights", "float_vector", "float_array"]
