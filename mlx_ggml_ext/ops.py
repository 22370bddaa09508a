"""The package's operations. Each checks its Python-level arguments and calls the
C++ primitive; shapes, dtypes and values are validated in C++ (ValueError /
TypeError naming the offending argument)."""

from __future__ import annotations

import operator
from numbers import Integral, Real
from typing import Optional, Tuple, Union

import mlx.core as mx

from . import _ext
from .types import GGMLTensor, GGMLType

Stream = Optional[mx.Stream | mx.Device]


def _require_array(name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, mx.array):
        raise TypeError(f"{name} must be an mlx.core.array, got {type(value).__name__}")


# The checks take the exact builtin types first: an isinstance test against the numbers ABCs costs about 2 us, and a
# model's decode step calls these a few hundred times (ops.rope alone spent 13 us per call on them).
def _require_int(name: str, value) -> None:
    if type(value) is int:
        return
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _require_float(name: str, value) -> None:
    if type(value) is float or type(value) is int:
        return
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")


def rms_norm(x: mx.array, weight: Optional[mx.array] = None, eps: float = 1e-6, *,
             stream: Stream = None) -> mx.array:
    """Fused RMSNorm over the last axis: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    float32, float16 or bfloat16 input of any leading shape; ``weight`` of shape
    ``(D,)`` or None. Float32 accumulation and one rounding to the output dtype
    (x's, promoted with weight's). Differentiable in x and weight; supports vmap
    and mx.compile.
    """
    _require_array("x", x)
    _require_array("weight", weight, optional=True)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    return _ext.rms_norm(x, weight, float(eps), stream=stream)


def add_rms_norm(x: mx.array, residual: mx.array, weight: Optional[mx.array] = None, eps: float = 1e-6, *,
                 stream: Stream = None) -> Tuple[mx.array, mx.array]:
    """A transformer layer's residual add fused with the norm after it: returns ``(h, y)`` with
    ``h = x + residual`` and ``y = rms_norm(h, weight, eps)``.

    One op and one pass over the rows where there were two (CPU, CUDA and Metal kernels). ``x`` and ``residual``
    of the same shape; dtypes as :func:`rms_norm` (promoted with each other).
    ``y`` is the norm of ``h`` as rounded to the output dtype, so both equal ``x + residual`` followed by
    :func:`rms_norm`. Differentiable in all three inputs; supports vmap and mx.compile.
    """
    _require_array("x", x)
    _require_array("residual", residual)
    _require_array("weight", weight, optional=True)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    h, y = _ext.add_rms_norm(x, residual, weight, float(eps), stream=stream)
    return h, y


def rope(x: mx.array, positions: Union[mx.array, int], n_dims: int, mode: Union[str, int] = "normal",
         freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
         beta_fast: float = 32.0, beta_slow: float = 1.0, n_ctx_orig: int = 0,
         freq_factors: Optional[mx.array] = None, *, heads_first: bool = False, stream: Stream = None) -> mx.array:
    """ggml's ``rope_ext`` (rotary position embedding) in ggml's layout.

    ``x``: float32/float16/bfloat16 of shape ``(..., T, H, D)`` (tokens, heads, head
    dim; at least 3 dimensions, D even); with ``heads_first=True``, ``(..., H, T, D)``,
    MLX's attention layout (``mx.fast.rope``'s), the same math without a transpose.
    ``positions``: int32 ``(T,)`` with any values, or an int offset for
    ``offset + arange(T)``. The first ``n_dims`` (even, <= D)
    elements of each head are rotated, the rest copied. ``mode``: ``"normal"`` (ggml 0,
    pairs (2i, 2i+1)) or ``"neox"`` (ggml 2, pairs (i, i + n_dims/2)); the multi-section
    modes ``"mrope"``/``"vision"``/``"imrope"`` (8/24/40) raise NotImplementedError.
    ``freq_scale``, YaRN (``ext_factor``, ``attn_factor``, ``beta_fast``, ``beta_slow``,
    ``n_ctx_orig``) and ``freq_factors`` (float32 ``(n_dims/2,)``) as in ggml. Float32
    math, output in x's dtype. Differentiable in x and freq_factors (positions are
    integers: asking for their gradient raises); supports vmap (positions batched too)
    and mx.compile (with ``shapeless=True`` pass positions as an array: an int offset's
    positions keep the traced length, and a different T then raises).
    """
    _require_array("x", x)
    if not isinstance(heads_first, bool):
        raise TypeError(f"heads_first must be a bool, got {type(heads_first).__name__}")
    positions, rest = _rope_arguments(positions, n_dims, mode, freq_base, freq_scale, ext_factor, attn_factor,
                                      beta_fast, beta_slow, n_ctx_orig, freq_factors)
    return _ext.rope(x, positions, *rest, heads_first=heads_first, stream=stream)


