"""gpt-oss (llama.cpp's `gpt-oss` architecture) through mlx_ggml_ext.models, against a float64 numpy forward pass.

A tiny gpt-oss GGUF is written here with the `gguf` package: 2 layers (layer 0 slides over a window of 4 tokens,
layer 1 attends to everything, llama.cpp's default pattern), 4 experts with 2 used per token, the experts in MXFP4
(gguf-py's quantizer) with a bias row per expert, attention projections with biases, attention sinks, a biased
router, YaRN rope. The reference below is written from the model's math as llama.cpp runs it (src/models/
openai-moe.cpp, the YaRN of ggml's rope, the softmax with sinks, ggml's swiglu_oai, build_moe_ffn's
"softmax_weight" gating); the weights it uses are gguf-py's decoding of the file. No real gpt-oss file is here
(the smallest is about 12 GB)."""

from __future__ import annotations

import math

import gguf
import mlx.core as mx
import numpy as np
import pytest

import model_reference as ref
from mlx_ggml_ext import models, nn as gnn
from mlx_ggml_ext.models.config import model_config
from mlx_ggml_ext.types import GGMLTensor, GGMLType
from test_models import _cached_logits, _logits, _rel_max, _use_float_products

pytest.importorskip("mlx_lm")

Q = gguf.GGMLQuantizationType
ALPHA, LIMIT = 1.702, 7.0  # llama.cpp's constants for gpt-oss's swiglu_oai
# 32 tokens: with 2 experts each that is 64 indices, where mlx-lm's SwitchGLU sorts the tokens by expert first.
TOKENS = np.random.default_rng(5).integers(0, 320, 32)


class Tiny:
    hidden, n_layers, n_heads, n_kv, head_dim = 128, 2, 4, 2, 64  # heads * head_dim != hidden, as in gpt-oss
    experts, used, expert_ffn, vocab = 4, 2, 96, 320
    eps, base, window = 1e-5, 10000.0, 4
    # YaRN with a short original context, so that positions 0..31 already fall on both sides of the ramp
    # (pairs 0..12 of 32 rotate at pos/period, pairs from 13 on mix towards pos/(8 period)).
    yarn_factor, yarn_original = 8.0, 256
    sliding = None  # None: no sliding_window_pattern key (llama.cpp's default: layer 0 slides, 1 does not)


class NoYarn(Tiny):
    yarn_factor = 1.0  # no rope scaling: the ramp, the interpolation and the magnitude all inert


class SecondSlides(Tiny):
    sliding = [False, True]  # the pattern as one flag per layer (a bool array), the other way round


