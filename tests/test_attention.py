"""ops.attention (ggml's flash_attn_ext in mlx-lm's layout) against float64 numpy softmax attention."""
import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import ops
from harness import DTYPES, random_array, to_numpy

# The op runs on the suite's device (CPU, CUDA or Metal).
def attend(*args, **kwargs):
    return ops.attention(*args, **kwargs)


# Relative to the largest output: float32 accumulation, or one rounding of each 16-bit input and the output.
TOL = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}


def reference(q, k, v, mask=None, scale=1.0, softcap=0.0, causal=False, sinks=None):
    """float64 attention from the definition; a row that sees no key gives zeros (ggml's convention). A sink
    (one logit per query head) is one more score per row that has no value: it joins the max and the sum."""
    hq, hk = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hk, axis=1)
    v = np.repeat(v, hq // hk, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + mask
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        visible = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
        s = np.where(visible, s, -np.inf)
    if sinks is not None:
        column = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], s.shape[:3] + (1,))
        s = np.concatenate([s, column], axis=-1)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = np.sum(e, axis=-1, keepdims=True)
    e = e[..., :k.shape[2]]
    return np.einsum("bhij,bhjd->bhid", e, v) / np.where(l == 0, 1.0, l)


def qkv(rng, b, hq, hk, tq, tk, d, dtype, dv=None):
    return (random_array(rng, (b, hq, tq, d), dtype), random_array(rng, (b, hk, tk, d), dtype),
            random_array(rng, (b, hk, tk, dv or d), dtype))


def check(y, expected, dtype):
    got = to_numpy(y)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    err = np.max(np.abs(got - expected))
    scale = max(np.max(np.abs(expected)), 1e-30)
    assert err <= TOL[dtype] * scale, f"{dtype}: max error {err:.3e} > {TOL[dtype]:.1e} * {scale:.3e}"


CASES = [  # (B, Hq, Hk, Tq, Tk, D)
    (1, 4, 1, 33, 33, 256),   # Gemma 3 270M's heads (GQA 4:1, D 256)
    (1, 4, 1, 1, 300, 256),   # its decode step
    (2, 8, 2, 17, 40, 64),    # Llama-shaped GQA, two batches
    (1, 2, 2, 9, 9, 80),      # D 80 (not a power of two)
    (1, 3, 1, 5, 12, 72),     # D 72: a part-vector tail with AVX-512
    (1, 2, 1, 1, 1100, 64),   # decode over a long cache: the keys split between threads
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_float64(case, dtype, causal):
    b, hq, hk, tq, tk, d = case
    rng = np.random.default_rng(sum(case))
    q, k, v = qkv(rng, b, hq, hk, tq, tk, d, dtype)
    scale = 1.0 / math.sqrt(d)
    y = attend(q, k, v, "causal" if causal else None, scale=scale)
    assert y.shape == (b, hq, tq, d) and y.dtype == dtype
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=scale, causal=causal), dtype)


@pytest.mark.parametrize("tq, tk", [(1, 7), (5, 37), (37, 37), (64, 200)])
def test_causal_with_kv_cache_offset(tq, tk):
    """New queries are the last tq positions of tk: query i sees keys j <= i + tk - tq."""
    rng = np.random.default_rng(tq * tk)
    q, k, v = qkv(rng, 1, 4, 2, tq, tk, 64, mx.float32)
    y = attend(q, k, v, "causal", scale=0.125)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.125, causal=True), mx.float32)


def test_causal_with_more_queries_than_keys_gives_zeros_for_unseeing_rows():
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 1, 2, 1, 6, 4, 16, mx.float32)
    y = attend(q, k, v, "causal", scale=0.25)
    expected = reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.25, causal=True)
    assert np.all(expected[:, :, :2] == 0)
    check(y, expected, mx.float32)


@pytest.mark.parametrize("mask_shape", [(17, 40), (1, 8, 17, 40), (2, 1, 17, 40), (2, 8, 1, 40), (1, 1, 17, 1)],
                         ids=str)
def test_additive_mask_broadcasts_with_minus_inf(mask_shape):
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, 2, 8, 2, 17, 40, 64, mx.float32)
    m = rng.standard_normal(mask_shape)
    m[rng.random(mask_shape) < 0.3] = -np.inf
    mask = mx.array(m.astype(np.float32))
    y = attend(q, k, v, mask, scale=0.125)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), mask=m, scale=0.125), mx.float32)


def test_fully_masked_rows_give_zeros():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 1, 2, 1, 4, 300, 32, mx.float32)
    m = np.zeros((4, 300), np.float32)
    m[1] = -np.inf
    y = np.array(attend(q, k, v, mx.array(m), scale=0.2))
    assert np.all(y[:, :, 1] == 0) and np.all(np.isfinite(y))
    check(mx.array(y), reference(to_numpy(q), to_numpy(k), to_numpy(v), mask=m, scale=0.2), mx.float32)


