"""A GGUF file's metadata as the `ModelArgs` of the matching mlx-lm model class.

Keys are read as llama.cpp writes them (`{arch}.embedding_length`, `{arch}.rope.freq_base`, ...). Where a
file lacks a value, llama.cpp's own default is used and named in `LLAMA_CPP_DEFAULTS` (docs/models.md lists
them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss")

# mlx-lm's module (mlx_lm.models.<name>) for each architecture.
MLX_LM_MODULES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
                  "gemma3": "gemma3_text", "phi3": "phi3", "gpt-oss": "gpt_oss"}

# Values llama.cpp supplies itself when a GGUF does not carry them (src/llama-model.cpp's hparams loading).
LLAMA_CPP_DEFAULTS = {
    "gemma3": {
        # Sliding (local) layers rotate with base 10000; only the global layers use {arch}.rope.freq_base.
        "rope_local_base_freq": 10_000.0,
        # Every 6th layer (index 5, 11, ...) attends globally, the other five through the sliding window.
        "sliding_window_pattern": 6,
    },
    "gpt-oss": {
        # No attention.sliding_window_pattern: every 2nd layer (index 1, 3, ...) attends globally, the others
        # through the sliding window.
        "sliding_window_pattern": 2,
        # llama.cpp's YaRN ramp for gpt-oss: it does not read rope.scaling.yarn_beta_fast/slow for this
        # architecture, so these are always the values.
        "yarn_beta_fast": 32.0,
        "yarn_beta_slow": 1.0,
    },
    # No rope.freq_base in the file: llama.cpp's default base.
    "rope_freq_base": 10_000.0,
    # No rms epsilon in the file.
    "rms_norm_eps": 1e-5,
}


class UnsupportedArchitecture(NotImplementedError):
    pass


@dataclass
class GGUFModelConfig:
    """What load() needs besides the mlx-lm ModelArgs."""

    architecture: str
    args: dict  # keyword arguments of the mlx-lm ModelArgs
    rope_traditional: bool  # True: ggml's NORMAL rope (adjacent pairs), False: NEOX (halves)
    head_dim: int
    rope_dims: int
    final_logit_softcapping: Optional[float] = None
    tied_output: bool = True
    notes: list = field(default_factory=list)  # which values came from llama.cpp's defaults


def _scalar_per_layer(value: Any, what: str) -> int:
    """A count stored as one int, or as an array per layer (some converters): equal entries only."""
    if isinstance(value, np.ndarray):
        values = set(int(v) for v in value.reshape(-1))
        if len(values) != 1:
            raise NotImplementedError(f"{what} differs between layers ({sorted(values)}); not supported")
        return values.pop()
    return int(value)


def architecture_of(metadata: Mapping[str, Any]) -> str:
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("the GGUF file has no general.architecture string")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(f"GGUF architecture {arch!r} is not supported; supported: "
                                      f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def _rope_scaling(meta, arch: str, context: int) -> Optional[dict]:
    """`{arch}.rope.scaling.*` as mlx-lm's rope_scaling dict (None: no scaling)."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or factor in (None, 0.0) or factor == 1.0 and kind != "yarn":
        return None  # no factor (or 0): llama.cpp scales nothing
    original = int(meta.get(f"{arch}.rope.scaling.original_context_length", context))
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original}
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if f"{arch}.rope.scaling.{key}" in meta:
                scaling[name] = float(meta[f"{arch}.rope.scaling.{key}"])
        return scaling
    raise NotImplementedError(f"rope scaling type {kind!r} ({arch}.rope.scaling.type) is not supported; "
                              f"supported: linear, yarn, and llama3's rope_freqs tensor")


def _mixture_of_experts(args: dict, get, tensor_shapes, n_layers: int, arch: str) -> None:
    """The expert counts of a mixture-of-experts file ({arch}.expert_count, expert_used_count) into `args`, under
    the names of mlx-lm's qwen3_moe (num_experts) and mixtral (num_local_experts). llama.cpp's MoE feed-forward, as
    mlx-lm's: softmax over the router's logits, the top expert_used_count, their weights normalized to sum 1."""
    experts, used = int(get("expert_count")), int(get("expert_used_count"))
    if not 0 < used <= experts:
        raise ValueError(f"{arch}: expert_used_count {used} must be in [1, expert_count = {experts}]")
    if any(f"blk.{i}.ffn_gate_exps.weight" not in tensor_shapes and f"blk.{i}.ffn_gate_inp.weight" in tensor_shapes
           for i in range(n_layers)):
        raise NotImplementedError(f"{arch}: experts stored one tensor each (blk.N.ffn_gate.E.weight, older "
                                  "converters) are not supported; reconvert to ffn_{gate,up,down}_exps")
    args.update(num_experts=experts, num_local_experts=experts, num_experts_per_tok=used)


