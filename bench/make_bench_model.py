"""Writes a Llama-3.2-1B-shaped GGUF with random float16 weights, for end-to-end speed runs (bench_models.py).

Speed does not depend on the weights' values, so a model of the right shape stands in for a real one that this
machine cannot download. The tokenizer metadata is copied from any GGUF that has one (`--vocab-from`: a Llama 3
vocabulary keeps the real embedding size, 128256), so llama.cpp loads the file as it would a real model; without
it the file gets a SentencePiece-style vocabulary of `--vocab-size` placeholder tokens (the 256 byte tokens
first). Quantize the result with llama.cpp's own tool to get its real tensor-type mix, e.g.

    python make_bench_model.py --vocab-from ggml-vocab-llama-bpe.gguf --out /tmp/llama1b-f16.gguf
    llama-quantize /tmp/llama1b-f16.gguf /tmp/llama1b-q4_k_m.gguf Q4_K_M
    llama-quantize /tmp/llama1b-f16.gguf /tmp/llama1b-q8_0.gguf Q8_0

Shape (Llama 3.2 1B): hidden 2048, 16 layers, feed-forward 8192, 32 query heads and 8 key/value heads of 64,
RoPE base 500000, tied output head. `--layers` and `--hidden` shrink it for a quick check. Where llama.cpp's
tools are not at hand (the GPU machine), `--type q4_0|q4_k|q8_0|...` quantizes every matrix with this package's
own quantizer instead (one type for all; the norms stay float32); the types it has no quantizer for (the IQ grid
and ternary types: iq2_xxs, iq3_s, tq1_0, ...) get random blocks with small scales.

`--experts E --experts-used U` makes it a mixture of experts as llama.cpp's llama architecture has it (Mixtral's
layout): each layer's feed-forward becomes a router (ffn_gate_inp, float32) and E experts of `--ffn` rows
(ffn_gate_exps, ffn_up_exps, ffn_down_exps), U of them per token; e.g. qwen3-30b-a3b's experts are
`--experts 128 --experts-used 8 --ffn 768`. The experts are random blocks of `--type` with small scales (billions
of weights: drawing and quantizing floats would take minutes; speed does not depend on the values).
"""

import argparse

import mlx.core as mx
import numpy as np

from mlx_ggml_ext import GGMLTensor, GGMLType, gguf, ops, reference
from mlx_ggml_ext.gguf import Value, ValueType


def u32(value: int) -> Value:
    """llama.cpp reads the hyperparameter keys as UINT32 only (an INT32 is refused)."""
    return Value(value, ValueType.UINT32)


def llama3_rope_factors(base: float, dims: int, factor: float = 32.0, low: float = 1.0, high: float = 4.0,
                        original_context: int = 8192) -> np.ndarray:
    """One factor per rotated pair dividing its angle, from Llama 3's rope scaling: pairs whose wavelength is under
    original_context / high keep theirs, those over original_context / low are slowed by `factor`, and the band
    between moves smoothly from one to the other (as Llama 3's reference code states the scaling)."""
    wavelengths = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    smooth = np.clip((original_context / wavelengths - low) / (high - low), 0.0, 1.0)
    return (1.0 / ((1.0 - smooth) / factor + smooth)).astype(np.float32)


def random_f16(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16)