def test_bool_mask_keeps_true():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, 1, 4, 4, 6, 10, 16, mx.float32)
    keep = rng.random((6, 10)) < 0.6
    keep[:, 0] = True
    y = attend(q, k, v, mx.array(keep), scale=0.25)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), mask=np.where(keep, 0.0, -np.inf), scale=0.25),
          mx.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap(dtype, causal):
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 1, 4, 2, 13, 29, 64, dtype)
    q = q * 4  # scores well into the cap's curve
    y = attend(q, k, v, "causal" if causal else None, scale=0.125, softcap=2.0)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.125, softcap=2.0, causal=causal), dtype)


def test_value_dim_differs_from_key_dim():
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 1, 2, 1, 5, 9, 48, mx.float32, dv=40)
    y = attend(q, k, v, scale=0.1)
    assert y.shape == (1, 2, 5, 40)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.1), mx.float32)


def test_every_cpu_kernel_variant(cpu_isa):
    rng = np.random.default_rng(7)
    for d in (16, 72, 256):
        q, k, v = qkv(rng, 1, 4, 2, 7, 19, d, mx.float32)
        y = attend(q, k, v, "causal", scale=0.3, softcap=5.0)
        check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.3, softcap=5.0, causal=True), mx.float32)


def test_matches_mlx_fast_sdpa():
    # MLX's attention on the CPU stream: its CUDA kernel computes in lower precision (6e-4 off on an H100).
    rng = np.random.default_rng(8)
    q, k, v = qkv(rng, 1, 8, 2, 20, 20, 64, mx.float32)
    for mask in (None, "causal"):
        mlx_attention = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask, stream=mx.cpu)
        np.testing.assert_allclose(np.array(attend(q, k, v, mask, scale=0.125)), np.array(mlx_attention),
                                   rtol=1e-4, atol=1e-5)


def test_non_contiguous_inputs():
    """mlx-lm hands over transposed (B, T, H, D) -> (B, H, T, D) views."""
    rng = np.random.default_rng(9)
    q = random_array(rng, (1, 11, 4, 32), mx.float32).transpose(0, 2, 1, 3)
    k = random_array(rng, (1, 11, 2, 32), mx.float32).transpose(0, 2, 1, 3)
    v = random_array(rng, (1, 11, 2, 32), mx.float32).transpose(0, 2, 1, 3)
    y = attend(q, k, v, "causal", scale=0.2)
    check(y, reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.2, causal=True), mx.float32)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_kv_cache_slices_and_strided_rows(dtype):
    """A KV cache's keys are a slice of a larger buffer (read in place through its strides); a head dim taken with
    a step (rows not contiguous) is copied first. Both give the reference."""
    rng = np.random.default_rng(14)
    k_buf = random_array(rng, (2, 2, 64, 32), dtype)
    v_buf = random_array(rng, (2, 2, 64, 32), dtype)
    q = random_array(rng, (2, 4, 1, 32), dtype)
    k, v = k_buf[:, :, :37, :], v_buf[:, :, :37, :]
    check(attend(q, k, v, scale=0.2), reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.2), dtype)
    q2 = random_array(rng, (2, 4, 5, 64), dtype)[..., ::2]
    k2 = k_buf[:, :, :37, :16]
    v2 = v_buf[:, :, 3:40, ::2]
    q2 = q2[..., :16]
    check(attend(q2, k2, v2, "causal", scale=0.3),
          reference(to_numpy(q2), to_numpy(k2), to_numpy(v2), scale=0.3, causal=True), dtype)


# ----------------------------------------------------------------------------- attention sinks

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tq, tk, mask", [(1, 1100, None), (13, 13, "causal"), (5, 40, "additive")], ids=str)
def test_sinks(dtype, tq, tk, mask):
    """Per-head sinks join each row's softmax denominator (decode with split keys, prefill, an additive mask with
    a fully masked row); also against MLX's own sinks= on the CPU."""
    rng = np.random.default_rng(tq + tk)
    q, k, v = qkv(rng, 1, 4, 2, tq, tk, 64, dtype)
    sinks = rng.standard_normal(4).astype(np.float32) * 2
    sinks[1] = 10.0  # above every score: the sink dominates the head's denominator
    m = None
    if mask == "additive":
        m = rng.standard_normal((tq, tk)).astype(np.float32)
        m[2] = -np.inf
    y = attend(q, k, v, mx.array(m) if m is not None else mask, scale=0.125, sinks=mx.array(sinks))
    expected = reference(to_numpy(q), to_numpy(k), to_numpy(v), mask=m, scale=0.125, causal=mask == "causal",
                         sinks=sinks)
    check(y, expected, dtype)
    if dtype == mx.float32 and mask != "additive":  # MLX gives NaN where a row sees no key
        theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask, sinks=mx.array(sinks),
                                                      stream=mx.cpu)
        np.testing.assert_allclose(np.array(y), np.array(theirs), rtol=1e-4, atol=1e-5)