def _sliding_layers(get, n_layers: int, arch: str, notes: list) -> list:
    """Which layers attend through the sliding window: `{arch}.attention.sliding_window_pattern` as one flag
    per layer, or as a period n (layer i slides unless i % n == n - 1, llama.cpp's reading), by default
    llama.cpp's period for the architecture."""
    pattern = get("attention.sliding_window_pattern", None, required=False)
    if pattern is None:
        pattern = LLAMA_CPP_DEFAULTS[arch]["sliding_window_pattern"]
        notes.append(f"sliding-window pattern {pattern} (llama.cpp's default for {arch})")
    if isinstance(pattern, (list, tuple, np.ndarray)):
        flags = [bool(v) for v in np.asarray(pattern).reshape(-1)]
        if len(flags) != n_layers:
            raise ValueError(f"{arch}.attention.sliding_window_pattern has {len(flags)} flags for {n_layers} layers")
        return flags
    period = int(pattern)
    return [period == 0 or i % period < period - 1 for i in range(n_layers)]


def _gpt_oss(args: dict, get, meta, tensor_shapes, n_layers: int, head_dim: int, notes: list) -> None:
    """gpt-oss's values into `args` (mlx-lm's gpt_oss ModelArgs): experts with their own feed-forward size, the
    sliding window and which layers use it, and YaRN as llama.cpp computes it for this architecture."""
    arch = "gpt-oss"
    _mixture_of_experts(args, get, tensor_shapes, n_layers, arch)
    window = get("attention.sliding_window", None, required=False)
    if window is None:
        raise ValueError("gpt-oss: the GGUF file lacks gpt-oss.attention.sliding_window")
    sliding = _sliding_layers(get, n_layers, arch, notes)
    if all(sliding) or not any(sliding):
        # mlx-lm's gpt_oss builds one mask of each kind from the first layer of each kind
        raise NotImplementedError(f"gpt-oss: {'every' if all(sliding) else 'no'} layer slides; mlx-lm's gpt_oss "
                                  "needs both sliding and full-attention layers")
    base = float(args["rope_theta"])
    base_swa = get("rope.freq_base_swa", None, required=False)
    if base_swa is not None and float(base_swa) != base:
        raise NotImplementedError(f"gpt-oss: a sliding-layer rope base ({float(base_swa):g}) other than the "
                                  f"global one ({base:g}) is not supported")
    attn_factor = meta.get(f"{arch}.rope.scaling.attn_factor")
    if attn_factor is not None and float(attn_factor) != 1.0:
        raise NotImplementedError(f"gpt-oss: rope.scaling.attn_factor {float(attn_factor):g} is not supported")
    scaling = args["rope_scaling"]
    if scaling is not None and scaling["rope_type"] == "yarn":
        # llama.cpp's YaRN: angles mixed between pos/period and pos/(factor period) by a ramp over the pairs
        # between the correction dims of beta_fast and beta_slow, and q and k (so cos and sin) scaled by
        # 1 + 0.1 ln(factor); mlx-lm's YarnRoPE with mscale 1 and mscale_all_dim 0 computes the same.
        defaults = LLAMA_CPP_DEFAULTS[arch]
        scaling.update(beta_fast=defaults["yarn_beta_fast"], beta_slow=defaults["yarn_beta_slow"],
                       mscale=1.0, mscale_all_dim=0.0)
    elif scaling is not None:
        raise NotImplementedError(f"gpt-oss: rope scaling {scaling['rope_type']!r} is not supported (only yarn)")
    if "output.weight" not in tensor_shapes:
        raise ValueError("gpt-oss: the GGUF file lacks output.weight (llama.cpp requires it for gpt-oss)")
    args.update(intermediate_size=int(get("expert_feed_forward_length")), head_dim=head_dim,
                sliding_window=int(window),
                layer_types=["sliding_attention" if s else "full_attention" for s in sliding])


