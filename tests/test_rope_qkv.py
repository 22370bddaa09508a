"""ops.rope_qkv: a fused q/k/v row split into heads, q and k rotated, against the SPEC's numpy rope (reference.rope)
applied head group by head group. Runs on the device of MLX_GGML_EXT_DEVICE (the Metal kernel has run only in the
emulator: tests/test_metal_emulation_rope_qkv.py)."""

import itertools

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import ops, reference
from conftest import DEVICE
from harness import DTYPES, assert_close, random_array, to_numpy

YARN = dict(freq_scale=0.25, ext_factor=0.75, attn_factor=1.3, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=4096)


def expected_heads(qkv: np.ndarray, positions, heads, kv_heads, n_dims, mode, with_v=True, norms=None, eps=1e-6,
                   **kw):
    """float64 q, k(, v) of the unfused math: reshape to (..., T, H, D), rms-norm q and k per head with `norms`
    (q weight, k weight) if given, rope on q and k, heads first."""
    total = heads + (2 if with_v else 1) * kv_heads
    x = qkv.reshape(qkv.shape[:-1] + (total, qkv.shape[-1] // total))
    q, k = x[..., :heads, :], x[..., heads:heads + kv_heads, :]
    if norms is not None:
        q, k = (a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)
                for a, w in zip((q, k), norms))
    q = reference.rope(q, positions, n_dims, mode, **kw)
    k = reference.rope(k, positions, n_dims, mode, **kw)
    return [np.swapaxes(a, -3, -2) for a in (q, k, x[..., heads + kv_heads:, :])[:3 if with_v else 2]]


def check(got, qkv, positions, heads, kv_heads, n_dims, mode, dtype=mx.float32, **kw):
    expected = expected_heads(to_numpy(qkv), np.asarray(positions), heads, kv_heads, n_dims, mode, **kw)
    assert len(got) == len(expected)
    for name, a, e in zip("qkv", got, expected):
        assert a.dtype == dtype and a.shape == e.shape, (name, a.dtype, a.shape, e.shape)
        assert_close(a, e, "rope", dtype)


CASES = [  # lead axes, T, heads, kv_heads, D, n_dims
    ((), 1, 8, 2, 64, 64),      # one decode token (grouped-query attention)
    ((1,), 1, 32, 8, 64, 64),   # the Llama-1B shape at decode
    ((2,), 7, 4, 4, 128, 128),  # prefill rows, multi-head
    ((2, 3), 5, 3, 1, 80, 32),  # partial rotation, two leading axes
    ((1,), 9, 2, 1, 18, 18),    # a head size off the vector width
]


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_the_unfused_spec_math(mode, case):
    lead, tokens, heads, kv_heads, dim, n_dims = case
    rng = np.random.default_rng(sum(case[1:]))
    qkv = random_array(rng, lead + (tokens, (heads + 2 * kv_heads) * dim), mx.float32)
    positions = rng.integers(0, 100_000, tokens).astype(np.int32)
    check(ops.rope_qkv(qkv, mx.array(positions), heads, kv_heads, n_dims, mode), qkv, positions, heads, kv_heads,
          n_dims, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_yarn_freq_factors_and_dtypes(dtype):
    rng = np.random.default_rng(3)
    qkv = random_array(rng, (2, 6, (4 + 2 * 2) * 64), dtype)
    positions = rng.integers(0, 50_000, 6).astype(np.int32)
    factors = rng.uniform(0.5, 8.0, 16).astype(np.float32)
    got = ops.rope_qkv(qkv, mx.array(positions), 4, 2, 32, "neox", freq_factors=mx.array(factors), **YARN)
    check(got, qkv, positions, 4, 2, 32, "neox", dtype, freq_factors=factors, **YARN)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_a_long_prefill(dtype):
    """Past 4 MB the CPU kernel writes rows with streaming stores (float32 streamed whole, 16-bit formats staged):
    the copied v heads take those paths too."""
    rng = np.random.default_rng(13)
    qkv = random_array(rng, (1, 2100, (8 + 2 * 4) * 64), dtype)  # 4.3 MB in float16
    positions = np.arange(100, 2200, dtype=np.int32)
    check(ops.rope_qkv(qkv, 100, 8, 4, 64, "neox"), qkv, positions, 8, 4, 64, "neox", dtype)


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_q_and_k_without_v(mode):
    """with_v=False: a product of q and k alone (v a product of its own)."""
    rng = np.random.default_rng(14)
    qk = random_array(rng, (1, 3, (8 + 2) * 64), mx.float32)
    positions = rng.integers(0, 9000, 3).astype(np.int32)
    got = ops.rope_qkv(qk, mx.array(positions), 8, 2, 64, mode, with_v=False)
    check(got, qk, positions, 8, 2, 64, mode, with_v=False)
    _, (grad,) = mx.vjp(lambda a: ops.rope_qkv(a, mx.array(positions), 8, 2, 64, mode, with_v=False), [qk],
                        [mx.ones((1, 8, 3, 64)), mx.ones((1, 2, 3, 64))])
    assert grad.shape == qk.shape
    outs = mx.vmap(lambda a: ops.rope_qkv(a, mx.array(positions), 8, 2, 64, mode, with_v=False))(qk[None])
    check([o[0] for o in outs], qk, positions, 8, 2, 64, mode, with_v=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [((1,), 1, 8, 2, 128, 128, "neox", True), ((2,), 5, 4, 1, 256, 256, "neox", False),
                                  ((), 3, 2, 2, 80, 32, "normal", True)], ids=str)
def test_per_head_norms(dtype, case):
    """Qwen 3's / Gemma 3's q_norm and k_norm: each head rms-normed with its weight before the rotation (the
    partial rotation's unrotated part normed too); v untouched."""
    lead, tokens, heads, kv_heads, dim, n_dims, mode, with_v = case
    rng = np.random.default_rng(tokens + dim)
    qkv = random_array(rng, lead + (tokens, (heads + (2 if with_v else 1) * kv_heads) * dim), dtype, scale=3.0)
    positions = rng.integers(0, 20_000, tokens).astype(np.int32)
    norms = [rng.uniform(0.5, 1.5, dim).astype(np.float32) for _ in range(2)]
    got = ops.rope_qkv(qkv, mx.array(positions), heads, kv_heads, n_dims, mode, with_v=with_v,
                       q_norm=mx.array(norms[0]), k_norm=mx.array(norms[1]), norm_eps=1e-5)
    check(got, qkv, positions, heads, kv_heads, n_dims, mode, dtype, with_v=with_v, norms=norms, eps=1e-5)
    if dtype == mx.float32:  # and the unfused ops: rms_norm then rope
        part = qkv.reshape(lead + (tokens, -1, dim))[..., :heads, :]
        want = ops.rope(ops.rms_norm(part, mx.array(norms[0]), 1e-5), mx.array(positions), n_dims, mode)
        np.testing.assert_allclose(np.array(got[0]), np.array(want.swapaxes(-3, -2)), rtol=0, atol=2e-5)


def test_per_head_norm_gradients_and_vmap():
    """The norm weights' vjp against finite differences of the float64 math; vmap with norms."""
    rng = np.random.default_rng(15)
    qkv = random_array(rng, (1, 2, (2 + 2 * 1) * 16), mx.float32)
    positions = np.array([5, 77], np.int32)
    qw, kw = (rng.uniform(0.5, 1.5, 16) for _ in range(2))
    cot = [random_array(rng, s, mx.float32) for s in [(1, 2, 2, 16), (1, 1, 2, 16), (1, 1, 2, 16)]]
    f = lambda a, q, k: ops.rope_qkv(a, mx.array(positions), 2, 1, 16, "neox", q_norm=q, k_norm=k)
    _, (gx, gq, gk) = mx.vjp(f, [qkv, mx.array(qw.astype(np.float32)), mx.array(kw.astype(np.float32))], cot)

    def loss(q, k):
        outs = expected_heads(to_numpy(qkv), positions, 2, 1, 16, "neox", norms=(q, k))
        return sum(np.sum(o * to_numpy(c)) for o, c in zip(outs, cot))
    eps = 1e-5
    for grad, which in ((gq, 0), (gk, 1)):
        fd = []
        for e in np.eye(16):
            w = [qw, kw]
            plus, minus = list(w), list(w)
            plus[which], minus[which] = w[which] + eps * e, w[which] - eps * e
            fd.append((loss(*plus) - loss(*minus)) / (2 * eps))
        np.testing.assert_allclose(np.array(grad), fd, rtol=2e-3, atol=2e-3 * np.max(np.abs(fd)))
    assert gx.shape == qkv.shape
    outs = mx.vmap(lambda a: f(a, mx.array(qw.astype(np.float32)), mx.array(kw.astype(np.float32))))(qkv[None])
    check([o[0] for o in outs], qkv, positions, 2, 1, 16, "neox", norms=(qw, kw))


def test_the_same_numbers_as_ops_rope_and_an_int_offset():
    """Bit for bit what ops.rope gives on each head group (the same kernel), and an int offset as arange."""
    rng = np.random.default_rng(4)
    qkv = random_array(rng, (1, 3, (6 + 2 * 3) * 32), mx.float32)
    q, k, v = ops.rope_qkv(qkv, 41, 6, 3, 32, "normal", freq_base=500000.0)
    heads = qkv.reshape(1, 3, 12, 32)
    for got, part in ((q, heads[:, :, :6]), (k, heads[:, :, 6:9])):
        want = ops.rope(part, 41, 32, "normal", freq_base=500000.0).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(np.array(got), np.array(want))
    np.testing.assert_array_equal(np.array(v), np.array(heads[:, :, 9:].transpose(0, 2, 1, 3)))


def test_outputs_feed_attention_and_the_input_stays():
    """The outputs are views of one buffer: consumers (a cache write, attention, a copy) read them right, and
    qkv held by the caller is not overwritten (it is donated only when nothing else holds it)."""
    rng = np.random.default_rng(5)
    qkv = random_array(rng, (1, 4, (4 + 2 * 2) * 16), mx.float32)
    before = np.array(qkv)
    q, k, v = ops.rope_qkv(qkv, 0, 4, 2, 16, "neox")
    cache = mx.zeros((1, 2, 8, 16))
    cache[..., 2:6, :] = k
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25)
    qe, ke, ve = expected_heads(before, np.arange(4), 4, 2, 16, "neox")
    np.testing.assert_allclose(np.array(cache[..., 2:6, :]), ke, atol=1e-5)
    s = np.einsum("bhtd,bhsd->bhts", qe, np.repeat(ke, 2, axis=1)) * 0.25
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(np.array(out), (w / w.sum(-1, keepdims=True)) @ np.repeat(ve, 2, axis=1), atol=1e-5)
    np.testing.assert_allclose(np.array(mx.contiguous(q.swapaxes(1, 2))), np.swapaxes(qe, 1, 2), atol=1e-5)
    np.testing.assert_array_equal(np.array(qkv), before)


def test_non_contiguous_qkv():
    rng = np.random.default_rng(6)
    wide = random_array(rng, (3, 2, 5, (2 + 2 * 1) * 32), mx.float32)
    qkv = wide.transpose(1, 0, 2, 3)[:, ::2]  # (2, 2, 5, F), strided
    positions = rng.integers(0, 1000, 5).astype(np.int32)
    check(ops.rope_qkv(qkv, mx.array(positions)[::1], 2, 1, 32, "normal"), qkv, positions, 2, 1, 32, "normal")


def test_empty_shapes():
    q, k, v = ops.rope_qkv(mx.zeros((2, 0, 4 * 8)), mx.zeros((0,), mx.int32), 2, 1, 8)
    assert (q.shape, k.shape, v.shape) == ((2, 2, 0, 8), (2, 1, 0, 8), (2, 1, 0, 8))
    q, k, v = ops.rope_qkv(mx.zeros((0, 3, 4 * 8)), 0, 2, 1, 8)
    mx.eval(q, k, v)
    assert q.shape == (0, 2, 3, 8) and v.shape == (0, 1, 3, 8)


# ----------------------------------------------------------------------------- transformations

def _inner(a, b):
    return float(np.sum(to_numpy(a) * to_numpy(b)))


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_vjp_is_the_transpose(mode):
    """<J x, g> = <x, J^T g> for the op's forward (checked against numpy above), and J^T g against the inverse
    rotation of numpy's rope."""
    rng = np.random.default_rng(7)
    qkv = random_array(rng, (2, 5, (3 + 2 * 1) * 24), mx.float32)
    positions = mx.array(rng.integers(0, 5000, 5).astype(np.int32))
    outs, (grad,) = mx.vjp(lambda a: ops.rope_qkv(a, positions, 3, 1, 20, mode, **YARN), [qkv],
                           [random_array(rng, s, mx.float32) for s in [(2, 3, 5, 24), (2, 1, 5, 24), (2, 1, 5, 24)]])
    cot = [random_array(rng, o.shape, mx.float32) for o in outs]
    outs, (grad,) = mx.vjp(lambda a: ops.rope_qkv(a, positions, 3, 1, 20, mode, **YARN), [qkv], cot)
    lhs = sum(_inner(o, c) for o, c in zip(outs, cot))
    assert abs(lhs - _inner(qkv, grad)) <= 1e-4 * abs(lhs) + 1e-4
    g = [np.swapaxes(to_numpy(c), -3, -2) for c in cot]  # (..., T, H, D)
    back = [reference.rope(g[0], np.array(positions), 20, mode, inverse=True, **YARN),
            reference.rope(g[1], np.array(positions), 20, mode, inverse=True, **YARN), g[2]]
    assert_close(grad, np.concatenate(back, axis=-2).reshape(2, 5, -1), "rope", mx.float32)


def test_freq_factors_gradient_matches_finite_differences():
    rng = np.random.default_rng(8)
    qkv = random_array(rng, (1, 3, (2 + 2 * 1) * 16), mx.float32)
    positions = np.array([3, 40, 900], np.int32)
    factors = rng.uniform(1.0, 3.0, 8)
    cot = [random_array(rng, s, mx.float32) for s in [(1, 2, 3, 16), (1, 1, 3, 16), (1, 1, 3, 16)]]
    f = lambda a, ff: ops.rope_qkv(a, mx.array(positions), 2, 1, 16, "neox", freq_factors=ff)
    _, (_, gf) = mx.vjp(f, [qkv, mx.array(factors.astype(np.float32))], cot)

    def loss(ff):  # float64, exact angles
        outs = expected_heads(to_numpy(qkv), positions, 2, 1, 16, "neox", freq_factors=ff, angle_dtype=np.float64)
        return sum(np.sum(o * to_numpy(c)) for o, c in zip(outs, cot))
    eps = 1e-5
    fd = np.array([(loss(factors + eps * e) - loss(factors - eps * e)) / (2 * eps) for e in np.eye(8)])
    np.testing.assert_allclose(np.array(gf), fd, rtol=2e-3, atol=2e-3 * np.max(np.abs(fd)))


def test_jvp_is_the_op_on_the_tangent():
    rng = np.random.default_rng(9)
    qkv, tangent = (random_array(rng, (2, 4, (2 + 2 * 2) * 16), mx.float32) for _ in range(2))
    positions = mx.array(rng.integers(0, 100, 4).astype(np.int32))
    _, jv = mx.jvp(lambda a: ops.rope_qkv(a, positions, 2, 2, 16, "normal"), [qkv], [tangent])
    check(jv, tangent, np.array(positions), 2, 2, 16, "normal")
    with pytest.raises(ValueError, match="positions are integers"):
        mx.vjp(lambda a, p: ops.rope_qkv(a, p, 2, 2, 16), [qkv, positions], [mx.zeros((2, 2, 4, 16))] * 1 +
               [mx.zeros((2, 2, 4, 16))] * 2)


def test_vmap_over_qkv_and_positions():
    rng = np.random.default_rng(10)
    qkv = random_array(rng, (3, 4, (2 + 2 * 1) * 16), mx.float32)
    positions = rng.integers(0, 1000, (3, 4)).astype(np.int32)
    p0 = mx.array(positions[0])
    for in_axis, data in ((0, qkv), (1, qkv.transpose(1, 0, 2))):
        outs = mx.vmap(lambda a: ops.rope_qkv(a, p0, 2, 1, 16, "neox"), in_axes=in_axis)(data)
        check(outs, qkv, positions[0], 2, 1, 16, "neox")
    outs = mx.vmap(lambda a, p: ops.rope_qkv(a, p, 2, 1, 16, "neox"))(qkv, mx.array(positions))
    for b in range(3):
        check([o[b] for o in outs], qkv[b], positions[b], 2, 1, 16, "neox")


def test_compile_shapeless_follows_the_token_count():
    rng = np.random.default_rng(11)
    f = mx.compile(lambda a, p: ops.rope_qkv(a, p, 4, 2, 32, "neox"), shapeless=True)
    for tokens in (1, 6, 3):
        qkv = random_array(rng, (1, tokens, 8 * 32), mx.float32)
        positions = rng.integers(0, 9000, tokens).astype(np.int32)
        check(f(qkv, mx.array(positions)), qkv, positions, 4, 2, 32, "neox")
    with pytest.raises(ValueError, match="positions must have shape"):
        mx.eval(f(random_array(rng, (1, 5, 8 * 32), mx.float32), mx.zeros((4,), mx.int32)))


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, error, match", [
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64), mx.int32), 0, 2, 1, 16), TypeError,
     "qkv must be float32, float16 or bfloat16"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 62)), 0, 2, 1, 16), ValueError,
     r"not a multiple of \(heads \+ 2\*kv_heads\)"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 4 * 15)), 0, 2, 1, 14), ValueError, "must be even"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 32), ValueError, "n_dims must be even and in"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 0, 1, 16), ValueError, "heads and kv_heads must be > 0"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, -2, 6, 16), ValueError, "heads and kv_heads must be > 0"),
    (lambda: ops.rope_qkv(mx.zeros((64,)), 0, 2, 1, 16), ValueError, "qkv must be"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), mx.zeros((3,), mx.int32), 2, 1, 16), ValueError,
     "positions must have shape"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), mx.zeros((2,)), 2, 1, 16), TypeError, "positions must be int32"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2.0, 1, 16), TypeError, "heads"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, freq_factors=mx.zeros((4,))), ValueError,
     "freq_factors must have shape"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 2**31 - 1, 2, 1, 16), ValueError, "overflows int32"),
    (lambda: ops.rope_qkv(np.zeros((1, 2, 64)), 0, 2, 1, 16), TypeError, "qkv"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, with_v=False), ValueError, r"\(heads \+ kv_heads\)"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, with_v=1), TypeError, "with_v must be a bool"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, q_norm=mx.ones((16,))), ValueError, "go together"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, q_norm=mx.ones((8,)), k_norm=mx.ones((16,))), ValueError,
     r"q_norm must have shape \(D,\) = \(16,\)"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, q_norm=mx.ones((16,), mx.int32),
                          k_norm=mx.ones((16,))), TypeError, "q_norm must be float32"),
    (lambda: ops.rope_qkv(mx.zeros((1, 2, 64)), 0, 2, 1, 16, q_norm=mx.ones((16,)), k_norm=mx.ones((16,)),
                          norm_eps=-1.0), ValueError, "norm_eps must be finite"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_raises_clearly(call, error, match):
    with pytest.raises(error, match=match):
        mx.eval(*call())


def test_on_the_default_device_stream():
    """The op on the stream of MLX_GGML_EXT_DEVICE given explicitly (the CPU, CUDA or Metal kernel)."""
    rng = np.random.default_rng(12)
    qkv = random_array(rng, (1, 2, 4 * 16), mx.float32)
    check(ops.rope_qkv(qkv, 5, 2, 1, 16, stream=DEVICE), qkv, np.arange(5, 7), 2, 1, 16, "normal")