def write_gpt_oss(path: str, m=Tiny, seed: int = 0, drop: tuple = ()) -> None:
    """The tiny gpt-oss GGUF (tensor names and shapes as llama.cpp's converter writes them); `drop`: tensor
    names left out."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "gpt-oss")
    a = "gpt-oss"
    for key, value in [("context_length", 4096), ("embedding_length", m.hidden), ("block_count", m.n_layers),
                       ("feed_forward_length", m.expert_ffn), ("expert_feed_forward_length", m.expert_ffn),
                       ("attention.head_count", m.n_heads), ("attention.head_count_kv", m.n_kv),
                       ("attention.key_length", m.head_dim), ("attention.value_length", m.head_dim),
                       ("rope.dimension_count", m.head_dim), ("attention.sliding_window", m.window),
                       ("expert_count", m.experts), ("expert_used_count", m.used),
                       ("rope.scaling.original_context_length", m.yarn_original)]:
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", m.eps)
    w.add_float32(f"{a}.rope.freq_base", m.base)
    if m.sliding is not None:
        w.add_array(f"{a}.attention.sliding_window_pattern", m.sliding)
    if m.yarn_factor != 1.0:  # 1: no scaling keys, plain NEOX rope
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", m.yarn_factor)

    def add(name, data, qtype=Q.F32):
        if name in drop:
            return
        if qtype == Q.F32:
            w.add_tensor(name, data.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:  # quantized row by row (3-D experts: E * rows rows), then viewed as (..., rows, bytes)
            q = gguf.quants.quantize(data.reshape(-1, data.shape[-1]).astype(np.float32), qtype)
            w.add_tensor(name, q.reshape(*data.shape[:-1], -1), raw_dtype=qtype)

    def normal(*shape, scale=1.0):
        return rng.standard_normal(shape) * scale

    add("token_embd.weight", normal(m.vocab, m.hidden), Q.Q8_0)
    q_out, kv_out = m.n_heads * m.head_dim, m.n_kv * m.head_dim
    types = [Q.Q8_0, Q.F16, Q.Q8_0, Q.F32]
    for i in range(m.n_layers):
        b = f"blk.{i}"
        add(f"{b}.attn_norm.weight", 1 + 0.1 * normal(m.hidden))
        for j, (name, rows, cols) in enumerate([("attn_q", q_out, m.hidden), ("attn_k", kv_out, m.hidden),
                                                ("attn_v", kv_out, m.hidden), ("attn_output", m.hidden, q_out)]):
            add(f"{b}.{name}.weight", normal(rows, cols, scale=1 / math.sqrt(cols)), types[(i + j) % 4])
            add(f"{b}.{name}.bias", normal(rows, scale=0.5))
        # sinks of either sign and a few units: some heads give the sink most of their weight, some little
        add(f"{b}.attn_sinks.weight", normal(m.n_heads, scale=2.0))
        add(f"{b}.post_attention_norm.weight", 1 + 0.1 * normal(m.hidden))
        add(f"{b}.ffn_gate_inp.weight", normal(m.experts, m.hidden, scale=0.3))
        add(f"{b}.ffn_gate_inp.bias", normal(m.experts, scale=0.5))
        for name, rows, cols, bias_scale in [("ffn_gate_exps", m.expert_ffn, m.hidden, 4.0),
                                             ("ffn_up_exps", m.expert_ffn, m.hidden, 4.0),
                                             ("ffn_down_exps", m.hidden, m.expert_ffn, 0.5)]:
            # gate/up biases of a few units push some activations past swiglu_oai's clamps at +-7
            add(f"{b}.{name}.weight", normal(m.experts, rows, cols, scale=2 / math.sqrt(cols)), Q.MXFP4)
            add(f"{b}.{name}.bias", normal(m.experts, rows, scale=bias_scale))
    add("output_norm.weight", 1 + 0.1 * normal(m.hidden))
    add("output.weight", normal(m.vocab, m.hidden, scale=0.25), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------------------------------ float64 reference

def yarn_rope(x, positions, base, factor, original_ctx, beta_fast=32.0, beta_slow=1.0):
    """x (T, H, D), NEOX pairs (i, i + D/2). ggml's YaRN: pair i's angle pos * base^(-2i/D) (extrapolated) and
    that angle / factor (interpolated) mixed by a ramp that is 1 below the correction dim of beta_fast and 0
    above that of beta_slow; cos and sin are multiplied by 1 + 0.1 ln(factor)."""
    D = x.shape[-1]
    half = D // 2

    def correction_dim(rotations):
        return D * math.log(original_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low = max(0, math.floor(correction_dim(beta_fast)))
    high = min(D - 1, math.ceil(correction_dim(beta_slow)))
    i = np.arange(half)
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
    extrapolated = positions[:, None] * base ** (-2.0 * i / D)
    theta = extrapolated / factor * (1 - ramp) + extrapolated * ramp
    magnitude = 1 + 0.1 * math.log(factor)
    cos, sin = (np.cos(theta) * magnitude)[:, None, :], (np.sin(theta) * magnitude)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def attention_with_sinks(q, k, v, sinks, scale, window):
    """q (T, H, D), k/v (T, KV, D): causal (within the last `window` positions when window > 0); each head's
    softmax has one more logit, its sink (not scaled), which takes weight but adds no value."""
    T, H, _ = q.shape
    k, v = np.repeat(k, H // k.shape[1], axis=1), np.repeat(v, H // v.shape[1], axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (s <= t) & ((t - s < window) if window else True)
    scores = np.where(allowed[None], scores, -np.inf)
    top = np.maximum(scores.max(-1, keepdims=True), sinks[:, None, None])
    p = np.exp(scores - top)
    p /= p.sum(-1, keepdims=True) + np.exp(sinks[:, None, None] - top)
    return np.einsum("hts,shd->thd", p, v).reshape(T, -1)


def swiglu_oai(gate, up):
    g = np.minimum(gate, LIMIT)
    return g / (1 + np.exp(-ALPHA * g)) * (np.clip(up, -LIMIT, LIMIT) + 1)


def experts_ffn(h, b, used, stats=None):
    """The router's logits (plus bias); each token's `used` largest; their softmax weighs the chosen experts'
    down_e(swiglu_oai(gate_e h + bg_e, up_e h + bu_e)) + bd_e."""
    logits = h @ b("ffn_gate_inp.weight").T + b("ffn_gate_inp.bias")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-logits[t])[:used]
        weights = np.exp(logits[t, chosen] - logits[t, chosen].max())
        weights /= weights.sum()
        for e, wt in zip(chosen, weights):
            gate = b("ffn_gate_exps.weight")[e] @ h[t] + b("ffn_gate_exps.bias")[e]
            up = b("ffn_up_exps.weight")[e] @ h[t] + b("ffn_up_exps.bias")[e]
            if stats is not None:
                stats["gate_clamped"] += int(np.sum(gate > LIMIT))
                stats["up_clamped"] += int(np.sum(np.abs(up) > LIMIT))
            out[t] += wt * (b("ffn_down_exps.weight")[e] @ swiglu_oai(gate, up) + b("ffn_down_exps.bias")[e])
    return out


def forward(W, tokens, m=Tiny, stats=None):
    tokens = np.asarray(tokens)
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    for i in range(m.n_layers):
        b = lambda name: W[f"blk.{i}.{name}"]  # noqa: E731
        h = ref.rms_norm(x, b("attn_norm.weight"), m.eps)
        q, k, v = ((h @ b(f"{n}.weight").T + b(f"{n}.bias")).reshape(T, -1, m.head_dim)
                   for n in ("attn_q", "attn_k", "attn_v"))
        q = yarn_rope(q, pos, m.base, m.yarn_factor, m.yarn_original)
        k = yarn_rope(k, pos, m.base, m.yarn_factor, m.yarn_original)
        slides = i % 2 == 0 if m.sliding is None else m.sliding[i]  # llama.cpp's default: even layers slide
        window = m.window if slides else 0
        o = attention_with_sinks(q, k, v, b("attn_sinks.weight"), 1 / math.sqrt(m.head_dim), window)
        x = x + o @ b("attn_output.weight").T + b("attn_output.bias")
        h = ref.rms_norm(x, b("post_attention_norm.weight"), m.eps)
        x = x + experts_ffn(h, b, m.used, stats)
    x = ref.rms_norm(x, W["output_norm.weight"], m.eps)
    return x @ W["output.weight"].T


# ----------------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "gpt-oss.gguf")
    write_gpt_oss(path)
    return path, ref.read_weights(path)


@pytest.fixture
def float_products(monkeypatch):
    _use_float_products(monkeypatch)


def test_reference_exercises_the_features(tiny):
    """The file is built so that what the model must get right matters: clamps hit, sinks and YaRN change the
    logits by far more than the tolerance below."""
    _, W = tiny
    stats = {"gate_clamped": 0, "up_clamped": 0}
    expected = forward(W, TOKENS, stats=stats)
    assert stats["gate_clamped"] > 0 and stats["up_clamped"] > 0, stats
    no_sinks = {n: (np.zeros_like(t) if n.endswith("attn_sinks.weight") else t) for n, t in W.items()}
    assert _rel_max(forward(no_sinks, TOKENS), expected) > 1e-2

    assert _rel_max(forward(W, TOKENS, NoYarn), expected) > 1e-2
    assert _rel_max(forward(W, TOKENS, SecondSlides), expected) > 1e-2


@pytest.mark.parametrize("m", [Tiny, NoYarn, SecondSlides], ids=["yarn", "plain-rope", "pattern-flags"])
def test_gpt_oss_math_matches_reference(m, tiny, tmp_path, float_products):
    """Every product on the dequantized float matrices: float32 against float64, ~1e-6 relative after two
    layers; a wrong formula (sinks, clamps, YaRN, window, router, a bias) is off by > 1e-2 (test above).
    Without rope scaling the model's rope is the package's (GGMLRoPE), with YaRN mlx-lm's YarnRoPE."""
    path, W = tiny
    if m is not Tiny:  # the same weights (same seed), other metadata
        path = str(tmp_path / "variant.gguf")
        write_gpt_oss(path, m)
    model, _ = models.load(path, tokenizer=False)
    # MLX's GPU float matmuls round more (test_models): 2.1e-3 measured on an H100 (2026-11-27), still well
    # below the 1e-2 a wrong formula costs (test above).
    bound = 1e-5 if mx.default_device() == mx.cpu else 5e-3
    assert _rel_max(_logits(model, TOKENS), forward(W, TOKENS, m)) < bound