def model_config(metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple]) -> GGUFModelConfig:
    """The config of a GGUF file from its metadata and tensor shapes (MLX order)."""
    meta = metadata
    arch = architecture_of(meta)

    def get(key, default=None, required=True):
        full = f"{arch}.{key}"
        if full in meta:
            return meta[full]
        if required and default is None:
            raise ValueError(f"the GGUF file lacks {full}, which a {arch} model needs")
        return default

    notes = []
    hidden = int(get("embedding_length"))
    n_layers = int(get("block_count"))
    n_heads = _scalar_per_layer(get("attention.head_count"), f"{arch}.attention.head_count")
    n_kv = _scalar_per_layer(get("attention.head_count_kv", n_heads), f"{arch}.attention.head_count_kv")
    head_dim = int(get("attention.key_length", hidden // n_heads))
    value_dim = int(get("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise NotImplementedError(f"{arch}: value head size {value_dim} != key head size {head_dim}")
    if "token_embd.weight" not in tensor_shapes:
        raise ValueError("the GGUF file has no token_embd.weight tensor")
    vocab = int(tensor_shapes["token_embd.weight"][0])
    # gpt-oss's feed-forward is experts only (expert_feed_forward_length); llama.cpp does not need this key.
    ffn = _scalar_per_layer(get("feed_forward_length", 0 if arch == "gpt-oss" else None),
                            f"{arch}.feed_forward_length")
    context = int(get("context_length", 4096, required=False))
    eps = get("attention.layer_norm_rms_epsilon", None, required=False)
    if eps is None:
        eps = LLAMA_CPP_DEFAULTS["rms_norm_eps"]
        notes.append(f"rms epsilon {eps} (llama.cpp's default)")
    base = get("rope.freq_base", None, required=False)
    if base is None:
        base = LLAMA_CPP_DEFAULTS["rope_freq_base"]
        notes.append(f"rope base {base} (llama.cpp's default)")
    rope_dims = int(get("rope.dimension_count", head_dim, required=False))
    tied = "output.weight" not in tensor_shapes
    scaling = _rope_scaling(meta, arch, context)
    if get("attn_logit_softcapping", None, required=False):
        raise NotImplementedError(f"{arch}: attention logit soft-capping is not supported")
    softcap = get("final_logit_softcapping", None, required=False)

    args = dict(model_type=MLX_LM_MODULES[arch], hidden_size=hidden, num_hidden_layers=n_layers,
                intermediate_size=ffn, num_attention_heads=n_heads, num_key_value_heads=n_kv,
                rms_norm_eps=float(eps), vocab_size=vocab, rope_theta=float(base),
                max_position_embeddings=context, rope_scaling=scaling, tie_word_embeddings=tied)
    traditional = arch == "llama"  # llama.cpp permutes llama's Q/K rows for ggml's NORMAL (adjacent) rope
    if rope_dims != head_dim and arch != "phi3":
        raise NotImplementedError(f"{arch}: partial rotary embedding ({rope_dims} of {head_dim} dims)")

    if arch == "llama" and "blk.0.ffn_gate_inp.weight" in tensor_shapes:
        _mixture_of_experts(args, get, tensor_shapes, n_layers, arch)  # Mixtral: llama with experts
        if head_dim != hidden // n_heads:
            raise NotImplementedError(f"llama with experts: head size {head_dim} != hidden / heads "
                                      f"({hidden // n_heads}), which mlx-lm's mixtral assumes")
        args.update(model_type="mixtral", rope_traditional=True)
    elif arch == "llama":
        args.update(head_dim=head_dim, rope_traditional=True, attention_bias="blk.0.attn_q.bias" in tensor_shapes,
                    mlp_bias="blk.0.ffn_up.bias" in tensor_shapes)
    elif arch == "qwen2":
        if head_dim != hidden // n_heads:
            raise NotImplementedError(f"qwen2: head size {head_dim} != hidden / heads ({hidden // n_heads})")
    elif arch == "qwen3":
        args.update(head_dim=head_dim)
    elif arch == "qwen3moe":
        _mixture_of_experts(args, get, tensor_shapes, n_layers, arch)
        args.update(head_dim=head_dim, moe_intermediate_size=int(get("expert_feed_forward_length")),
                    decoder_sparse_step=1, norm_topk_prob=True,
                    mlp_only_layers=[i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensor_shapes])
    elif arch == "phi3":
        if head_dim != hidden // n_heads:
            raise NotImplementedError(f"phi3: head size {head_dim} != hidden / heads ({hidden // n_heads})")
        args.update(partial_rotary_factor=rope_dims / head_dim,
                    original_max_position_embeddings=int(get("rope.scaling.original_context_length", context,
                                                             required=False)))
        if "rope_factors_long.weight" in tensor_shapes or "rope_factors_short.weight" in tensor_shapes:
            raise NotImplementedError("phi3: LongRoPE factors (rope_factors_long/short) are not supported")
        if scaling is not None:
            raise NotImplementedError(f"phi3: rope scaling {scaling['rope_type']!r} is not supported")
        args["rope_scaling"] = None
    elif arch == "gemma3":
        defaults = LLAMA_CPP_DEFAULTS["gemma3"]
        window = get("attention.sliding_window", None, required=False)
        if window is None:
            raise ValueError("gemma3: the GGUF file lacks gemma3.attention.sliding_window")
        # llama.cpp scales attention by 1/sqrt(head size), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads).
        pre_attn = hidden / n_heads if n_layers == 62 else head_dim
        args.update(head_dim=head_dim, sliding_window=int(window), query_pre_attn_scalar=float(pre_attn),
                    rope_local_base_freq=defaults["rope_local_base_freq"],
                    sliding_window_pattern=defaults["sliding_window_pattern"])
        args.pop("tie_word_embeddings")
        notes.append(f"local rope base {defaults['rope_local_base_freq']:g} and a sliding-window pattern of "
                     f"{defaults['sliding_window_pattern']} (llama.cpp's values for Gemma 3)")
    elif arch == "gpt-oss":
        _gpt_oss(args, get, meta, tensor_shapes, n_layers, head_dim, notes)
    return GGUFModelConfig(arch, args, traditional, head_dim, rope_dims,
                           float(softcap) if softcap else None, tied, notes)


__all__ = ["SUPPORTED_ARCHITECTURES", "LLAMA_CPP_DEFAULTS", "GGUFModelConfig", "model_config", "architecture_of",
           "UnsupportedArchitecture"]
