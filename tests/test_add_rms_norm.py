"""ops.add_rms_norm: the residual add fused with rms_norm, against float64 references written from the math and
against the two ops it replaces. The device comes from the environment (conftest), as for every op."""
import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import ops, reference
from harness import DTYPES, assert_close, random_array, to_numpy


def rounded_sum(x, r, dtype):
    """x + r in float64, rounded once to the output dtype (what an add op stores)."""
    exact = to_numpy(x).astype(np.float64) + to_numpy(r).astype(np.float64)
    return to_numpy(mx.array(exact.astype(np.float32)).astype(dtype)).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [1, 33, 640, 2051, 4096])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lead", [(), (3,), (2, 5)], ids=str)
def test_matches_float64_reference(dtype, dim, weighted, lead):
    rng = np.random.default_rng(dim * 5 + len(lead))
    x = random_array(rng, lead + (dim,), dtype, scale=3.0)
    r = random_array(rng, lead + (dim,), dtype)
    w = random_array(rng, (dim,), dtype) if weighted else None
    h, y = ops.add_rms_norm(x, r, w, 1e-5)
    assert h.shape == y.shape == x.shape and h.dtype == y.dtype == dtype
    h_ref = rounded_sum(x, r, dtype)
    # h is one correctly rounded add: equal to the reference's rounding of the float32 sum
    np.testing.assert_array_equal(to_numpy(h).astype(np.float64), h_ref)
    assert_close(y, reference.rms_norm(h_ref, None if w is None else to_numpy(w), 1e-5), "rms_norm", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_same_numbers_as_add_then_rms_norm(dtype):
    rng = np.random.default_rng(1)
    x = random_array(rng, (7, 300), dtype)
    r = random_array(rng, (7, 300), dtype)
    w = random_array(rng, (300,), dtype)
    h, y = ops.add_rms_norm(x, r, w, 1e-6)
    np.testing.assert_array_equal(to_numpy(h), to_numpy(x + r))
    np.testing.assert_array_equal(to_numpy(y), to_numpy(ops.rms_norm(x + r, w, 1e-6)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_cpu_kernel_variant(cpu_isa, dtype):
    """The baseline and each x86 variant, with row lengths that reach every vector tail."""
    rng = np.random.default_rng(2)
    for dim in [3, 16, 17, 64, 100, 1000]:
        x = random_array(rng, (67, dim), dtype)
        r = random_array(rng, (67, dim), dtype)
        w = random_array(rng, (dim,), dtype)
        h, y = ops.add_rms_norm(x, r, w, 1e-5)
        h_ref = rounded_sum(x, r, dtype)
        np.testing.assert_array_equal(to_numpy(h).astype(np.float64), h_ref)
        assert_close(y, reference.rms_norm(h_ref, to_numpy(w), 1e-5), "rms_norm", dtype)


def test_mixed_dtypes_promote():
    rng = np.random.default_rng(3)
    x = random_array(rng, (3, 64), mx.float16)
    r = random_array(rng, (3, 64), mx.bfloat16)
    h, y = ops.add_rms_norm(x, r, None)
    assert h.dtype == y.dtype == mx.float32


@pytest.mark.parametrize("make", [lambda a: a.T, lambda a: a[::2], lambda a: a[:, 1:]],
                         ids=["transposed", "strided", "sliced"])
def test_non_contiguous_inputs(make):
    rng = np.random.default_rng(4)
    x = make(random_array(rng, (64, 64), mx.float32))
    r = make(random_array(rng, (64, 64), mx.float32))
    w = random_array(rng, (x.shape[-1],), mx.float32)
    h, y = ops.add_rms_norm(x, r, w)
    h_ref = rounded_sum(x, r, mx.float32)
    assert_close(y, reference.rms_norm(h_ref, to_numpy(w), 1e-6), "rms_norm", mx.float32)


def test_inputs_are_not_overwritten():
    x = mx.arange(1, 65, dtype=mx.float32).reshape(2, 32)
    r = mx.arange(65, 129, dtype=mx.float32).reshape(2, 32)
    before = np.array(x), np.array(r)
    mx.eval(ops.add_rms_norm(x, r))
    np.testing.assert_array_equal(np.array(x), before[0])
    np.testing.assert_array_equal(np.array(r), before[1])


def test_empty_rows():
    h, y = ops.add_rms_norm(mx.zeros((0, 16)), mx.zeros((0, 16)), mx.ones((16,)))
    assert h.shape == y.shape == (0, 16)


def unfused(x, r, w):
    h = x + r
    return h, ops.rms_norm(h, w, 1e-5)


def test_vjp_matches_the_unfused_ops():
    rng = np.random.default_rng(5)
    args = [random_array(rng, (2, 3, 48), mx.float32), random_array(rng, (2, 3, 48), mx.float32),
            random_array(rng, (48,), mx.float32)]
    cot = [random_array(rng, (2, 3, 48), mx.float32), random_array(rng, (2, 3, 48), mx.float32)]
    _, fused = mx.vjp(lambda a, b, c: ops.add_rms_norm(a, b, c, 1e-5), args, cot)
    _, plain = mx.vjp(unfused, args, cot)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    # one output's cotangent only (the other is zero): the norm's gradient through h, plus h's
    only_y = mx.grad(lambda a: ops.add_rms_norm(a, args[1], args[2], 1e-5)[1].sum())(args[0])
    np.testing.assert_allclose(np.array(only_y),
                               np.array(mx.grad(lambda a: unfused(a, args[1], args[2])[1].sum())(args[0])),
                               rtol=1e-5, atol=1e-6)


def test_grad_against_finite_differences():
    rng = np.random.default_rng(6)
    x = random_array(rng, (2, 16), mx.float32)
    r = random_array(rng, (2, 16), mx.float32)
    w = random_array(rng, (16,), mx.float32)
    loss = lambda a: (ops.add_rms_norm(a, r, w)[1] * mx.arange(16, dtype=mx.float32)).sum()
    g = np.array(mx.grad(loss)(x))
    x64 = np.array(x).astype(np.float64)
    numeric = np.zeros_like(x64)
    for i in np.ndindex(x64.shape):
        for sign in (1, -1):
            xp = x64.copy()
            xp[i] += sign * 1e-3
            numeric[i] += sign * float(loss(mx.array(xp.astype(np.float32)))) / 2e-3
    np.testing.assert_allclose(g, numeric, rtol=2e-2, atol=2e-2)


def test_jvp_matches_the_unfused_ops():
    rng = np.random.default_rng(7)
    args = [random_array(rng, (3, 40), mx.float32) for _ in range(2)] + [random_array(rng, (40,), mx.float32)]
    tans = [random_array(rng, a.shape, mx.float32) for a in args]
    _, fused = mx.jvp(lambda a, b, c: ops.add_rms_norm(a, b, c, 1e-5), args, tans)
    _, plain = mx.jvp(unfused, args, tans)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


VMAP_CASES = {  # in_axes: shapes of x and residual (each slice is (3, 24))
    (0, 0): ((4, 3, 24), (4, 3, 24)),
    (1, None): ((3, 4, 24), (3, 24)),
    (None, 2): ((3, 24), (3, 24, 2)),
}


@pytest.mark.parametrize("axes", list(VMAP_CASES), ids=str)
def test_vmap(axes):
    rng = np.random.default_rng(8)
    w = random_array(rng, (24,), mx.float32)
    x, r = (random_array(rng, shape, mx.float32) for shape in VMAP_CASES[axes])
    h, y = mx.vmap(lambda a, b: ops.add_rms_norm(a, b, w, 1e-5), in_axes=axes)(x, r)
    eh, ey = mx.vmap(lambda a, b: unfused(a, b, w), in_axes=axes)(x, r)
    np.testing.assert_array_equal(np.array(h), np.array(eh))
    np.testing.assert_allclose(np.array(y), np.array(ey), rtol=1e-5, atol=1e-6)


def test_compile_including_shapeless():
    rng = np.random.default_rng(9)
    w = random_array(rng, (32,), mx.float32)
    f = lambda a, b: ops.add_rms_norm(a, b, w)
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for rows in (3, 9):
            x, r = random_array(rng, (rows, 32), mx.float32), random_array(rng, (rows, 32), mx.float32)
            h, y = compiled(x, r)
            assert_close(y, reference.rms_norm(rounded_sum(x, r, mx.float32), to_numpy(w), 1e-6), "rms_norm",
                         mx.float32)


@pytest.mark.parametrize("args, exc, match", [
    ((mx.ones((4, 8)), mx.ones((4, 7))), ValueError, r"same shape.*\(4, 8\).*\(4, 7\)"),
    ((mx.ones((4, 8)), mx.ones((1, 8))), ValueError, r"same shape"),
    ((mx.ones((4, 8)), mx.ones((4, 8)), mx.ones((7,))), ValueError, r"weight must have shape \(8,\)"),
    ((mx.ones((4, 8), dtype=mx.int32), mx.ones((4, 8))), TypeError, r"x must be float32.*int32"),
    ((mx.ones((4, 8)), mx.ones((4, 8), dtype=mx.uint8)), TypeError, r"residual must be float32.*uint8"),
    ((mx.ones((4, 8)), mx.ones((4, 8)), None, -1.0), ValueError, r"eps must be finite and >= 0"),
    ((mx.array(1.0), mx.array(1.0)), ValueError, r"at least one dimension"),
    ((mx.ones((4, 8)), np.ones((4, 8), np.float32)), TypeError, r"residual must be an mlx.core.array"),
    ((mx.ones((4, 8)), mx.ones((4, 8)), None, "1e-5"), TypeError, r"eps must be a float"),
])
def test_bad_input_raises_clearly(args, exc, match):
    with pytest.raises(exc, match=match):
        ops.add_rms_norm(*args)