def test_gpt_oss_logits_through_the_kernels(tiny):
    """The package's kernels round x to 8-bit blocks for the Q8_0 and MXFP4 products (as ggml does): ~1% of the
    largest logit, as for the other architectures in test_models."""
    path, W = tiny
    model, _ = models.load(path, tokenizer=False)
    layer = model.layers[0]
    assert isinstance(layer.mlp.experts.gate_up_proj, gnn.GGMLSwitchLinear)  # gate and up experts stacked
    assert isinstance(layer.mlp.experts, gnn.GGMLSwitchGLU) and layer.mlp.experts.kind == "swiglu_oai"  # ops.glu
    assert layer.mlp.experts.down_proj.ggml_type == gguf.GGMLQuantizationType.MXFP4
    np.testing.assert_array_equal(np.array(layer.self_attn.sinks), W["blk.0.attn_sinks.weight"].astype(np.float32))
    got, expected = _logits(model, TOKENS), forward(W, TOKENS)
    assert _rel_max(got, expected) < 4e-2
    assert np.sum((got - expected) ** 2) / np.sum(expected ** 2) < 1e-3
    assert np.mean(got.argmax(-1) == expected.argmax(-1)) >= 0.9


def test_gpt_oss_kv_cache_and_generate_step(tiny, float_products):
    """mlx-lm's caches (a rotating one of the window's size for the sliding layer): prefill then one token at a
    time gives the one-shot logits; generate_step's greedy tokens are the reference's."""
    from mlx_lm.generate import generate_step
    path, W = tiny
    model, _ = models.load(path, tokenizer=False)
    bound = 1e-5 if mx.default_device() == mx.cpu else 2e-3
    assert _rel_max(_cached_logits(model, TOKENS[:12], 5), _logits(model, TOKENS[:12])) < bound
    prompt = [int(t) for t in TOKENS[:6]]
    got = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=6,
                                            sampler=lambda lp: mx.argmax(lp, -1))]
    want = list(prompt)
    for _ in range(6):
        want.append(int(forward(W, want)[-1].argmax()))
    assert got == want[len(prompt):]