def _rope_arguments(positions, n_dims, mode, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
                    n_ctx_orig, freq_factors) -> tuple:
    """The rope ops' arguments checked: (positions, the extension's arguments after them)."""
    if not isinstance(positions, mx.array):
        if type(positions) is not int and (isinstance(positions, bool) or not isinstance(positions, Integral)):
            raise TypeError(f"positions must be an int32 mlx.core.array or an int offset, "
                            f"got {type(positions).__name__}")
        positions = int(positions)
        if not -2**31 <= positions < 2**31:
            raise ValueError(f"the positions offset must fit in int32, got {positions}")
    _require_int("n_dims", n_dims)
    if isinstance(mode, bool) or not isinstance(mode, (str, Integral)):
        raise TypeError(f"mode must be a str ('normal', 'neox') or a ggml mode int, got {type(mode).__name__}")
    for name, value in [("freq_base", freq_base), ("freq_scale", freq_scale), ("ext_factor", ext_factor),
                        ("attn_factor", attn_factor), ("beta_fast", beta_fast), ("beta_slow", beta_slow)]:
        _require_float(name, value)
    _require_int("n_ctx_orig", n_ctx_orig)
    _require_array("freq_factors", freq_factors, optional=True)
    return positions, (int(n_dims), mode if isinstance(mode, str) else int(mode), float(freq_base),
                       float(freq_scale), float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow),
                       int(n_ctx_orig), freq_factors)


def rope_qkv(qkv: mx.array, positions: Union[mx.array, int], heads: int, kv_heads: int, n_dims: int,
             mode: Union[str, int] = "normal", freq_base: float = 10000.0, freq_scale: float = 1.0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
             n_ctx_orig: int = 0, freq_factors: Optional[mx.array] = None, *, with_v: bool = True,
             q_norm: Optional[mx.array] = None, k_norm: Optional[mx.array] = None, norm_eps: float = 1e-6,
             stream: Stream = None) -> Tuple[mx.array, ...]:
    """A fused q/k/v projection's output split into attention heads, q and k rotated by ``rope``: one op.

    ``qkv``: float32/float16/bfloat16 ``(..., T, (heads + 2*kv_heads) * D)``, each token's q heads, then its k
    heads, then its v heads (what a stacked q/k/v projection gives). Returns ``(q, k, v)`` in MLX's attention
    layout: ``q (..., heads, T, D)``, ``k`` and ``v`` ``(..., kv_heads, T, D)``; q and k are ``rope`` of their
    heads with the same arguments (``positions`` int32 ``(T,)`` or an int offset, ``n_dims`` <= D, ``mode`` and
    the rest), v is copied. ``with_v=False``: qkv holds q and k only, ``(..., T, (heads + kv_heads) * D)``, and
    ``(q, k)`` is returned (v a projection of its own). ``q_norm`` and ``k_norm`` (both or neither, float ``(D,)``):
    every q (k) head is first ``rms_norm``-ed over its D elements with that weight and ``norm_eps``, in float32
    (Qwen 3's and Gemma 3's q/k norms). The numbers of reshape, split, ``rms_norm``, ``rope`` and swapaxes, in one
    kernel (CPU, CUDA and Metal; Metal's checked only in an emulator), and one node in the graph instead of eleven
    (fifteen with the norms). The outputs are views of one buffer. Differentiable in qkv, freq_factors and the norm
    weights; supports vmap and mx.compile.
    """
    _require_array("qkv", qkv)
    _require_int("heads", heads)
    _require_int("kv_heads", kv_heads)
    if not isinstance(with_v, bool):
        raise TypeError(f"with_v must be a bool, got {type(with_v).__name__}")
    _require_array("q_norm", q_norm, optional=True)
    _require_array("k_norm", k_norm, optional=True)
    _require_float("norm_eps", norm_eps)
    positions, rest = _rope_arguments(positions, n_dims, mode, freq_base, freq_scale, ext_factor, attn_factor,
                                      beta_fast, beta_slow, n_ctx_orig, freq_factors)
    if not isinstance(positions, mx.array):
        if qkv.ndim < 2:
            raise ValueError(f"qkv must be (..., T, (heads + 2*kv_heads) * D), got shape {tuple(qkv.shape)}")
        if positions + qkv.shape[-2] > 2**31:
            raise ValueError(f"the positions offset {positions} + T ({qkv.shape[-2]}) overflows int32")
        positions = mx.arange(positions, positions + qkv.shape[-2], dtype=mx.int32)
    return tuple(_ext.rope_qkv(qkv, positions, int(heads), int(kv_heads), *rest, with_v=with_v, q_norm=q_norm,
                               k_norm=k_norm, norm_eps=float(norm_eps), stream=stream))


