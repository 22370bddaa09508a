"""ops.glu against float64 numpy formulas of ggml's swiglu / geglu / geglu_erf / swiglu_oai."""
import math

import mlx.core as mx
import numpy as np
import pytest

import mlx_ggml_ext
from mlx_ggml_ext import ops
from harness import DTYPES, random_array, to_numpy

KINDS = ["swiglu", "geglu", "geglu_erf"]
# One rounding of the output (fp16 / bf16) on top of float32 math a few ulps from exact.
TOL = {mx.float32: 4e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3}


def erf(x):
    return np.vectorize(math.erf)(x)


def erfc(x):
    return np.vectorize(math.erfc)(x)


def activation(kind, g):
    """act(g) in float64: SiLU; GELU with the tanh approximation (as 0.5 g (1 + tanh u) = g sigmoid(2u), which
    has no cancellation for negative g); GELU with erf (through erfc for negative g, likewise)."""
    with np.errstate(over="ignore"):
        if kind == "swiglu":
            return g / (1.0 + np.exp(-g))
        if kind == "geglu":
            u = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)
            return g / (1.0 + np.exp(-2.0 * u))
    return g * np.where(g < 0, 0.5 * erfc(-g / math.sqrt(2.0)), 0.5 * (1.0 + erf(g / math.sqrt(2.0))))


def slope(kind, g):
    """d act / d g in float64, from the textbook forms."""
    if kind == "swiglu":
        s = 1.0 / (1.0 + np.exp(-g))
        return s * (1.0 + g * (1.0 - s))
    if kind == "geglu":
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        t = np.tanh(k * (g + c * g ** 3))
        return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g)
    return 0.5 * (1.0 + erf(g / math.sqrt(2.0))) + g * np.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)


OAI_ALPHA, OAI_LIMIT = 1.702, 7.0  # gpt-oss's constants, ops.glu's defaults


def swiglu_oai(g, u, alpha=OAI_ALPHA, limit=OAI_LIMIT):
    """ggml_swiglu_oai in float64: x = min(g, limit), y = clip(u, -limit, limit), x sigmoid(alpha x) (y + 1)."""
    x = np.minimum(g, limit)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-alpha * x)) * (np.clip(u, -limit, limit) + 1.0)


def swiglu_oai_grads(g, u, alpha=OAI_ALPHA, limit=OAI_LIMIT):
    """(d/dg, d/du) in float64: the clamps pass no derivative past the limits."""
    x = np.minimum(g, limit)
    s = 1.0 / (1.0 + np.exp(-alpha * x))
    d_gate = np.where(g < limit, s * (1.0 + alpha * x * (1.0 - s)), 0.0) * (np.clip(u, -limit, limit) + 1.0)
    return d_gate, np.where(np.abs(u) < limit, x * s, 0.0)


def expected_glu(kind, g, u):
    """ops.glu's result in float64 for any kind (swiglu_oai with its default constants)."""
    return swiglu_oai(g, u) if kind == "swiglu_oai" else activation(kind, g) * u


def assert_close(y, expected, dtype):
    got = to_numpy(y)
    assert got.shape == expected.shape
    err = np.max(np.abs(got - expected)) if got.size else 0.0
    scale = max(np.max(np.abs(expected)) if expected.size else 0.0, 1e-30)
    assert err <= TOL[dtype] * scale, f"{dtype}: max error {err:.3e} > {TOL[dtype]:.1e} * {scale:.3e}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 5, 1000), (1, 8192)], ids=str)
def test_two_arrays_match_float64(kind, dtype, shape):
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    g = random_array(rng, shape, dtype, scale=3.0)
    u = random_array(rng, shape, dtype)
    y = ops.glu(g, u, kind=kind)
    assert y.shape == g.shape and y.dtype == dtype
    assert_close(y, activation(kind, to_numpy(g)) * to_numpy(u), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2,), (3, 34), (2, 3, 2050), (5, 4096)], ids=str)