def test_switch_linear_mxfp4_with_bias_against_numpy():
    """GGMLSwitchLinear over MXFP4 experts with an (E, N) bias: y[t, j] = W[ids[t, j]] x[t] + bias[ids[t, j]],
    against gguf-py's decoding in float64 (x is rounded to Q8_0 blocks by the kernel: ~0.5% relative)."""
    rng = np.random.default_rng(3)
    E, N, K, T, used = 5, 48, 96, 7, 3
    dense = rng.standard_normal((E * N, K)).astype(np.float32)
    blocks = gguf.quants.quantize(dense, Q.MXFP4)
    w = GGMLTensor(mx.array(blocks), GGMLType.MXFP4, (E, N, K))  # (E N, bytes per row)
    decoded = gguf.quants.dequantize(blocks, Q.MXFP4).reshape(E, N, K).astype(np.float64)
    bias = rng.standard_normal((E, N))
    layer = gnn.GGMLSwitchLinear(w, mx.array(bias.astype(np.float32)))
    x = rng.standard_normal((T, 1, K))
    ids = np.stack([rng.permutation(E)[:used] for _ in range(T)])
    got = np.array(layer(mx.array(x[:, None].astype(np.float32)), mx.array(ids.astype(np.int32))))
    want = np.einsum("tjnk,tk->tjn", decoded[ids], x[:, 0]) + bias[ids]
    assert got.shape == (T, used, 1, N)
    assert _rel_max(got[:, :, 0].astype(np.float64), want) < 2e-2
    with pytest.raises(ValueError, match=r"bias must be .* shape \(5, 48\)"):
        gnn.GGMLSwitchLinear(w, mx.zeros((5, 47)))


