"""Tiny GGUF models with random weights, and a float64 numpy forward pass of each architecture.

Independent of MLX and of the package: files are written with the `gguf` package's GGUFWriter, read back with
its GGUFReader and dequantized with `gguf.quants.dequantize`; the forward pass is written from each model's
math as llama.cpp runs it (ggml's NORMAL rope, adjacent pairs, for `llama`; NEOX, halves, for the others;
mixtures of experts routed by softmax and top-k with renormalized weights;
Gemma 3's norms as stored, its embedding scaled by sqrt(hidden), sliding-window layers with base 10000 and
every 6th layer global). Only the K-quant *bytes* come from the package's quantizer (gguf-py has no K-quant
quantizer); the reference decodes them with gguf-py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gguf
import numpy as np


@dataclass
class TinyModel:
    arch: str
    hidden: int = 256
    n_layers: int = 2
    n_heads: int = 4
    n_kv: int = 2
    head_dim: int = 64
    ffn: int = 512
    vocab: int = 320
    eps: float = 1e-5
    base: float = 10000.0
    tied: bool = False
    rope_dims: int = 0  # 0: head_dim
    window: int = 0  # gemma3's sliding window
    rope_freqs: np.ndarray = None  # llama's per-pair factors
    qkv_bias: bool = False
    qk_norm: bool = False
    extra: dict = field(default_factory=dict)
    experts: int = 0  # a mixture of experts: E experts per layer, `experts_used` of them per token
    experts_used: int = 0
    expert_ffn: int = 0  # each expert's feed-forward size (qwen3moe's expert_feed_forward_length; else ffn)

    def __post_init__(self):
        self.rope_dims = self.rope_dims or self.head_dim


def _quantize(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype in (gguf.GGMLQuantizationType.F32,):
        return w.astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return w.astype(np.float16)
    if qtype.name.endswith("_K"):  # gguf-py has no K-quant quantizer: the package's bytes, gguf-py decodes them
        import mlx.core as mx
        from mlx_ggml_ext import ops
        return np.array(ops.quantize(mx.array(w.astype(np.float32)), qtype.name, stream=mx.cpu))
    return gguf.quants.quantize(w.astype(np.float32), qtype)


# The matrix types cycled through, K-quants only where the input size is a multiple of 256.
MATRIX_TYPES = [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q6_K,
                gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q4_0]


def write_model(path: str, m: TinyModel, seed: int = 0, matrix_types=None) -> None:
    """A GGUF file for `m` with random weights in several ggml types (`matrix_types`, cycled through the
    matrices in the order written: MATRIX_TYPES by default)."""
    matrix_types = matrix_types or MATRIX_TYPES
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, m.arch)
    a = m.arch
    w.add_uint32(f"{a}.context_length", 2048)
    w.add_uint32(f"{a}.embedding_length", m.hidden)
    w.add_uint32(f"{a}.block_count", m.n_layers)
    w.add_uint32(f"{a}.feed_forward_length", m.ffn)
    w.add_uint32(f"{a}.attention.head_count", m.n_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", m.n_kv)
    w.add_uint32(f"{a}.attention.key_length", m.head_dim)
    w.add_uint32(f"{a}.attention.value_length", m.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", m.eps)
    w.add_float32(f"{a}.rope.freq_base", m.base)
    w.add_uint32(f"{a}.rope.dimension_count", m.rope_dims)
    if m.window:
        w.add_uint32(f"{a}.attention.sliding_window", m.window)
    for key, value in m.extra.items():
        (w.add_string if isinstance(value, str) else w.add_float32)(f"{a}.{key}", value)
    if m.experts:
        w.add_uint32(f"{a}.expert_count", m.experts)
        w.add_uint32(f"{a}.expert_used_count", m.experts_used)
        if a == "qwen3moe":
            w.add_uint32(f"{a}.expert_feed_forward_length", m.expert_ffn)
    counter = [0]

    def add_matrix(name, data, qtype):
        q = _quantize(data, qtype)
        w.add_tensor(name, q, raw_dtype=qtype if q.dtype == np.uint8 else None)

    def matrix(name, rows, cols, scale=None):
        types = [t for t in matrix_types if cols % 256 == 0 or not t.name.endswith("_K")]
        qtype = types[counter[0] % len(types)]
        counter[0] += 1
        data = rng.standard_normal((rows, cols)) * (scale or 1 / math.sqrt(cols))
        add_matrix(name, data, qtype)

    def experts(name, rows, cols):
        """E matrices as one 3-D tensor (ggml ne = (cols, rows, E)), each expert quantized row by row."""
        types = [t for t in matrix_types if cols % 256 == 0 or not t.name.endswith("_K")]
        qtype = types[counter[0] % len(types)]
        counter[0] += 1
        data = rng.standard_normal((m.experts * rows, cols)) / math.sqrt(cols)
        q = _quantize(data, qtype)
        q = q.reshape(m.experts, rows, -1)
        w.add_tensor(name, q, raw_dtype=qtype if q.dtype == np.uint8 else None)

    def vector(name, n, mean=1.0, spread=0.1):
        w.add_tensor(name, (mean + spread * rng.standard_normal(n)).astype(np.float32))

    embd_type = gguf.GGMLQuantizationType.Q6_K if m.hidden % 256 == 0 else gguf.GGMLQuantizationType.Q8_0
    add_matrix("token_embd.weight", rng.standard_normal((m.vocab, m.hidden)), embd_type)
    if m.rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", m.rope_freqs.astype(np.float32))
    q_out, kv_out = m.n_heads * m.head_dim, m.n_kv * m.head_dim
    for i in range(m.n_layers):
        b = f"blk.{i}"
        vector(f"{b}.attn_norm.weight", m.hidden)
        if a == "phi3":
            matrix(f"{b}.attn_qkv.weight", q_out + 2 * kv_out, m.hidden)
        else:
            matrix(f"{b}.attn_q.weight", q_out, m.hidden)
            matrix(f"{b}.attn_k.weight", kv_out, m.hidden)
            matrix(f"{b}.attn_v.weight", kv_out, m.hidden)
        if m.qkv_bias:
            for name, n in (("attn_q", q_out), ("attn_k", kv_out), ("attn_v", kv_out)):
                vector(f"{b}.{name}.bias", n, 0.0, 0.5)
        if m.qk_norm:
            vector(f"{b}.attn_q_norm.weight", m.head_dim)
            vector(f"{b}.attn_k_norm.weight", m.head_dim)
        matrix(f"{b}.attn_output.weight", m.hidden, q_out)
        vector(f"{b}.ffn_norm.weight", m.hidden)
        if a == "gemma3":
            vector(f"{b}.post_attention_norm.weight", m.hidden)
            vector(f"{b}.post_ffw_norm.weight", m.hidden)
        if m.experts:
            eff = m.expert_ffn or m.ffn
            w.add_tensor(f"{b}.ffn_gate_inp.weight", rng.standard_normal((m.experts, m.hidden)).astype(np.float32))
            experts(f"{b}.ffn_gate_exps.weight", eff, m.hidden)
            experts(f"{b}.ffn_up_exps.weight", eff, m.hidden)
            experts(f"{b}.ffn_down_exps.weight", m.hidden, eff)
            continue
        if a == "phi3":
            matrix(f"{b}.ffn_up.weight", 2 * m.ffn, m.hidden)
        else:
            matrix(f"{b}.ffn_gate.weight", m.ffn, m.hidden)
            matrix(f"{b}.ffn_up.weight", m.ffn, m.hidden)
        matrix(f"{b}.ffn_down.weight", m.hidden, m.ffn)
    vector("output_norm.weight", m.hidden)
    if not m.tied:
        add_matrix("output.weight", rng.standard_normal((m.vocab, m.hidden)) / 4, gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_weights(path: str, big_as_float32: bool = False) -> dict:
    """name -> float64 array in numpy (row-major, MLX) order, decoded by gguf-py. `big_as_float32` keeps
    tensors of more than 2**24 elements (a large vocabulary's table) in float32, which every product then
    widens to float64 a block at a time."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        out[t.name] = w.astype(np.float32 if big_as_float32 and w.size > 2**24 else np.float64)
    return out


def _times_transposed(x: np.ndarray, w: np.ndarray, rows_per_block: int = 16384) -> np.ndarray:
    """x @ w.T in float64, w's rows widened a block at a time."""
    if w.dtype == np.float64:
        return x @ w.T
    return np.concatenate([x @ w[i:i + rows_per_block].astype(np.float64).T
                           for i in range(0, w.shape[0], rows_per_block)], axis=-1)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, n_dims, base, adjacent, factors=None):
    """x: (T, H, D). ggml's rope: pair i of the first n_dims turns by pos * base^(-2i/n_dims) / factor_i; the
    pair is (2i, 2i+1) in NORMAL mode and (i, i + n_dims/2) in NEOX mode."""
    half = n_dims // 2
    i = np.arange(half)
    theta = positions[:, None] * base ** (-2.0 * i / n_dims)
    if factors is not None:
        theta = theta / factors[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if adjacent:
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = a * cos - b * sin
        out[..., 1:n_dims:2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:n_dims]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_dims] = a * sin + b * cos
    return out