def dequantize(data: mx.array, ggml_type, shape, dtype: mx.Dtype = mx.float32, *,
               stream: Stream = None) -> mx.array:
    """Raw ggml blocks as floats of the logical ``shape``.

    ``data``: uint8, ``rows x bytes_per_row`` bytes, shaped ``(rows, bytes_per_row)`` (or flat, or with any
    leading axes and a last axis of ``bytes_per_row``); ``ggml_type``: a :class:`GGMLType`, name ("q4_k") or
    id; ``shape``: the tensor's shape in MLX order (last axis = ggml's ne0, a multiple of the block size).
    Every type of the SPEC table. float32 output is bit-identical to ``gguf.quants.dequantize``; float16 and
    bfloat16 are rounded once from it. vmap over a batch of tensors works; the bytes have no gradient.
    """
    _require_array("data", data)
    t = GGMLType.of(ggml_type)
    try:
        if isinstance(shape, (str, bytes)) or any(isinstance(d, bool) for d in shape):
            raise TypeError
        dims = [operator.index(d) for d in shape]
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if not isinstance(dtype, mx.Dtype):
        raise TypeError(f"dtype must be an mlx.core.Dtype, got {type(dtype).__name__}")
    return _ext.dequantize(data, int(t), dims, dtype, stream=stream)


def quantize(w: mx.array, ggml_type, *, imatrix: mx.array = None, stream: Stream = None) -> mx.array:
    """A float tensor ``(..., K)`` as ggml blocks: uint8 ``(rows, bytes_per_row)``, rows = the product of
    the leading axes (1 for a vector); wrap it as ``GGMLTensor(blocks, ggml_type, w.shape)``.

    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 are byte-identical to ``gguf.quants.quantize``
    for finite input (two documented exceptions for blocks whose largest magnitude is below 2**-125, where
    gguf's result is platform-dependent: see docs/formats.md). Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and
    IQ4_XS use a least-squares scale search (reconstruction error below ggml's reference quantizer's;
    docs/formats.md). Other types raise NotImplementedError. A block containing NaN or +-inf decodes to NaN
    in every element (MXFP4: +inf).

    ``imatrix``: optional importance matrix for those seven searched types, float32 of shape ``(K,)``, finite
    and >= 0 (e.g. the mean squared activation of each input column): the search then minimizes
    ``sum(imatrix[col] * (decoded - w)**2)`` instead of the plain squared error.
    """
    _require_array("w", w)
    _require_array("imatrix", imatrix, optional=True)
    if imatrix is not None and imatrix.dtype == mx.float32 and imatrix.ndim == 1:
        # The values are checked here, eagerly (a (K,) vector): the kernel cannot raise.
        if not mx.all(mx.isfinite(imatrix) & (imatrix >= 0)).item():
            raise ValueError("imatrix must be finite and >= 0 (one importance weight per column)")
    return _ext.quantize(w, int(GGMLType.of(ggml_type)), imatrix=imatrix, stream=stream)


