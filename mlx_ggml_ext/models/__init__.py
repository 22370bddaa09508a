"""GGUF models run in MLX straight off the file.

    from mlx_ggml_ext import models
    model, tokenizer = models.load("model.gguf")

`model` is an mlx-lm model (mlx-lm's own class for the architecture, with its matrices replaced by
GGMLLinear layers over the file's ggml blocks and its token table by a GGMLEmbedding), so mlx_lm.generate,
stream_generate, generate_step, prompt caches and LoRA work with it. The file is memory-mapped: loading reads
the metadata and the small float tensors (norms, biases) and nothing else. See docs/models.md."""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Callable, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .. import gguf as _gguf
from ..types import GGMLType
from .config import (LLAMA_CPP_DEFAULTS, SUPPORTED_ARCHITECTURES, GGUFModelConfig, UnsupportedArchitecture,
                     architecture_of, model_config)
from .fused import fused_ops_model, use_fused_ops
from .rope import FactorRoPE
from .weights import attach_weights, float_vector

Progress = Optional[Callable[[int, int], None]]


def _mlx_lm_classes(config: GGUFModelConfig):
    if config.architecture == "gemma3":
        from . import gemma3
        return gemma3.Model, importlib.import_module("mlx_lm.models.gemma3_text").ModelArgs
    module = importlib.import_module(f"mlx_lm.models.{config.args['model_type']}")
    return module.Model, module.ModelArgs


def _with_softcap(model_class):
    """The class whose logits are soft-capped as llama.cpp does (cap * tanh(logits / cap))."""
    class SoftcappedModel(model_class):
        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            cap = self.final_logit_softcapping
            return mx.tanh(out / cap) * cap
    SoftcappedModel.__name__ = model_class.__name__
    return SoftcappedModel


# CPU kernel variants (mlx_ggml_ext.cpu_isa()) and the types whose packed rows (ops.pack_rows) have a SIMD kernel
# there faster than the plain one (elsewhere the packed product is portable C++, slower than the plain kernels; AVX2's
# Q6_K_R8 kernel is no faster than the plain AVX2 one, 0.85-1.06x, so AVX2 keeps Q6_K's blocks; its Q4_K_R8 kernel
# is 1.35-1.45x at one row of x, 0.95x at 16-512: decode 1.15x, prefill 0.96-0.97x end to end, kept for decode).
# `load` packs by default on PACKED_ROWS_ISAS only (the baseline and NEON variants have no packed kernels).
PACKED_SIMD_TYPES = {"avx512": (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q4_0, GGMLType.IQ4_NL, GGMLType.Q5_0,
                                GGMLType.Q8_0),
                     "avx2": (GGMLType.Q4_K, GGMLType.Q4_0, GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q8_0)}
PACKED_ROWS_ISAS = ("avx512", "avx2")


def packs_rows_by_default() -> bool:
    """Whether `load` packs rows for the CPU when not told: MLX_GGML_EXT_PACK_ROWS=1/0 if set, else when the
    default device is the CPU and its kernel variant has the packed SIMD kernel."""
    env = os.environ.get("MLX_GGML_EXT_PACK_ROWS", "")
    if env not in ("", "0", "1"):
        raise ValueError(f"MLX_GGML_EXT_PACK_ROWS must be 0 or 1, got {env!r}")
    if env:
        return env == "1"
    from .. import cpu_isa
    return mx.default_device() == mx.cpu and cpu_isa() in PACKED_ROWS_ISAS


# Memory left to the rest of the process (KV cache, activations, the file's unpacked tensors) when `load` decides
# by itself whether the packed copies fit.
PACKING_RESERVE_BYTES = 1 << 30