def test_fused_halves_match_float64(kind, dtype, shape):
    rng = np.random.default_rng(shape[-1])
    x = random_array(rng, shape, dtype, scale=3.0)
    y = ops.glu(x, kind=kind)
    n = shape[-1] // 2
    assert y.shape == shape[:-1] + (n,) and y.dtype == dtype
    xn = to_numpy(x)
    assert_close(y, activation(kind, xn[..., :n]) * xn[..., n:], dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_every_cpu_kernel_variant_and_tails(cpu_isa, kind):
    """Every ISA variant, lengths around each vector width (the tail is computed as a padded vector)."""
    rng = np.random.default_rng(1)
    for cols in [1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 33, 511, 513, 1030]:
        x = random_array(rng, (3, 2 * cols), mx.float32, scale=4.0)
        xn = to_numpy(x)
        assert_close(ops.glu(x, kind=kind), activation(kind, xn[:, :cols]) * xn[:, cols:], mx.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_accuracy_in_ulps(kind):
    """Over [-10, 10] (and SiLU to -80, where its output is still a normal float) the float32 result is within a
    few ulps of the float64 value wherever that is a normal float (docs/fused-ops.md lists the measured maxima).
    The tanh GELU's bound is looser for negative x: its exponent argument 2u grows as x^3 and is itself rounded,
    which costs |2u| * 2^-24 relative (a conditioning of the formula, the same in any float32 evaluation)."""
    lo = -80.0 if kind == "swiglu" else -10.0
    g = np.linspace(lo, 10.0, 100_003).astype(np.float32)
    y = np.array(ops.glu(mx.array(g), mx.ones(g.shape), kind=kind)).astype(np.float64)
    ref = activation(kind, g.astype(np.float64))
    normal = np.abs(ref) > np.finfo(np.float32).tiny
    ulps = np.abs(y - ref)[normal] / np.spacing(np.abs(ref[normal]).astype(np.float32)).astype(np.float64)
    if kind == "geglu":
        two_u = np.abs(2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g.astype(np.float64) ** 3))[normal]
        ulps = ulps / np.maximum(1.0, two_u)
    assert ulps.max() <= 8.0, (kind, ulps.max(), g[normal][np.argmax(ulps)])


@pytest.mark.parametrize("kind", KINDS)
def test_special_values(kind):
    g = mx.array([0.0, -0.0, np.inf, np.nan, 1e-30, -1e-30, 100.0, -200.0], dtype=mx.float32)
    y = np.array(ops.glu(g, mx.ones(g.shape), kind=kind))
    assert y[0] == 0 and y[1] == 0 and y[2] == np.inf and np.isnan(y[3])
    np.testing.assert_allclose(y[4:6], [5e-31, -5e-31], rtol=1e-6)
    assert y[6] == 100.0 and y[7] == 0.0


def test_non_contiguous_and_broadcast_inputs():
    rng = np.random.default_rng(2)
    g = random_array(rng, (40, 24), mx.float32).T          # transposed
    u = mx.broadcast_to(random_array(rng, (1, 40), mx.float32), (24, 40))
    expected = activation("swiglu", to_numpy(g)) * to_numpy(u)
    assert_close(ops.glu(g, u), expected, mx.float32)
    x = random_array(rng, (6, 20), mx.float32)[::2, 2:]    # strided rows, offset columns
    xn = to_numpy(x)
    assert_close(ops.glu(x, kind="geglu"), activation("geglu", xn[:, :9]) * xn[:, 9:], mx.float32)


def test_inputs_are_not_overwritten():
    g = mx.arange(-8, 8, dtype=mx.float32)
    u = mx.ones((16,))
    before = np.array(g)
    mx.eval(ops.glu(g, u))
    np.testing.assert_array_equal(np.array(g), before)


def test_mixed_dtypes_promote():
    rng = np.random.default_rng(3)
    g = random_array(rng, (4, 16), mx.float16)
    u = random_array(rng, (4, 16), mx.float32)
    y = ops.glu(g, u, kind="geglu_erf")
    assert y.dtype == mx.float32
    assert_close(y, activation("geglu_erf", to_numpy(g)) * to_numpy(u), mx.float32)


def test_empty():
    assert ops.glu(mx.zeros((0, 8)), mx.zeros((0, 8))).shape == (0, 8)
    assert ops.glu(mx.zeros((3, 0))).shape == (3, 0)


# ----------------------------------------------------------------------------- transformations

@pytest.mark.parametrize("kind", KINDS)
def test_grads_match_float64_derivative(kind):
    rng = np.random.default_rng(4)
    g = random_array(rng, (3, 17), mx.float32, scale=2.0)
    u = random_array(rng, (3, 17), mx.float32)
    c = random_array(rng, (3, 17), mx.float32)
    dg, du = mx.grad(lambda a, b: mx.sum(ops.glu(a, b, kind=kind) * c), argnums=(0, 1))(g, u)
    gn, un, cn = to_numpy(g), to_numpy(u), to_numpy(c)
    np.testing.assert_allclose(np.array(dg), cn * un * slope(kind, gn), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(du), cn * activation(kind, gn), rtol=1e-4, atol=1e-5)
    # the fused layout's gradient is the two halves side by side
    x = mx.concatenate([g, u], axis=-1)
    dx = mx.grad(lambda a: mx.sum(ops.glu(a, kind=kind) * c))(x)
    np.testing.assert_allclose(np.array(dx), np.concatenate([np.array(dg), np.array(du)], -1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS)
def test_grad_against_finite_differences(kind):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 10)) * 2
    c = rng.standard_normal((2, 5))
    f = lambda a: np.sum(activation(kind, a[:, :5]) * a[:, 5:] * c)
    dx = mx.grad(lambda a: mx.sum(ops.glu(a, kind=kind) * mx.array(c.astype(np.float32))))(
        mx.array(x.astype(np.float32)))
    h = 1e-6
    fd = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = h
        fd[idx] = (f(x + d) - f(x - d)) / (2 * h)
    np.testing.assert_allclose(np.array(dx), fd, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_jvp_both_inputs(kind):
    rng = np.random.default_rng(6)
    g, u, tg, tu = (random_array(rng, (4, 9), mx.float32) for _ in range(4))
    _, (out,) = mx.jvp(lambda a, b: ops.glu(a, b, kind=kind), [g, u], [tg, tu])
    gn, un = to_numpy(g), to_numpy(u)
    expected = slope(kind, gn) * un * to_numpy(tg) + activation(kind, gn) * to_numpy(tu)
    np.testing.assert_allclose(np.array(out), expected, rtol=1e-4, atol=1e-5)
    _, (out_u,) = mx.jvp(lambda b: ops.glu(g, b, kind=kind), [u], [tu])
    np.testing.assert_allclose(np.array(out_u), activation(kind, gn) * to_numpy(tu), rtol=1e-4, atol=1e-5)
    x, tx = mx.concatenate([g, u], -1), mx.concatenate([tg, tu], -1)
    _, (out_x,) = mx.jvp(lambda a: ops.glu(a, kind=kind), [x], [tx])
    np.testing.assert_allclose(np.array(out_x), expected, rtol=1e-4, atol=1e-5)


def test_vmap():
    rng = np.random.default_rng(7)
    g = random_array(rng, (3, 4, 6), mx.float32)
    u = random_array(rng, (4, 3, 6), mx.float32)
    y = mx.vmap(lambda a, b: ops.glu(a, b), in_axes=(0, 1))(g, u)
    expected = activation("swiglu", to_numpy(g)) * np.moveaxis(to_numpy(u), 1, 0)
    assert_close(y, expected, mx.float32)
    shared = random_array(rng, (4, 6), mx.float32)
    y2 = mx.vmap(lambda a: ops.glu(a, shared, kind="geglu"))(g)
    assert_close(y2, activation("geglu", to_numpy(g)) * to_numpy(shared), mx.float32)
    # fused: vmapping the last axis leaves the halves on the remaining last axis
    x = random_array(rng, (4, 10, 5), mx.float32)
    y3 = mx.vmap(lambda a: ops.glu(a), in_axes=2)(x)
    xn = np.moveaxis(to_numpy(x), 2, 0)
    assert_close(y3, activation("swiglu", xn[..., :5]) * xn[..., 5:], mx.float32)


def test_compile_including_shapeless():
    rng = np.random.default_rng(8)
    f = lambda a: ops.glu(a, kind="geglu") * 2.0
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for rows in (3, 9):
            x = random_array(rng, (rows, 32), mx.float32)
            xn = to_numpy(x)
            assert_close(compiled(x), 2.0 * activation("geglu", xn[:, :16]) * xn[:, 16:], mx.float32)


def test_matches_mlx_nn_forms():
    import mlx.nn as nn
    rng = np.random.default_rng(9)
    g, u = random_array(rng, (8, 64), mx.float32), random_array(rng, (8, 64), mx.float32)
    np.testing.assert_allclose(np.array(ops.glu(g, u, kind="geglu")), np.array(nn.gelu_approx(g) * u),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(ops.glu(g, u)), np.array(nn.silu(g) * u), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(ops.glu(g, u, kind="geglu_erf")), np.array(nn.gelu(g) * u),
                               rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((mx.ones((4, 8)), mx.ones((4, 7))), {}, ValueError, r"same shape.*\(4, 8\).*\(4, 7\)"),
    ((mx.ones((4, 8)), mx.ones((8,))), {}, ValueError, r"same shape"),
    ((mx.ones((4, 7)),), {}, ValueError, r"even.*\(4, 7\)"),
    ((mx.array(1.0),), {}, ValueError, r"even"),
    ((mx.ones((4, 8)),), {"kind": "reglu"}, ValueError, r"kind must be 'swiglu', 'geglu', 'geglu_erf' or 'swiglu_oai'"),
    ((mx.ones((4, 8)),), {"alpha": 1.0}, ValueError, r"alpha and limit belong to kind 'swiglu_oai'.*'swiglu'"),
    ((mx.ones((4, 8)),), {"kind": "geglu", "limit": 7.0}, ValueError, r"belong to kind 'swiglu_oai'"),
    ((mx.ones((4, 8)),), {"kind": "swiglu_oai", "limit": 0.0}, ValueError, r"finite limit > 0.*limit = 0"),
    ((mx.ones((4, 8)),), {"kind": "swiglu_oai", "alpha": float("nan")}, ValueError, r"finite alpha"),
    ((mx.ones((4, 8)),), {"kind": "swiglu_oai", "limit": float("inf")}, ValueError, r"finite limit"),
    ((mx.ones((4, 8)),), {"kind": "swiglu_oai", "alpha": "1"}, TypeError, r"alpha must be a float"),
    ((mx.ones((4, 8), dtype=mx.int32),), {}, TypeError, r"x must be float32.*int32"),
    ((mx.ones((4, 8)), mx.ones((4, 8), dtype=mx.uint8)), {}, TypeError, r"up must be float32.*uint8"),
    ((np.ones((4, 8), np.float32),), {}, TypeError, r"gate must be an mlx.core.array, got ndarray"),
    ((mx.ones((4, 8)),), {"kind": 1}, TypeError, r"kind must be a str"),
])
def test_bad_input_raises_clearly(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ops.glu(*args, **kwargs)


# ----------------------------------------------------------------------------- swiglu_oai (gpt-oss)

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_oai_matches_float64_past_both_limits(dtype):
    """Two arrays and the fused layout, values well past +-limit on both inputs, odd lengths (SIMD tails)."""
    rng = np.random.default_rng(10)
    g = random_array(rng, (3, 37), dtype, scale=6.0)
    u = random_array(rng, (3, 37), dtype, scale=6.0)
    gn, un = to_numpy(g), to_numpy(u)
    assert (gn > 7).any() and (gn < -7).any() and (un > 7).any() and (un < -7).any()
    assert_close(ops.glu(g, u, kind="swiglu_oai"), swiglu_oai(gn, un), dtype)
    assert_close(ops.glu(mx.concatenate([g, u], -1), kind="swiglu_oai"), swiglu_oai(gn, un), dtype)
    y = ops.glu(g, u, kind="swiglu_oai", alpha=1.25, limit=3.5)
    assert_close(y, swiglu_oai(gn, un, alpha=1.25, limit=3.5), dtype)


def test_swiglu_oai_long_rows_threads_and_special_values():
    rng = np.random.default_rng(11)
    x = random_array(rng, (2, 2 * 5000 + 2), mx.float32, scale=8.0)
    xn = to_numpy(x)
    assert_close(ops.glu(x, kind="swiglu_oai"), swiglu_oai(xn[:, :5001], xn[:, 5001:]), mx.float32)
    g = mx.array([np.inf, -np.inf, np.nan, 0.0, 3.0], dtype=mx.float32)
    u = mx.array([1.0, 1.0, 1.0, np.inf, -np.inf], dtype=mx.float32)
    y = np.array(ops.glu(g, u, kind="swiglu_oai"))
    # +inf gate clamps to the limit; -inf is -inf * 0 = NaN, as in ggml's x / (1 + e^(-alpha x)) and mlx-lm's
    # form; NaN stays NaN; an infinite up clamps to +-limit
    np.testing.assert_allclose(y[[0, 4]], swiglu_oai(np.array([7.0, 3.0]), np.array([1.0, -7.0])), rtol=1e-6)
    assert np.isnan(y[1]) and np.isnan(y[2]) and y[3] == 0.0


def test_swiglu_oai_grads_vjp_jvp_and_finite_differences():
    rng = np.random.default_rng(12)
    g = random_array(rng, (3, 11), mx.float32, scale=6.0)
    u = random_array(rng, (3, 11), mx.float32, scale=6.0)
    c = random_array(rng, (3, 11), mx.float32)
    gn, un, cn = to_numpy(g), to_numpy(u), to_numpy(c)
    d_gate, d_up = swiglu_oai_grads(gn, un, 1.5, 5.0)
    f = lambda a, b: ops.glu(a, b, kind="swiglu_oai", alpha=1.5, limit=5.0)
    dg, du = mx.grad(lambda a, b: mx.sum(f(a, b) * c), argnums=(0, 1))(g, u)
    np.testing.assert_allclose(np.array(dg), cn * d_gate, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(du), cn * d_up, rtol=1e-4, atol=1e-5)
    dx = mx.grad(lambda a: mx.sum(ops.glu(a, kind="swiglu_oai", alpha=1.5, limit=5.0) * c))(mx.concatenate([g, u], -1))
    np.testing.assert_allclose(np.array(dx), np.concatenate([np.array(dg), np.array(du)], -1), rtol=1e-6)
    tg, tu = random_array(rng, (3, 11), mx.float32), random_array(rng, (3, 11), mx.float32)
    _, (out,) = mx.jvp(f, [g, u], [tg, tu])
    np.testing.assert_allclose(np.array(out), d_gate * to_numpy(tg) + d_up * to_numpy(tu), rtol=1e-4, atol=1e-5)
    # the float64 derivative itself against central differences of the float64 formula (no point near a limit)
    h = 1e-6
    far = (np.abs(gn - 5.0) > 1e-3) & (np.abs(np.abs(un) - 5.0) > 1e-3)
    fd_g = (swiglu_oai(gn + h, un, 1.5, 5.0) - swiglu_oai(gn - h, un, 1.5, 5.0)) / (2 * h)
    fd_u = (swiglu_oai(gn, un + h, 1.5, 5.0) - swiglu_oai(gn, un - h, 1.5, 5.0)) / (2 * h)
    np.testing.assert_allclose(d_gate[far], fd_g[far], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d_up[far], fd_u[far], rtol=1e-5, atol=1e-6)


def test_swiglu_oai_vmap_compile_and_distinct_constants():
    rng = np.random.default_rng(13)
    g = random_array(rng, (3, 4, 6), mx.float32, scale=6.0)
    u = random_array(rng, (4, 3, 6), mx.float32, scale=6.0)
    y = mx.vmap(lambda a, b: ops.glu(a, b, kind="swiglu_oai"), in_axes=(0, 1))(g, u)
    assert_close(y, swiglu_oai(to_numpy(g), np.moveaxis(to_numpy(u), 1, 0)), mx.float32)
    # two limits in one compiled graph: the primitives must not be merged as equivalent
    f = lambda a: ops.glu(a, kind="swiglu_oai", limit=2.0) + ops.glu(a, kind="swiglu_oai", limit=6.0)
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for rows in (2, 5):
            x = random_array(rng, (rows, 16), mx.float32, scale=6.0)
            xn = to_numpy(x)
            expected = sum(swiglu_oai(xn[:, :8], xn[:, 8:], limit=lim) for lim in (2.0, 6.0))
            assert_close(compiled(x), expected, mx.float32)


def test_swiglu_oai_matches_mlx_lm():
    from mlx_lm.models.activations import swiglu_oai as mlx_lm_swiglu_oai
    rng = np.random.default_rng(14)
    g, u = random_array(rng, (4, 64), mx.float32, scale=6.0), random_array(rng, (4, 64), mx.float32, scale=6.0)
    np.testing.assert_allclose(np.array(ops.glu(g, u, kind="swiglu_oai")), np.array(mlx_lm_swiglu_oai(g, u)),
                               rtol=1e-5, atol=1e-5)