#: The type ids of rows packed by :func:`pack_rows` (not ggml types: never in a file), by name ("Q4_K_R8"), and the
#: types :func:`pack_rows` packs.
_PACKED_NAMES = {name: packed for name, (packed, _, _) in _ext.PACKED_TYPES.items()}
PACKABLE_TYPES = tuple(GGMLType(plain) for _, plain, _ in _ext.PACKED_TYPES.values())
# Bytes a packed row takes per block of the plain row (Q4_K: 148 against the blocks' 144; the others as the blocks).
_PACKED_BLOCK_BYTES = {GGMLType(plain): row_bytes for _, plain, row_bytes in _ext.PACKED_TYPES.values()}
globals().update(_PACKED_NAMES)  # ops.Q4_K_R8, ops.Q4_0_R8, ...: the ids as module constants


def _type_id(ggml_type) -> int:
    """A GGMLType's id, or a packed layout's ("Q4_K_R8" etc. in any case, or the id)."""
    if isinstance(ggml_type, str) and ggml_type.upper() in _PACKED_NAMES:
        return _PACKED_NAMES[ggml_type.upper()]
    if not isinstance(ggml_type, (str, GGMLType)) and ggml_type in _PACKED_NAMES.values():
        return int(ggml_type)
    return int(GGMLType.of(ggml_type))


def pack_rows(w: Union[GGMLTensor, mx.array], ggml_type=None) -> mx.array:
    """Rows of a packable type (:data:`PACKABLE_TYPES`: Q4_K, Q6_K, Q4_0, IQ4_NL, Q5_0, Q8_0) packed 8 at a time
    for the CPU's products: pass the result to :func:`quantized_matmul` with ``ggml_type="Q4_K_R8"`` (the type's
    name + ``"_R8"``).

    ``w``: a :class:`GGMLTensor` of such a type of shape ``(N, K)``, or its raw blocks (uint8
    ``(N, bytes_per_row)``) with ``ggml_type``; N must be a multiple of 8. Returns a new uint8 array:
    ``(N, K / 256 * 148)`` for Q4_K (2.8% larger than the blocks), the blocks' own shape for the others. A copy
    made once, e.g. at load; the
    product on it reads 8 rows per vector and is 1.3-2x faster on AVX-512 machines. CPU only: the GPU kernels do
    not read it (:func:`unpack_rows` gives the blocks back).
    """
    if isinstance(w, GGMLTensor):
        if len(w.shape) != 2:
            raise ValueError(f"w must be a 2-D weight (N, K), got a tensor of shape {w.shape}")
        ggml_type, w = w.ggml_type, w.data
    _require_array("w", w)
    if ggml_type is None:
        raise TypeError("pack_rows needs the blocks' ggml_type (one of PACKABLE_TYPES)")
    return _ext.pack_rows(w, _type_id(ggml_type))


def unpack_rows(packed: mx.array, ggml_type="Q4_K_R8") -> mx.array:
    """The blocks (uint8 ``(N, bytes_per_row)``) that :func:`pack_rows` packed into ``packed`` (of ``ggml_type``
    "Q4_K_R8" etc.), bit for bit."""
    _require_array("packed", packed)
    return _ext.unpack_rows(packed, _type_id(ggml_type))