def placeholder_vocabulary(size: int) -> dict:
    """A SentencePiece-style ('llama') vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then placeholders."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581tok{i}" for i in range(size - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (size - 259)  # unknown, control, byte, normal
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.arange(size, dtype=np.float32) * -1.0,
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
            "tokenizer.ggml.unknown_token_id": u32(0), "tokenizer.ggml.bos_token_id": u32(1),
            "tokenizer.ggml.eos_token_id": u32(2)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-from", help="a GGUF whose tokenizer.* metadata the model takes")
    p.add_argument("--vocab-size", type=int, default=128256, help="without --vocab-from: placeholder tokens")
    p.add_argument("--type", help="quantize the matrices with this package (e.g. q4_0, q4_k, q8_0)")
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--experts", type=int, default=0, help="experts per layer (0: a dense feed-forward)")
    p.add_argument("--experts-used", type=int, default=0, help="experts per token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llama3-rope", action="store_true",
                   help="write Llama 3.2's rope scaling as llama.cpp's converter does: a rope_freqs.weight tensor "
                        "(factor 32, low/high frequency factors 1 and 4, original context 8192)")
    args = p.parse_args()
    if args.experts and not (args.type and 0 < args.experts_used <= args.experts):
        p.error("--experts needs --type and 0 < --experts-used <= --experts")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("hidden must be a multiple of heads, and heads a multiple of kv-heads")

    if args.vocab_from:
        vocab = gguf.load(args.vocab_from)
        tokenizer = {k: v for k, v in vocab.typed_metadata.items() if k.startswith("tokenizer.")}
        n_vocab = len(vocab.metadata["tokenizer.ggml.tokens"])
    else:
        tokenizer, n_vocab = placeholder_vocabulary(args.vocab_size), args.vocab_size
    head_dim = args.hidden // args.heads
    arch = "llama"
    metadata = {
        "general.architecture": arch,
        "general.name": f"random llama {args.layers}x{args.hidden}",
        f"{arch}.context_length": u32(131072),
        f"{arch}.embedding_length": u32(args.hidden),
        f"{arch}.block_count": u32(args.layers),
        f"{arch}.feed_forward_length": u32(args.ffn),
        f"{arch}.attention.head_count": u32(args.heads),
        f"{arch}.attention.head_count_kv": u32(args.kv_heads),
        f"{arch}.rope.freq_base": 500000.0,
        f"{arch}.rope.dimension_count": u32(head_dim),
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.vocab_size": u32(n_vocab),
        **tokenizer,
    }
    if args.experts:
        metadata.update({f"{arch}.expert_count": u32(args.experts),
                         f"{arch}.expert_used_count": u32(args.experts_used)})
    rng = np.random.default_rng(args.seed)
    h, kv = args.hidden, args.kv_heads * head_dim
    extra = {"rope_freqs.weight": llama3_rope_factors(500000.0, head_dim)} if args.llama3_rope else {}
    tensors = {"token_embd.weight": random_f16(rng, (n_vocab, h), 0.02),
               "output_norm.weight": np.ones(h, np.float32)}
    for i in range(args.layers):
        b = f"blk.{i}."
        tensors.update({
            b + "attn_norm.weight": np.ones(h, np.float32),
            b + "attn_q.weight": random_f16(rng, (h, h), h ** -0.5),
            b + "attn_k.weight": random_f16(rng, (kv, h), h ** -0.5),
            b + "attn_v.weight": random_f16(rng, (kv, h), h ** -0.5),
            b + "attn_output.weight": random_f16(rng, (h, h), h ** -0.5),
            b + "ffn_norm.weight": np.ones(h, np.float32),
        })
        if args.experts:
            tensors[b + "ffn_gate_inp.weight"] = rng.standard_normal((args.experts, h), dtype=np.float32)
            for name, (n, k) in (("gate", (args.ffn, h)), ("up", (args.ffn, h)), ("down", (h, args.ffn))):
                ggml_type = GGMLType.of(args.type)
                blocks = reference.random_blocks(rng, ggml_type.name, args.experts * n, k, scales=(1e-3, 2e-3))
                tensors[f"{b}ffn_{name}_exps.weight"] = GGMLTensor(mx.array(blocks), ggml_type, (args.experts, n, k))
        else:
            tensors.update({
                b + "ffn_gate.weight": random_f16(rng, (args.ffn, h), h ** -0.5),
                b + "ffn_up.weight": random_f16(rng, (args.ffn, h), h ** -0.5),
                b + "ffn_down.weight": random_f16(rng, (h, args.ffn), args.ffn ** -0.5),
            })
    if args.type:
        ggml_type = GGMLType.of(args.type)
        for name, t in tensors.items():
            if isinstance(t, np.ndarray) and t.ndim == 2 and "gate_inp" not in name:
                try:
                    blocks = ops.quantize(mx.array(t.astype(np.float32)), ggml_type, stream=mx.cpu)
                except NotImplementedError:  # no quantizer for the type: random blocks of the shape
                    blocks = mx.array(reference.random_blocks(rng, ggml_type.name, *t.shape, scales=(1e-3, 2e-3)))
                tensors[name] = GGMLTensor(blocks, ggml_type, t.shape)
                mx.eval(blocks)
    gguf.save(args.out, metadata, {**tensors, **extra})
    print(f"wrote {args.out}: {len(tensors)} tensors, vocabulary {n_vocab}")


if __name__ == "__main__":
    main()