def available_memory() -> Optional[int]:
    """Bytes the system can still give this process without swapping: Linux's MemAvailable (free memory and
    reclaimable page cache, the model file's clean pages included), else the free pages os.sysconf reports, None
    where neither is known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def pack_linear_rows(model: nn.Module, tied_head: bool = False, memory_budget: Optional[int] = None) -> int:
    """Packs the rows of every GGMLLinear and GGMLSwitchLinear (experts) whose type has a SIMD kernel for packed rows
    on this CPU (PACKED_SIMD_TYPES; GGMLLinear.pack_rows), and with `tied_head` a copy of the token table for the
    head (GGMLEmbedding.pack_rows); returns how many matrices (expert sets) it packed. The packed rows are copies
    in the process's own memory (about the packed matrices' size in the file); with `memory_budget` (bytes), a
    model whose copies would need more packs nothing and warns (RuntimeWarning) instead."""
    from .. import cpu_isa
    from ..nn import GGMLEmbedding, GGMLLinear, GGMLSwitchLinear
    types = PACKED_SIMD_TYPES.get(cpu_isa(), ())
    modules = [m for m in model.modules()
               if (isinstance(m, (GGMLLinear, GGMLSwitchLinear)) or (tied_head and isinstance(m, GGMLEmbedding)))
               and m.ggml_type in types]
    needed = sum(module.pack_rows_bytes() for module in modules)
    if memory_budget is not None and needed > memory_budget:
        warnings.warn(f"mlx_ggml_ext.models: rows not packed for the CPU: the packed copies need {needed / 2**30:.1f} "
                      f"GiB and {max(memory_budget, 0) / 2**30:.1f} GiB can be spared (the products read the file's "
                      "blocks instead, slower; pack_rows=True or MLX_GGML_EXT_PACK_ROWS=1 packs anyway)",
                      RuntimeWarning, stacklevel=3)
        return 0
    return sum(module.pack_rows() for module in modules)


def build_model(gguf_file: _gguf.GGUFFile, progress: Progress = None, fused_ops: bool = True,
                precise_head: bool = True, stack_projections: bool = True,
                pack_rows: Optional[bool] = None) -> nn.Module:
    """The mlx-lm model of an already loaded GGUFFile (its tensors stay in the file's mapping). With `fused_ops`,
    attention and the gated feed-forward run on the package's kernels where they have one (models/fused.py),
    and with `stack_projections` too, a layer's q/k/v and gate/up of one block type are one product each
    (models/projections.py: fewer products per token, their weights copied once at load).
    With `precise_head`, the output head (tied or not) takes x with its rounding residual (`precise_x`).
    With `pack_rows` (default: packs_rows_by_default()), the matrices (and expert sets) whose type has a SIMD kernel
    for packed rows on this CPU (PACKED_SIMD_TYPES) are copied into rows packed for the CPU (ops.pack_rows: 1.3-2x
    faster products on AVX-512, 1.1-2.4x on AVX2; such a model runs on the CPU only), a tied head's table too (a second copy: lookups
    keep the file's blocks). The copies take about the packed matrices' size of the process's own memory: by
    default a model is packed only if they fit in available_memory() less PACKING_RESERVE_BYTES (else a
    RuntimeWarning, and the products read the file's blocks)."""
    tensors = gguf_file.tensors
    config = model_config(gguf_file.metadata, {name: t.shape for name, t in tensors.items()})
    model_class, args_class = _mlx_lm_classes(config)
    if config.final_logit_softcapping is not None:
        model_class = _with_softcap(model_class)
    if fused_ops:
        model_class = fused_ops_model(model_class)
    # mlx-lm's constructors create random float weights lazily; they are replaced before anything evaluates
    # them, so they cost no memory.
    model = model_class(args_class.from_dict(config.args))
    if config.final_logit_softcapping is not None:
        model.final_logit_softcapping = config.final_logit_softcapping
    if config.architecture == "gemma3" and config.tied_output:
        model.tie_word_embeddings = True  # what mlx-lm's sanitize does for a checkpoint without lm_head
        model.pop("lm_head")
    attach_weights(model, tensors, config.architecture, progress, precise_head=precise_head)
    if "rope_freqs.weight" in tensors:
        if config.architecture != "llama":
            raise NotImplementedError(f"{config.architecture}: rope_freqs.weight is only supported for llama")
        factors = float_vector(tensors["rope_freqs.weight"], "rope_freqs.weight")
        for layer in model.layers:
            layer.self_attn.rope = FactorRoPE(config.rope_dims, config.args["rope_theta"], True, factors)
    if fused_ops:
        use_fused_ops(model, config.architecture, config.args["model_type"], stack_projections)
    if packs_rows_by_default() if pack_rows is None else pack_rows:
        # Asked for (the argument or the environment): packs whatever it costs; by default only copies that fit.
        asked = pack_rows is True or os.environ.get("MLX_GGML_EXT_PACK_ROWS") == "1"
        memory = None if asked else available_memory()
        budget = None if memory is None else memory - PACKING_RESERVE_BYTES
        pack_linear_rows(model, config.tied_output, budget)  # after stacking: the stacked products get packed
    model.gguf_config = config
    return model


def load(path: "str | os.PathLike", *, tokenizer: bool = True, progress: Progress = None, fused_ops: bool = True,
         precise_head: bool = True, stack_projections: bool = True, prefault: bool = True,
         pack_rows: Optional[bool] = None) -> Tuple[nn.Module, Optional[object]]:
    """`(model, tokenizer)` for a GGUF file: the model as above, the tokenizer an mlx-lm TokenizerWrapper
    built from the file's vocabulary (None when `tokenizer=False`). `progress(done, total)` is called as the
    model's modules receive their tensors. `precise_head` (default): the output head's products take x in two
    int8 passes on the CPU (ggml's one pass loses about 1 top-1 token in 20 to a float64 forward on Gemma 3;
    docs/models.md), at about a third more time for the head at decode. `prefault` (default): every page of the
    file is mapped at load (`GGUFFile.prefault`), as llama.cpp does, instead of faulting in on first use during
    the first tokens (0.5 s for a cached 2.8 GB file here). `pack_rows`: as in build_model (default: on when the
    default device is an AVX-512 or AVX2 CPU, MLX_GGML_EXT_PACK_ROWS=0/1 decides otherwise).

    Raises NotImplementedError for an architecture other than llama (Mixtral-style experts included), qwen2,
    qwen3, qwen3moe, gemma3, phi3, gpt-oss."""
    gguf_file = _gguf.load(path)
    architecture_of(gguf_file.metadata)  # the clear error before anything else
    model = build_model(gguf_file, progress, fused_ops, precise_head, stack_projections, pack_rows)
    if prefault:
        gguf_file.prefault()
    tok = None
    if tokenizer:
        from ..tokenizer import load_tokenizer
        tok = load_tokenizer(gguf_file)
    return model, tok


__all__ = ["load", "build_model", "pack_linear_rows", "available_memory", "packs_rows_by_default", "SUPPORTED_ARCHITECTURES", "LLAMA_CPP_DEFAULTS", "UnsupportedArchitecture"]