def quantized_matmul(x: mx.array, w: Union[GGMLTensor, mx.array], ggml_type=None, *, precise_x: bool = False,
                     stream: Stream = None) -> mx.array:
    """``x @ dequantize(w).T`` computed on the packed ggml blocks (the float matrix is never materialized,
    except on CUDA for more than 8 rows of x: see below).

    ``x``: float32/float16/bfloat16 of shape ``(..., K)``. ``w``: a :class:`GGMLTensor` of logical shape
    ``(N, K)``, or its raw blocks (uint8 ``(N, bytes_per_row)``) with ``ggml_type``, or a float32/float16/
    bfloat16 array ``(N, K)``. Every type of :class:`GGMLType`, and on the CPU Q4_K / Q6_K / Q8_0 rows packed by
    :func:`pack_rows` (``ggml_type="Q4_K_R8"`` etc.); K must fill whole blocks of the type. Returns
    ``(..., N)`` in x's dtype. On the CPU, quantized weights meet x quantized to int8 per 32 elements (as
    ggml's CPU does); sums in float32. Differentiable in x (the weight's bytes have no gradient); supports
    vmap over x and over a batch of weights, and mx.compile. On a CUDA GPU, from 9 rows of x per weight matrix
    (``MLX_GGML_EXT_CUDA_DENSE_ROWS``; 0: never) the product is the weight dequantized to x's dtype (bfloat16 for
    float32 x, whose product is then rounded to bfloat16 once; not with ``precise_x``) times ``mx.matmul``, a
    temporary of N x K elements, 3-4x faster than the kernels on the blocks.

    ``precise_x=True``: x enters in two int8 passes on the CPU (its codes, then the codes of their rounding
    residual), which cuts the error from x's rounding about 250-fold, and as floats on the GPU; for outputs
    that decide a token (an output head), at up to twice the integer work of the product.
    """
    _require_array("x", x)
    if not isinstance(precise_x, bool):
        raise TypeError(f"precise_x must be a bool, got {type(precise_x).__name__}")
    if isinstance(w, GGMLTensor):
        if ggml_type is not None and GGMLType.of(ggml_type) != w.ggml_type:
            raise ValueError(f"ggml_type {GGMLType.of(ggml_type).name} does not match the tensor's "
                             f"{w.ggml_type.name}")
        if len(w.shape) != 2:
            raise ValueError(f"w must be a 2-D weight (N, K), got a tensor of shape {w.shape}")
        return _ext.quantized_matmul(x, w.data, int(w.ggml_type), stream=stream, precise_x=precise_x)
    if not isinstance(w, mx.array):
        raise TypeError(f"w must be a GGMLTensor or an mlx.core.array, got {type(w).__name__}")
    return _ext.quantized_matmul(x, w, -1 if ggml_type is None else _type_id(ggml_type), stream=stream,
                                 precise_x=precise_x)


def mul_mat(a: Union[GGMLTensor, mx.array], b: mx.array, *, stream: Stream = None) -> mx.array:
    """ggml's ``ggml_mul_mat(a, b)`` in MLX's axis order: ``b @ a^T`` as float32.

    ``a``: a :class:`GGMLTensor` (any ggml type) or a float array of shape ``(A3, A2, M, K)`` (fewer leading
    axes allowed); ``b``: float ``(B3, B2, N, K)``. Returns ``(B3, B2, N, M)`` (ggml's result ne = [M, N, B2,
    B3]) with ggml's broadcasting: B2 % A2 == 0, B3 % A3 == 0, batch i2 of b uses a's batch i2 // (B2 // A2).
    Differentiable in b; supports vmap and mx.compile.
    """
    _require_array("b", b)
    if isinstance(a, GGMLTensor):
        return _ext.mul_mat(a.data, int(a.ggml_type), list(a.shape), b, stream=stream)
    if not isinstance(a, mx.array):
        raise TypeError(f"a must be a GGMLTensor or an mlx.core.array, got {type(a).__name__}")
    return _ext.mul_mat(a, -1, list(a.shape), b, stream=stream)


__all__ = ["rms_norm", "add_rms_norm", "rope", "rope_qkv", "dequantize", "quantize", "quantized_matmul", "mul_mat"]