def attention(q, k, v, scale, window=0):
    """q: (T, H, D), k/v: (T, KV, D); causal, optionally only the last `window` positions (self included)."""
    T, H, _ = q.shape
    rep = H // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (s <= t) & ((t - s < window) if window else True)
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v).reshape(T, -1)


def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def moe_ffn(h, b, used: int) -> np.ndarray:
    """llama.cpp's mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): router probabilities softmax(h @ G^T)
    over the E experts, each token's `used` most probable experts, their probabilities renormalized to sum 1, and
    the weighted sum of those experts' SwiGLU feed-forwards down_e(silu(gate_e h) * up_e h)."""
    logits = h @ b("ffn_gate_inp.weight").T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    gate, up, down = b("ffn_gate_exps.weight"), b("ffn_up_exps.weight"), b("ffn_down_exps.weight")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-p[t])[:used]
        weights = p[t, chosen] / p[t, chosen].sum()
        for e, wt in zip(chosen, weights):
            out[t] += wt * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    return out


def forward(W: dict, m: TinyModel, tokens) -> np.ndarray:
    """Logits (T, vocab) of `tokens` at positions 0..T-1."""
    tokens = np.asarray(tokens)
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    if m.arch == "gemma3":
        x = x * math.sqrt(m.hidden)
    q_out, kv_out = m.n_heads * m.head_dim, m.n_kv * m.head_dim
    for i in range(m.n_layers):
        b = lambda name: W[f"blk.{i}.{name}"]  # noqa: E731
        h = rms_norm(x, b("attn_norm.weight"), m.eps)
        if m.arch == "phi3":
            qkv = h @ b("attn_qkv.weight").T
            q, k, v = qkv[:, :q_out], qkv[:, q_out:q_out + kv_out], qkv[:, q_out + kv_out:]
        else:
            q, k, v = (h @ b(f"{n}.weight").T for n in ("attn_q", "attn_k", "attn_v"))
        if m.qkv_bias:
            q, k, v = q + b("attn_q.bias"), k + b("attn_k.bias"), v + b("attn_v.bias")
        q, k, v = (t.reshape(T, -1, m.head_dim) for t in (q, k, v))
        if m.qk_norm:
            q, k = rms_norm(q, b("attn_q_norm.weight"), m.eps), rms_norm(k, b("attn_k_norm.weight"), m.eps)
        base, window = m.base, 0
        if m.arch == "gemma3" and i % 6 != 5:  # llama.cpp's Gemma 3: five sliding layers, then a global one
            base, window = 10000.0, m.window
        factors = W.get("rope_freqs.weight")
        adjacent = m.arch == "llama"
        q = rope(q, pos, m.rope_dims, base, adjacent, factors)
        k = rope(k, pos, m.rope_dims, base, adjacent, factors)
        o = attention(q, k, v, 1 / math.sqrt(m.head_dim), window) @ b("attn_output.weight").T
        if m.arch == "gemma3":
            x = x + rms_norm(o, b("post_attention_norm.weight"), m.eps)
            h = rms_norm(x, b("ffn_norm.weight"), m.eps)
            f = gelu_tanh(h @ b("ffn_gate.weight").T) * (h @ b("ffn_up.weight").T)
            x = x + rms_norm(f @ b("ffn_down.weight").T, b("post_ffw_norm.weight"), m.eps)
            continue
        x = x + o
        h = rms_norm(x, b("ffn_norm.weight"), m.eps)
        if m.experts:
            x = x + moe_ffn(h, b, m.experts_used)
            continue
        if m.arch == "phi3":
            gate_up = h @ b("ffn_up.weight").T
            gate, up = gate_up[:, :m.ffn], gate_up[:, m.ffn:]
        else:
            gate, up = h @ b("ffn_gate.weight").T, h @ b("ffn_up.weight").T
        x = x + (silu(gate) * up) @ b("ffn_down.weight").T
    x = rms_norm(x, W["output_norm.weight"], m.eps)
    return _times_transposed(x, W.get("output.weight", W["token_embd.weight"]))


# The architectures' tiny configurations (several types each, a K-quant and Q8_0 among them).
TINY_MODELS = {
    "llama": TinyModel("llama", rope_freqs=None),
    "llama3": TinyModel("llama", tied=True, base=500000.0,
                        rope_freqs=np.concatenate([np.ones(16), np.linspace(1, 8, 16)])),
    "qwen2": TinyModel("qwen2", qkv_bias=True, tied=True, base=1e6, eps=1e-6, head_dim=64),
    "qwen3": TinyModel("qwen3", qk_norm=True, head_dim=128, base=1e6, eps=1e-6),
    "gemma3": TinyModel("gemma3", n_layers=6, qk_norm=True, tied=True, window=4, eps=1e-6, base=1e6),
    "phi3": TinyModel("phi3", n_kv=4),
    # Mixtral-style: llama with 4 experts, 2 per token, each of the llama feed-forward's size
    "mixtral": TinyModel("llama", experts=4, experts_used=2, ffn=256),
    "qwen3moe": TinyModel("qwen3moe", qk_norm=True, head_dim=128, base=1e6, eps=1e-6, experts=8, experts_used=3,
                          expert_ffn=256),
}