def test_missing_expert_bias_is_named(tmp_path):
    path = str(tmp_path / "no-bias.gguf")
    write_gpt_oss(path, drop=("blk.1.ffn_up_exps.bias",))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.up_proj.*lacks blk\.1\.ffn_up_exps\.bias"):
        models.load(path, tokenizer=False)
    path = str(tmp_path / "no-sinks.gguf")
    write_gpt_oss(path, drop=("blk.0.attn_sinks.weight",))
    with pytest.raises(ValueError, match=r"lacks blk\.0\.attn_sinks\.weight"):
        models.load(path, tokenizer=False)


# --------------------------------------------------------------------------------------------- metadata only

def _meta(**extra):
    a = "gpt-oss"
    meta = {"general.architecture": a, f"{a}.embedding_length": 128, f"{a}.block_count": 4,
            f"{a}.attention.head_count": 4, f"{a}.attention.head_count_kv": 2, f"{a}.attention.key_length": 64,
            f"{a}.attention.value_length": 64, f"{a}.expert_count": 4, f"{a}.expert_used_count": 2,
            f"{a}.expert_feed_forward_length": 96, f"{a}.attention.sliding_window": 128,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.rope.freq_base": 150000.0,
            f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": 32.0, f"{a}.context_length": 131072,
            f"{a}.rope.scaling.original_context_length": 4096}
    meta.update({f"{a}.{k}": v for k, v in extra.items()})
    return {k: v for k, v in meta.items() if v is not None}


SHAPES = {"token_embd.weight": (320, 128), "output.weight": (320, 128), "blk.0.ffn_gate_inp.weight": (4, 128),
          "blk.0.ffn_gate_exps.weight": (4, 96, 128)}


def test_config_from_metadata():
    args = model_config(_meta(), SHAPES).args
    assert args["model_type"] == "gpt_oss" and args["intermediate_size"] == 96 and args["head_dim"] == 64
    assert (args["num_local_experts"], args["num_experts_per_tok"], args["sliding_window"]) == (4, 2, 128)
    assert args["layer_types"] == ["sliding_attention", "full_attention"] * 2  # llama.cpp's default period 2
    assert args["rope_scaling"] == {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
    flags = np.array([True, True, False, True])  # the pattern as one flag per layer
    assert model_config(_meta(**{"attention.sliding_window_pattern": flags}), SHAPES).args["layer_types"] == \
        ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    assert model_config(_meta(**{"rope.scaling.type": None}), SHAPES).args["rope_scaling"] is None


@pytest.mark.parametrize("extra, error, match", [
    ({"attention.sliding_window": None}, ValueError, "lacks gpt-oss.attention.sliding_window"),
    ({"attention.sliding_window_pattern": 0}, NotImplementedError, "every layer slides"),  # llama.cpp: 0 = all
    ({"attention.sliding_window_pattern": 1}, NotImplementedError, "no layer slides"),
    ({"attention.sliding_window_pattern": np.array([True, False])}, ValueError, "2 flags for 4 layers"),
    ({"rope.freq_base_swa": 10000.0}, NotImplementedError, "sliding-layer rope base"),
    ({"rope.scaling.attn_factor": 0.5}, NotImplementedError, "attn_factor"),
    ({"rope.scaling.type": "linear"}, NotImplementedError, "'linear' is not supported"),
    ({"expert_feed_forward_length": None}, ValueError, "lacks gpt-oss.expert_feed_forward_length"),
])
def test_config_errors_are_named(extra, error, match):
    with pytest.raises(error, match=match):
        model_config(_meta(**extra), SHAPES)
    with pytest.raises(ValueError, match="lacks output.weight"):
        model_config(_meta(), {k: v for k, v in SHAPES.items() if k != "output.weight"})