def glu(gate: mx.array, up: Optional[mx.array] = None, kind: str = "swiglu", *, alpha: Optional[float] = None,
        limit: Optional[float] = None, stream: Stream = None) -> mx.array:
    """ggml's gated linear units: ``act(gate) * up`` in one pass.

    ``kind``: ``"swiglu"`` (SiLU), ``"geglu"`` (GELU with the tanh approximation, as ggml's GELU and
    ``mlx.nn.gelu_approx``), ``"geglu_erf"`` (exact GELU, as ``mlx.nn.gelu``) or ``"swiglu_oai"`` (gpt-oss's
    clamped SwiGLU, ggml's ``swiglu_oai``: ``x = min(gate, limit)``, ``y = clip(up, -limit, limit)``,
    ``x * sigmoid(alpha * x) * (y + 1)``; ``alpha`` defaults to 1.702 and ``limit`` to 7.0, as in gpt-oss, and
    only this kind takes them: finite, ``limit > 0``). ``gate`` and ``up``: float32/float16/bfloat16 arrays of
    the same shape (no broadcasting, as in ggml; dtypes promote). With ``up=None``, ``gate`` is ggml's fused
    layout: its last axis (even) holds the gate half then the up half, and the result has half that length
    (phi3's ``ffn_up``). Float32 math within a few ulps (docs/fused-ops.md), one rounding to the output dtype.
    CPU (SIMD, threaded), CUDA and Metal kernels. Differentiable in both inputs (vjp, jvp; swiglu_oai's clamps
    pass no derivative past the limits); supports vmap and mx.compile (shapeless too).
    """
    _require_array("gate", gate)
    _require_array("up", up, optional=True)
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str ('swiglu', 'geglu', 'geglu_erf', 'swiglu_oai'), got {type(kind).__name__}")
    if alpha is not None:
        _require_float("alpha", alpha)
        alpha = float(alpha)
    if limit is not None:
        _require_float("limit", limit)
        limit = float(limit)
    return _ext.glu(gate, up, kind, alpha=alpha, limit=limit, stream=stream)


