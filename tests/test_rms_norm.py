import itertools

import mlx.core as mx
import numpy as np
import pytest

import mlx_ggml_ext
from mlx_ggml_ext import ops, reference
from harness import DTYPES, assert_close, random_array, to_numpy


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [1, 33, 1025, 4096])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-1])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lead", [(), (3,), (2, 5)], ids=str)
def test_matches_float64_reference(dtype, dim, eps, weighted, lead):
    rng = np.random.default_rng(dim * 7 + len(lead))
    x = random_array(rng, lead + (dim,), dtype, scale=3.0)
    w = random_array(rng, (dim,), dtype) if weighted else None
    y = ops.rms_norm(x, w, eps)
    assert y.shape == x.shape and y.dtype == dtype
    expected = reference.rms_norm(to_numpy(x), None if w is None else to_numpy(w), eps)
    assert_close(y, expected, "rms_norm", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_cpu_kernel_variant(cpu_isa, dtype):
    """The baseline (portable/NEON-shaped) and each x86 variant give the same answer,
    including row lengths that exercise every vector tail."""
    rng = np.random.default_rng(1)
    for dim in [3, 16, 17, 64, 100, 1000]:
        x = random_array(rng, (67, dim), dtype)
        w = random_array(rng, (dim,), dtype)
        y = ops.rms_norm(x, w, 1e-5)
        assert_close(y, reference.rms_norm(to_numpy(x), to_numpy(w), 1e-5), "rms_norm", dtype)


def test_large_multithreaded_input():
    rng = np.random.default_rng(2)
    x = random_array(rng, (1024, 2048), mx.float32)
    w = random_array(rng, (2048,), mx.float32)
    assert_close(ops.rms_norm(x, w), reference.rms_norm(to_numpy(x), to_numpy(w), 1e-6),
                 "rms_norm", mx.float32)


def test_matches_mlx_fast_rms_norm():
    rng = np.random.default_rng(3)
    x = random_array(rng, (4, 7, 256), mx.float32)
    w = random_array(rng, (256,), mx.float32)
    np.testing.assert_allclose(np.array(ops.rms_norm(x, w, 1e-5)),
                               np.array(mx.fast.rms_norm(x, w, 1e-5)), rtol=1e-5, atol=1e-5)


def test_mixed_dtypes_promote():
    rng = np.random.default_rng(4)
    x = random_array(rng, (3, 64), mx.float16)
    w = random_array(rng, (64,), mx.float32)
    y = ops.rms_norm(x, w)
    assert y.dtype == mx.float32
    assert_close(y, reference.rms_norm(to_numpy(x), to_numpy(w), 1e-6), "rms_norm", mx.float32)


@pytest.mark.parametrize("make", [
    lambda x: x.T,                              # transposed
    lambda x: x[::2],                           # strided rows
    lambda x: x[:, 1:],                         # offset columns
    lambda x: mx.broadcast_to(x[:1], x.shape),  # broadcast
], ids=["transposed", "strided", "sliced", "broadcast"])
def test_non_contiguous_inputs(make):
    rng = np.random.default_rng(5)
    x = make(random_array(rng, (64, 64), mx.float32))
    w = random_array(rng, (x.shape[-1],), mx.float32)
    assert_close(ops.rms_norm(x, w), reference.rms_norm(to_numpy(x), to_numpy(w), 1e-6),
                 "rms_norm", mx.float32)


def test_input_is_not_overwritten():
    x = mx.arange(1, 65, dtype=mx.float32).reshape(2, 32)
    before = np.array(x)
    mx.eval(ops.rms_norm(x))
    np.testing.assert_array_equal(np.array(x), before)


def test_empty_rows():
    y = ops.rms_norm(mx.zeros((0, 16)), mx.ones((16,)))
    assert y.shape == (0, 16)


# ----------------------------------------------------------------------------- grads

def composed(x, w, eps):
    """RMSNorm from MLX's own ops, float32 math."""
    xf = x.astype(mx.float32)
    y = xf * mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(mx.float32)


def test_vjp_matches_composed_ops():
    rng = np.random.default_rng(6)
    x = random_array(rng, (2, 3, 48), mx.float32)
    w = random_array(rng, (48,), mx.float32)
    g = random_array(rng, (2, 3, 48), mx.float32)
    _, (gx, gw) = mx.vjp(lambda a, b: ops.rms_norm(a, b, 1e-5), [x, w], [g])
    _, (rx, rw) = mx.vjp(lambda a, b: composed(a, b, 1e-5), [x, w], [g])
    np.testing.assert_allclose(np.array(gx), np.array(rx), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(gw), np.array(rw), rtol=1e-4, atol=1e-5)


def test_grad_against_finite_differences():
    rng = np.random.default_rng(7)
    x = mx.array(rng.standard_normal((3, 9)))
    w = mx.array(rng.standard_normal((9,)))
    c = mx.array(rng.standard_normal((3, 9)).astype(np.float32))

    def loss(a, b):
        return mx.sum(ops.rms_norm(a, b, 1e-3) * c)

    gx, gw = mx.grad(loss, argnums=(0, 1))(x, w)
    xn, wn, cn = np.array(x, np.float64), np.array(w, np.float64), np.array(c, np.float64)
    f = lambda a, b: np.sum(reference.rms_norm(a, b, 1e-3) * cn)
    h = 1e-6
    fd_x = np.zeros_like(xn)
    for i, j in itertools.product(range(3), range(9)):
        d = np.zeros_like(xn); d[i, j] = h
        fd_x[i, j] = (f(xn + d, wn) - f(xn - d, wn)) / (2 * h)
    fd_w = np.array([(f(xn, wn + h * e) - f(xn, wn - h * e)) / (2 * h) for e in np.eye(9)])
    np.testing.assert_allclose(np.array(gx), fd_x, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.array(gw), fd_w, rtol=1e-3, atol=1e-4)


def test_jvp_matches_composed_ops():
    rng = np.random.default_rng(8)
    x, tx = (random_array(rng, (4, 32), mx.float32) for _ in range(2))
    w, tw = (random_array(rng, (32,), mx.float32) for _ in range(2))
    _, (out,) = mx.jvp(lambda a, b: ops.rms_norm(a, b, 1e-5), [x, w], [tx, tw])
    _, (ref,) = mx.jvp(lambda a, b: composed(a, b, 1e-5), [x, w], [tx, tw])
    np.testing.assert_allclose(np.array(out), np.array(ref), rtol=1e-4, atol=1e-5)
    _, (out_x,) = mx.jvp(lambda a: ops.rms_norm(a, w, 1e-5), [x], [tx])
    _, (ref_x,) = mx.jvp(lambda a: composed(a, w, 1e-5), [x], [tx])
    np.testing.assert_allclose(np.array(out_x), np.array(ref_x), rtol=1e-4, atol=1e-5)


def test_bfloat16_grad_dtypes():
    x = mx.ones((2, 8), dtype=mx.bfloat16)
    w = mx.ones((8,), dtype=mx.bfloat16)
    gx, gw = mx.grad(lambda a, b: ops.rms_norm(a, b).astype(mx.float32).sum(), argnums=(0, 1))(x, w)
    assert gx.dtype == mx.bfloat16 and gw.dtype == mx.bfloat16


# ----------------------------------------------------------------------------- vmap / compile

@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_over_x_axes(in_axis):
    rng = np.random.default_rng(9)
    x = random_array(rng, (4, 5, 6), mx.float32)
    w = random_array(rng, (6 if in_axis != 2 else 5,), mx.float32)
    # vmapping the last axis normalizes over what remains
    y = mx.vmap(lambda a: ops.rms_norm(a, w), in_axes=in_axis)(x)
    xm = np.moveaxis(to_numpy(x), in_axis, 0)
    assert_close(y, reference.rms_norm(xm, to_numpy(w), 1e-6), "rms_norm", mx.float32)


def test_vmap_over_batched_weight():
    rng = np.random.default_rng(10)
    x = random_array(rng, (3, 7, 16), mx.float32)
    w = random_array(rng, (3, 16), mx.float32)
    y = mx.vmap(lambda a, b: ops.rms_norm(a, b))(x, w)
    expected = np.stack([reference.rms_norm(to_numpy(x)[i], to_numpy(w)[i], 1e-6) for i in range(3)])
    assert_close(y, expected, "rms_norm", mx.float32)
    # weight batched along its axis 1, x shared
    wt = mx.array(np.ascontiguousarray(to_numpy(w).T).astype(np.float32))
    y2 = mx.vmap(lambda b: ops.rms_norm(x[0], b), in_axes=1)(wt)
    expected2 = np.stack([reference.rms_norm(to_numpy(x)[0], to_numpy(w)[i], 1e-6) for i in range(3)])
    assert_close(y2, expected2, "rms_norm", mx.float32)


def test_nested_vmap_with_batched_weight():
    rng = np.random.default_rng(11)
    x = random_array(rng, (2, 3, 5, 8), mx.float32)
    w = random_array(rng, (2, 3, 8), mx.float32)
    y = mx.vmap(mx.vmap(lambda a, b: ops.rms_norm(a, b)))(x, w)
    xn, wn = to_numpy(x), to_numpy(w)
    expected = np.stack([np.stack([reference.rms_norm(xn[i, j], wn[i, j], 1e-6) for j in range(3)])
                         for i in range(2)])
    assert_close(y, expected, "rms_norm", mx.float32)
    # grads through the vmapped, grouped weight
    g = mx.grad(lambda a, b: mx.vmap(lambda p, q: ops.rms_norm(p, q))(a, b).sum(), argnums=1)(x[0], w[0])
    r = mx.grad(lambda a, b: mx.vmap(lambda p, q: composed(p, q, 1e-6))(a, b).sum(), argnums=1)(x[0], w[0])
    np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4)