def test_sinks_gradient_and_vmap():
    rng = np.random.default_rng(15)
    q, k, v = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in [(1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4)])
    sinks = mx.array(np.array([0.3, -0.7], np.float32))
    c = rng.standard_normal((1, 2, 3, 4))
    f = lambda a, sk: np.sum(reference(a, to_numpy(k), to_numpy(v), scale=0.5, causal=True, sinks=sk) * c)
    grads = mx.grad(lambda a, sk: mx.sum(attend(a, k, v, "causal", scale=0.5, sinks=sk) * mx.array(c.astype(np.float32))),
                    argnums=(0, 1))(q, sinks)
    base = [to_numpy(q), to_numpy(sinks)]
    h = 1e-6
    for i, g in enumerate(grads):
        fd = np.zeros_like(base[i])
        for idx in np.ndindex(*base[i].shape):
            plus, minus = [x.copy() for x in base], [x.copy() for x in base]
            plus[i][idx] += h
            minus[i][idx] -= h
            fd[idx] = (f(*plus) - f(*minus)) / (2 * h)
        # The gradient is composed of MLX ops: on a GPU its float32 matmuls round more (H200: 2.4e-4 at most here)
        np.testing.assert_allclose(np.array(g), fd, rtol=1e-3, atol=1e-4 if mx.default_device() == mx.cpu else 1e-3)
    many = mx.array(rng.standard_normal((3, 2)).astype(np.float32))  # vmapped sinks: per-batch in the kernel
    y = mx.vmap(lambda sk: attend(q, k, v, scale=0.5, sinks=sk))(many)
    expected = np.stack([reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.5, sinks=to_numpy(many)[i])
                         for i in range(3)])
    check(y, expected, mx.float32)