def attention(q: mx.array, k: mx.array, v: mx.array, mask: Union[mx.array, str, None] = None, *, scale: float,
              softcap: float = 0.0, sinks: Optional[mx.array] = None, stream: Stream = None) -> mx.array:
    """ggml's ``flash_attn_ext`` in mlx-lm's layout, a drop-in for ``mx.fast.scaled_dot_product_attention``.

    ``q (B, Hq, Tq, D)``, ``k (B, Hk, Tk, D)``, ``v (B, Hk, Tk, Dv)`` with Hq a multiple of Hk (grouped-query
    attention: query head h uses kv head ``h // (Hq // Hk)``); float32/float16/bfloat16 (promoted to one
    dtype), float32 accumulation. Per head: ``softmax(s + mask) @ v`` with ``s = scale * q @ k.T``, or
    ``softcap * tanh(s / softcap)`` when ``softcap > 0`` (Gemma 2's logit softcapping). ``mask``: None; an
    additive float array broadcastable to ``(B, Hq, Tq, Tk)`` (-inf allowed), or a bool one (True keeps);
    or ``"causal"``: query i sees keys ``j <= i + Tk - Tq`` (a KV cache's new queries come last). ``sinks``:
    None or a float array ``(Hq,)`` of per-head logits that join each row's softmax denominator only
    (gpt-oss's attention sinks, as ggml's ``ggml_flash_attn_ext_add_sinks`` and MLX's ``sinks=``): the row's
    max is taken over its scores and the sink, and ``exp(sink - max)`` is added to the sum. A query that sees
    no key gets zeros (as ggml; MLX's gives NaN), with or without a sink. Output ``(B, Hq, Tq, Dv)``.
    CPU (flash-style, threaded, SIMD), CUDA and Metal (flash-style, head dims up to 512; the Metal kernel is
    checked only in the project's Metal emulator, not yet on Apple hardware).
    Differentiable in q, k, v, the mask and the sinks (the backward pass is MLX's composed ops: correct, not
    fast); supports vmap and mx.compile.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        _require_array(name, a)
    _require_array("sinks", sinks, optional=True)
    if not (mask is None or isinstance(mask, (mx.array, str))):
        raise TypeError(f"mask must be an mlx.core.array, 'causal' or None, got {type(mask).__name__}")
    _require_float("scale", scale)
    _require_float("softcap", softcap)
    return _ext.attention(q, k, v, mask, scale=float(scale), softcap=float(softcap), sinks=sinks, stream=stream)


__all__ += ["glu", "attention"]


def evaluate_ids_on_gpu(ids: mx.array, stream: Stream = None) -> None:
    """On a GPU stream mul_mat_id's kernel cannot report a bad expert index (it would give a NaN row), so the
    ids are evaluated here and the op checks them on the host when the graph is built: one synchronization per
    call on the GPU. The CPU kernel checks lazy ids itself."""
    device = stream.device if isinstance(stream, mx.Stream) else stream if isinstance(stream, mx.Device) \
        else mx.default_device()
    if device.type == mx.DeviceType.gpu:
        try:
            mx.eval(ids)
        except (ValueError, RuntimeError):
            pass  # a tracer of vmap / compile: nothing to evaluate yet (a bad index then gives a NaN row)


def mul_mat_id(w: Union[GGMLTensor, mx.array], x: mx.array, ids: mx.array, *, check_ids: bool = True,
               stream: Stream = None) -> mx.array:
    """ggml's ``ggml_mul_mat_id``: each token's rows through the experts its ``ids`` choose (a mixture-of-experts
    feed-forward), computed on the experts' ggml blocks.

    ``w``: a :class:`GGMLTensor` of logical shape ``(E, N, K)`` (E experts of N x K; any :class:`GGMLType`) or a
    float array ``(E, N, K)``. ``x``: float32/float16/bfloat16 ``(T, n_used, K)``, or ``(T, 1, K)``: one row per
    token that every slot reads (ggml's broadcast). ``ids``: integer ``(T, n_used)``, each in ``[0, E)``.
    Returns ``(T, n_used, N)`` in x's dtype, ``out[t, s] = W[ids[t, s]] @ x[t, s or 0]``. On the CPU the tokens are
    grouped by expert, so each expert's blocks are read once per call. An id outside ``[0, E)`` raises ValueError
    here when ``ids`` is already evaluated (on a GPU stream they are evaluated here), else the CPU evaluation
    raises (``mx.eval``: RuntimeError with the same message) and a GPU kernel gives that pair a row of NaN; no
    weight is read out of bounds. ``check_ids=False`` leaves lazy ids lazy on a GPU stream (no evaluation, no
    synchronization: a model whose router makes the ids, top-k of E gate scores, in ``[0, E)`` by construction,
    keeps its token in one graph); a bad id then gives its pair a NaN row there. Differentiable in x (the blocks
    and ids have no gradient); supports vmap (over x, ids and a batch of expert sets), jvp and mx.compile
    (shapeless too). CPU; CUDA; Metal (checked in the project's Metal emulator only, not on Apple hardware).
    """
    _require_array("x", x)
    _require_array("ids", ids)
    if not isinstance(check_ids, bool):
        raise TypeError(f"check_ids must be a bool, got {type(check_ids).__name__}")
    if check_ids:
        evaluate_ids_on_gpu(ids, stream)
    if isinstance(w, GGMLTensor):
        return _ext.mul_mat_id(w.data, int(w.ggml_type), list(w.shape), x, ids, stream=stream)
    if not isinstance(w, mx.array):
        raise TypeError(f"w must be a GGMLTensor or an mlx.core.array, got {type(w).__name__}")
    return _ext.mul_mat_id(w, -1, list(w.shape), x, ids, stream=stream)


__all__ += ["mul_mat_id"]


def kv_cache_append(cache: mx.array, rows: mx.array, offset: int, step: int = 256, *,
                    stream: Stream = None) -> mx.array:
    """An attention cache with new rows: ``concatenate([cache[:, :, :offset], rows], axis=2)``, one op that copies
    only the new rows where it can.

    ``cache`` ``(B, H, R, D)`` and ``rows`` ``(B, H, T, D)`` (float32/float16/bfloat16; rows converted to the
    cache's dtype), ``0 <= offset <= R``. Returns ``(B, H, offset + T, D)``, a view of a buffer with room for more
    rows: the cache's own when nothing else holds it (MLX lets it be donated: keep only the returned array, as
    with MLX's slice assignment) and its buffer has room, else a new one of ``offset + T`` rows rounded up to
    ``step``. So appending to what it returned writes only the new rows, one graph node where mlx-lm's KVCache
    builds two (a slice update and a slice). CPU, CUDA and Metal (Metal's kernel checked only in an emulator).
    Differentiable in both
    arrays; supports vmap and mx.compile.
    """
    _require_array("cache", cache)
    _require_array("rows", rows)
    _require_int("offset", offset)
    _require_int("step", step)
    if not 0 <= offset < 2**31:
        raise ValueError(f"offset must be in [0, 2**31), got {offset}")
    if not 0 < step < 2**31:
        raise ValueError(f"step must be in [1, 2**31), got {step}")
    return _ext.kv_cache_append(cache, rows, int(offset), int(step), stream=stream)


__all__ += ["kv_cache_append"]