def test_compile_including_shapeless():
    rng = np.random.default_rng(12)
    w = random_array(rng, (32,), mx.float32)
    f = lambda a: ops.rms_norm(a, w) * 2.0
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for rows in (3, 9):
            x = random_array(rng, (rows, 32), mx.float32)
            assert_close(compiled(x), 2.0 * reference.rms_norm(to_numpy(x), to_numpy(w), 1e-6),
                         "rms_norm", mx.float32)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args, exc, match", [
    ((mx.ones((4, 8)), mx.ones((7,))), ValueError, r"weight must have shape \(8,\).*\(4, 8\).*\(7,\)"),
    ((mx.ones((4, 8)), mx.ones((1, 8))), ValueError, r"weight must have shape"),
    ((mx.ones((4, 8), dtype=mx.int32), None), TypeError, r"x must be float32.*int32"),
    ((mx.ones((4, 8)), mx.ones((8,), dtype=mx.uint8)), TypeError, r"weight must be float32.*uint8"),
    ((mx.ones((4, 8)), None, -1e-3), ValueError, r"eps must be finite and >= 0"),
    ((mx.ones((4, 8)), None, float("nan")), ValueError, r"eps must be finite"),
    ((mx.array(1.0), None), ValueError, r"at least one dimension.*0-d"),
    ((np.ones((4, 8), np.float32), None), TypeError, r"x must be an mlx.core.array, got ndarray"),
    ((mx.ones((4, 8)), None, "1e-5"), TypeError, r"eps must be a float"),
])
def test_bad_input_raises_clearly(args, exc, match):
    with pytest.raises(exc, match=match):
        ops.rms_norm(*args)


def test_float64_is_rejected():
    with pytest.raises(TypeError, match="float64"):
        ops.rms_norm(mx.ones((2, 4), dtype=mx.float64, stream=mx.cpu))