def test_bad_sinks():
    q = k = v = mx.ones((1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"sinks must have shape \(Hq,\) = \(2,\).*\(1, 2\)"):
        attend(q, k, v, scale=1.0, sinks=mx.zeros((1, 2)))
    with pytest.raises(TypeError, match=r"sinks must be float32.*int32"):
        attend(q, k, v, scale=1.0, sinks=mx.zeros((2,), dtype=mx.int32))
    with pytest.raises(TypeError, match=r"sinks must be an mlx.core.array, got list"):
        attend(q, k, v, scale=1.0, sinks=[0.0, 0.0])


# ----------------------------------------------------------------------------- transformations

def composed(q, k, v, mask, scale, softcap=0.0):
    """Attention from MLX ops (mask additive, the same math as the reference)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, n_rep, axis=1), mx.repeat(v, n_rep, axis=1)
    s = (q @ k.swapaxes(-1, -2)) * scale
    if softcap:
        s = softcap * mx.tanh(s / softcap)
    return mx.softmax(s + mask, axis=-1) @ v


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_vjp_against_finite_differences(softcap):
    rng = np.random.default_rng(10)
    q, k, v = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in [(1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4)])
    m = np.triu(np.full((3, 5), -np.inf), 3)  # causal with an offset of 2, as an explicit mask
    c = rng.standard_normal((1, 2, 3, 4))
    grads = mx.grad(lambda a, b, w: mx.sum(attend(a, b, w, "causal", scale=0.5, softcap=softcap)
                                           * mx.array(c.astype(np.float32))), argnums=(0, 1, 2))(q, k, v)
    base = [to_numpy(q), to_numpy(k), to_numpy(v)]
    f = lambda xs: np.sum(reference(*xs, mask=m, scale=0.5, softcap=softcap) * c)
    h = 1e-6
    for i, g in enumerate(grads):
        fd = np.zeros_like(base[i])
        for idx in np.ndindex(*base[i].shape):
            plus = [x.copy() for x in base]
            minus = [x.copy() for x in base]
            plus[i][idx] += h
            minus[i][idx] -= h
            fd[idx] = (f(plus) - f(minus)) / (2 * h)
        np.testing.assert_allclose(np.array(g), fd, rtol=1e-3, atol=1e-4)


def test_vjp_and_jvp_match_composed_ops():
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, 1, 4, 2, 6, 8, 16, mx.float32)
    mask = mx.array(rng.standard_normal((6, 8)).astype(np.float32))
    cot = random_array(rng, (1, 4, 6, 16), mx.float32)
    _, ours = mx.vjp(lambda a, b, c, m: attend(a, b, c, m, scale=0.3), [q, k, v, mask], [cot])
    _, theirs = mx.vjp(lambda a, b, c, m: composed(a, b, c, m, 0.3), [q, k, v, mask], [cot])
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-5)
    tangents = [random_array(rng, a.shape, mx.float32) for a in (q, k, v)]
    _, (ours_t,) = mx.jvp(lambda a, b, c: attend(a, b, c, mask, scale=0.3), [q, k, v], tangents)
    _, (theirs_t,) = mx.jvp(lambda a, b, c: composed(a, b, c, mask, 0.3), [q, k, v], tangents)
    np.testing.assert_allclose(np.array(ours_t), np.array(theirs_t), rtol=1e-4, atol=1e-5)


def test_vmap():
    rng = np.random.default_rng(12)
    q = random_array(rng, (3, 1, 4, 5, 16), mx.float32)      # vmapped over axis 0
    k = random_array(rng, (1, 2, 7, 16, 3), mx.float32)      # vmapped over its last axis
    v = random_array(rng, (1, 2, 7, 16), mx.float32)         # shared
    mask = mx.array(rng.standard_normal((3, 5, 7)).astype(np.float32))  # vmapped, broadcast over B and heads
    y = mx.vmap(lambda a, b, m: attend(a, b, v, m, scale=0.25), in_axes=(0, 4, 0))(q, k, mask)
    kn = np.moveaxis(to_numpy(k), 4, 0)
    expected = np.stack([reference(to_numpy(q)[i], kn[i], to_numpy(v), mask=to_numpy(mask)[i], scale=0.25)
                         for i in range(3)])
    check(y, expected, mx.float32)


def test_compile_including_shapeless():
    rng = np.random.default_rng(13)
    f = lambda a, b, c: attend(a, b, c, "causal", scale=0.25) * 2.0
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for t in (3, 9):
            q, k, v = qkv(rng, 1, 2, 1, t, t, 16, mx.float32)
            check(compiled(q, k, v), 2.0 * reference(to_numpy(q), to_numpy(k), to_numpy(v), scale=0.25,
                                                     causal=True), mx.float32)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("shapes, kwargs, exc, match", [
    (((1, 4, 3, 8), (1, 3, 3, 8), (1, 3, 3, 8)), {}, ValueError, r"Hq a multiple of Hk"),
    (((1, 4, 3, 8), (1, 2, 3, 16), (1, 2, 3, 8)), {}, ValueError, r"expected q \(B, Hq, Tq, D\)"),
    (((1, 4, 3, 8), (1, 2, 3, 8), (1, 2, 5, 8)), {}, ValueError, r"expected q"),
    (((4, 3, 8), (2, 3, 8), (2, 3, 8)), {}, ValueError, r"q must be 4-D .*\(4, 3, 8\)"),
    (((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), {"mask": "sliding"}, ValueError, r"'causal'"),
    (((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), {"mask": 3}, TypeError, r"mask must be"),
    (((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), {"softcap": -1.0}, ValueError, r"softcap must be finite and >= 0"),
    (((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), {"scale": "x"}, TypeError, r"scale must be a float"),
])
def test_bad_input_raises_clearly(shapes, kwargs, exc, match):
    q, k, v = (mx.ones(s) for s in shapes)
    kwargs.setdefault("scale", 1.0)
    mask = kwargs.pop("mask", None)
    with pytest.raises(exc, match=match):
        attend(q, k, v, mask, **kwargs)


def test_bad_masks():
    q = k = v = mx.ones((1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3\) does not broadcast.*\(1, 2, 3, 3\)"):
        attend(q, k, v, mx.zeros((4, 3)), scale=1.0)
    with pytest.raises(TypeError, match=r"mask must be a floating .* or bool array, got int32"):
        attend(q, k, v, mx.zeros((3, 3), dtype=mx.int32), scale=1.0)
    with pytest.raises(TypeError, match=r"q must be float32.*int32"):
        attend(mx.ones((1, 2, 3, 8), dtype=mx.int32), k, v, scale=1.0)


def test_gpu_stream():
    """CUDA and Metal run the op; where MLX has no GPU, MLX itself refuses to make a GPU stream."""
    q = k = v = mx.ones((1, 1, 2, 4))
    if mx.cuda.is_available() or mx.metal.is_available():
        check(ops.attention(q, k, v, scale=1.0, stream=mx.gpu), np.ones((1, 1, 2, 4)), mx.float32)
        return
    with pytest.raises(ValueError, match="gpu"):
        ops.attention(q, k, v, scale=1.0, stream=mx.gpu)
