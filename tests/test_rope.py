import itertools

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import ops, reference
from harness import DTYPES, assert_close, nmse, random_array, to_numpy

MODES = ["normal", "neox"]
YARN = {"n_ctx_orig": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def random_positions(rng, tokens, high=100_000):
    return rng.integers(0, high, tokens).astype(np.int32)


def random_factors(rng, n_dims):
    return rng.uniform(0.5, 8.0, n_dims // 2).astype(np.float32)


def run_rope(x, positions, n_dims, mode, factors=None, **kw):
    """ops.rope on numpy/mx inputs and reference.rope on the same values."""
    ff = None if factors is None else mx.array(factors)
    got = ops.rope(x, mx.array(positions), n_dims, mode, freq_factors=ff, **kw)
    expected = reference.rope(to_numpy(x), positions, n_dims, mode, freq_factors=factors, **kw)
    return got, expected


def grid_cases():
    for mode, dim in itertools.product(MODES, [64, 80, 128]):
        for n_dims in sorted({dim, dim // 2, 32}):
            yield mode, dim, n_dims


# ----------------------------------------------------------------------------- accuracy

@pytest.mark.parametrize("mode, dim, n_dims", list(grid_cases()), ids=str)
def test_float32_grid_matches_spec_formula(mode, dim, n_dims):
    """The issue's grid: freq_scale x (ext_factor, attn_factor) x freq_factors, positions
    random in [0, 1e5): NMSE at most 1e-7 (ggml's own rope tolerance) and the
    per-element bound of the harness."""
    rng = np.random.default_rng(dim * 3 + n_dims + len(mode))
    for freq_scale, (ext_factor, attn_factor), with_factors in itertools.product(
            [1.0, 0.25], [(0.0, 1.0), (0.75, 1.42)], [False, True]):
        x = random_array(rng, (2, 9, 3, dim), mx.float32)
        positions = random_positions(rng, 9)
        factors = random_factors(rng, n_dims) if with_factors else None
        got, expected = run_rope(x, positions, n_dims, mode, factors, freq_scale=freq_scale,
                                 ext_factor=ext_factor, attn_factor=attn_factor, **YARN)
        assert got.dtype == mx.float32 and got.shape == x.shape
        assert nmse(to_numpy(got), expected) <= 1e-7
        assert_close(got, expected, "rope", mx.float32)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dim, n_dims", [(128, 128), (80, 32)])
def test_half_precision_inputs(dtype, mode, dim, n_dims):
    rng = np.random.default_rng(dim + n_dims)
    for ext_factor, with_factors in [(0.0, False), (0.75, True)]:
        x = random_array(rng, (7, 4, dim), dtype)
        positions = random_positions(rng, 7)
        factors = random_factors(rng, n_dims) if with_factors else None
        got, expected = run_rope(x, positions, n_dims, mode, factors, freq_scale=0.25, ext_factor=ext_factor,
                                 attn_factor=1.42, **YARN)
        assert got.dtype == dtype
        assert_close(got, expected, "rope", dtype)
        # the unrotated tail is copied bit for bit
        np.testing.assert_array_equal(to_numpy(got)[..., n_dims:], to_numpy(x)[..., n_dims:])


def test_float32_semantics_versus_exact_math():
    """What following ggml's float32 angle arithmetic costs against exact float64 math:
    at positions up to 1e5 the iterated float32 product is visibly off (NMSE ~1e-6),
    which is why the reference keeps the SPEC's float32 angle; near position 0 both agree."""
    rng = np.random.default_rng(20)
    x = random_array(rng, (64, 2, 128), mx.float32)
    for high, bound in [(100_000, 2e-5), (100, 1e-10)]:
        positions = random_positions(rng, 64, high)
        got = to_numpy(ops.rope(x, mx.array(positions), 128, "normal"))
        exact = reference.rope(to_numpy(x), positions, 128, "normal", angle_dtype=np.float64)
        assert nmse(got, exact) <= bound


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_cpu_kernel_variant(cpu_isa, dtype):
    """Each SIMD variant, with token counts and rotated widths that leave vector tails,
    negative positions and angles beyond the vector range reduction (scalar fallback)."""
    rng = np.random.default_rng(21)
    for (tokens, dim, n_dims), mode in itertools.product(
            [(1, 2, 2), (5, 6, 6), (17, 34, 22), (33, 80, 40), (20, 130, 128), (130, 18, 18)], MODES):
        x = random_array(rng, (2, tokens, 3, dim), dtype)
        positions = rng.integers(-2**31, 2**31 - 1, tokens).astype(np.int32)
        positions[: tokens // 2] = random_positions(rng, tokens // 2)
        factors = random_factors(rng, n_dims)
        got, expected = run_rope(x, positions, n_dims, mode, factors, ext_factor=0.5, **YARN)
        assert_close(got, expected, "rope", dtype)


def test_large_multithreaded_input():
    rng = np.random.default_rng(22)
    x = random_array(rng, (2, 300, 8, 128), mx.float32)
    positions = random_positions(rng, 300)
    for mode in MODES:
        got, expected = run_rope(x, positions, 128, mode)
        assert nmse(to_numpy(got), expected) <= 1e-7


@pytest.mark.parametrize("dtype, batches", [(mx.float32, 2), (mx.bfloat16, 4)], ids=str)
def test_outputs_large_enough_for_streaming_stores(cpu_isa, dtype, batches):
    """Outputs of 4 MiB and more are written with streaming stores: rows whose
    length (D = 130, partial rotation) is not a whole number of vectors are staged
    per token and streamed out, at the buffer's own (not vector-aligned) address,
    every kernel variant."""
    rng = np.random.default_rng(23)
    x = random_array(rng, (batches, 260, 16, 130), dtype)
    assert x.nbytes >= 4 << 20
    positions = random_positions(rng, 260)
    for mode in MODES:
        got, expected = run_rope(x, positions, 64, mode)
        assert_close(got, expected, "rope", dtype)
        np.testing.assert_array_equal(to_numpy(got)[..., 64:], to_numpy(x)[..., 64:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_streamed_whole_vector_rows_fresh_and_in_place(cpu_isa, dtype):
    """Outputs of 4 MiB and more whose heads are whole vectors: float32 rows go
    straight to memory through aligned streaming stores that join consecutive
    vectors (MLX's buffers are not vector-aligned), 16-bit rows are staged per
    token. Full and partial rotation (the rest copied), into a fresh buffer and into
    the donated input (NEOX's second half waits for the first to be written, so x
    is read before it is overwritten), every kernel variant."""
    rng = np.random.default_rng(24)
    batches = 2 if dtype == mx.float32 else 4
    x = random_array(rng, (batches, 260, 16, 128), dtype)
    assert x.nbytes >= 4 << 20
    positions = random_positions(rng, 260)
    pos = mx.array(positions)
    for mode, n_dims in itertools.product(MODES, [128, 64, 32]):
        expected = reference.rope(to_numpy(x), positions, n_dims, mode)
        fresh = ops.rope(x, pos, n_dims, mode)
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        in_place = ops.rope(x + 0, pos, n_dims, mode)  # x + 0 has no other user: donated
        mx.eval(in_place)
        assert mx.get_peak_memory() - before < 1.5 * x.nbytes, "the input was not donated"
        for got in (fresh, in_place):
            assert_close(got, expected, "rope", dtype)
            np.testing.assert_array_equal(to_numpy(got)[..., n_dims:], to_numpy(x)[..., n_dims:])


def test_three_dimensional_input_and_leading_batch_axes():
    """Also decode-like shapes (many batches, few tokens), which the kernel splits over
    batches rather than tokens."""
    rng = np.random.default_rng(23)
    for shape in [(6, 2, 16), (2, 3, 6, 2, 16), (12, 1, 4, 16), (5, 3, 2, 16)]:
        x = random_array(rng, shape, mx.float32)
        positions = random_positions(rng, shape[-3])
        for mode in MODES:
            got, expected = run_rope(x, positions, 16, mode)
            assert_close(got, expected, "rope", mx.float32)


def test_mode_ids_and_defaults():
    rng = np.random.default_rng(24)
    x = random_array(rng, (5, 2, 16), mx.float32)
    p = mx.array(random_positions(rng, 5))
    np.testing.assert_array_equal(np.array(ops.rope(x, p, 16, 0)), np.array(ops.rope(x, p, 16, "normal")))
    np.testing.assert_array_equal(np.array(ops.rope(x, p, 16, 2)), np.array(ops.rope(x, p, 16, "neox")))
    np.testing.assert_array_equal(np.array(ops.rope(x, p, 16)), np.array(ops.rope(x, p, 16, "normal")))


def test_integer_offset_means_contiguous_positions():
    rng = np.random.default_rng(25)
    x = random_array(rng, (2, 7, 3, 32), mx.float32)
    for offset in [0, 5, 99_000, -3]:
        positions = mx.arange(offset, offset + 7, dtype=mx.int32)
        np.testing.assert_array_equal(np.array(ops.rope(x, offset, 32, "neox")),
                                      np.array(ops.rope(x, positions, 32, "neox")))


@pytest.mark.parametrize("mode, traditional", [("normal", True), ("neox", False)])
def test_matches_mlx_fast_rope(mode, traditional):
    """mx.fast.rope on the same data in MLX's (B, H, T, D) layout: base, scale and
    offset; freqs = base^(2i/n) * freq_factors. MLX computes exp(-i*log(base)/half)
    rather than the iterated product, so the positions stay small."""
    rng = np.random.default_rng(26)
    x = random_array(rng, (2, 11, 4, 64), mx.float32)
    for n_dims, base, scale, offset in [(64, 10000.0, 1.0, 0), (32, 500000.0, 0.25, 37)]:
        ours = ops.rope(x, offset, n_dims, mode, freq_base=base, freq_scale=scale)
        theirs = mx.fast.rope(x.transpose(0, 2, 1, 3), n_dims, traditional=traditional, base=base, scale=scale,
                              offset=offset).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=0, atol=5e-5)
        factors = random_factors(rng, n_dims)
        freqs = mx.array(base ** (np.arange(0, n_dims, 2) / n_dims) * factors, dtype=mx.float32)
        ours = ops.rope(x, offset, n_dims, mode, freq_base=base, freq_factors=mx.array(factors))
        theirs = mx.fast.rope(x.transpose(0, 2, 1, 3), n_dims, traditional=traditional, base=None, scale=1.0,
                              offset=offset, freqs=freqs).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=0, atol=5e-5)


@pytest.mark.parametrize("make", [
    lambda x: x.transpose(1, 0, 2, 3),         # transposed
    lambda x: x[:, ::2],                        # strided tokens
    lambda x: x[..., 2:],                       # offset head dim
    lambda x: mx.broadcast_to(x[:1], x.shape),  # broadcast
], ids=["transposed", "strided", "sliced", "broadcast"])
def test_non_contiguous_inputs(make):
    rng = np.random.default_rng(27)
    x = make(random_array(rng, (4, 8, 3, 34), mx.float32))
    tokens = x.shape[-3]
    wide = mx.array(random_positions(rng, 2 * tokens))
    positions = wide[::2]  # strided positions too
    factors = mx.array(random_factors(rng, 32))[::-1]
    got = ops.rope(x, positions, 32, "normal", freq_factors=factors)
    expected = reference.rope(to_numpy(x), np.array(positions), 32, "normal", freq_factors=np.array(factors))
    assert_close(got, expected, "rope", mx.float32)


def test_input_is_not_overwritten():
    x = mx.arange(2 * 3 * 8, dtype=mx.float32).reshape(2, 3, 8)
    before = np.array(x)
    mx.eval(ops.rope(x, 7, 8, "normal"))
    np.testing.assert_array_equal(np.array(x), before)


def test_empty_inputs():
    assert ops.rope(mx.zeros((0, 2, 8)), mx.zeros((0,), dtype=mx.int32), 8).shape == (0, 2, 8)
    assert ops.rope(mx.zeros((3, 0, 8)), 0, 8).shape == (3, 0, 8)


# ----------------------------------------------------------------------------- grads

def _inner(a, b):
    return float(np.sum(to_numpy(a) * to_numpy(b)))


@pytest.mark.parametrize("mode", MODES)
def test_vjp_is_the_inverse_rotation_and_the_transpose(mode):
    rng = np.random.default_rng(30)
    x = random_array(rng, (2, 5, 3, 24), mx.float32)
    g = random_array(rng, (2, 5, 3, 24), mx.float32)
    positions = random_positions(rng, 5)
    factors = random_factors(rng, 20)
    kw = dict(freq_scale=0.5, ext_factor=0.75, attn_factor=1.3, freq_factors=mx.array(factors), **YARN)
    f = lambda a: ops.rope(a, mx.array(positions), 20, mode, **kw)
    (y,), (gx,) = mx.vjp(f, [x], [g])
    expected = reference.rope(to_numpy(g), positions, 20, mode, inverse=True, **{**kw, "freq_factors": factors})
    assert_close(gx, expected, "rope", mx.float32)
    # <f(x), g> == <x, f^T(g)>
    assert abs(_inner(y, g) - _inner(x, gx)) <= 1e-4 * abs(_inner(y, g)) + 1e-4


def test_inverse_undoes_the_rotation():
    rng = np.random.default_rng(31)
    x = random_array(rng, (9, 2, 16), mx.float32)
    p = mx.array(random_positions(rng, 9))
    _, (back,) = mx.vjp(lambda a: ops.rope(a, p, 16, "neox"), [x], [ops.rope(x, p, 16, "neox")])
    np.testing.assert_allclose(np.array(back), np.array(x), atol=1e-5)


def test_grad_against_finite_differences():
    """Gradients for x and freq_factors against central differences of the float64
    reference (float64 angle chain so that the differences are smooth)."""
    rng = np.random.default_rng(32)
    x = random_array(rng, (3, 2, 8), mx.float32)
    c = rng.standard_normal((3, 2, 8))
    positions = rng.integers(0, 20, 3).astype(np.int32)
    factors = random_factors(rng, 6)
    kw = dict(freq_scale=0.5, ext_factor=0.75, attn_factor=1.2, n_ctx_orig=64, beta_fast=4.0, beta_slow=1.0)
    for mode in MODES:
        def loss(a, ff):
            return mx.sum(ops.rope(a, mx.array(positions), 6, mode, freq_factors=ff, **kw) * mx.array(c, mx.float32))

        gx, gf = mx.grad(loss, argnums=(0, 1))(x, mx.array(factors))
        f = lambda a, ff: np.sum(reference.rope(a, positions, 6, mode, freq_factors=ff, angle_dtype=np.float64,
                                                **kw) * c)
        xn, fn, h = to_numpy(x), factors.astype(np.float64), 1e-6
        fd_x = np.zeros_like(xn)
        for idx in itertools.product(*map(range, xn.shape)):
            d = np.zeros_like(xn)
            d[idx] = h
            fd_x[idx] = (f(xn + d, fn) - f(xn - d, fn)) / (2 * h)
        fd_f = np.array([(f(xn, fn + h * e) - f(xn, fn - h * e)) / (2 * h) for e in np.eye(3)])
        np.testing.assert_allclose(np.array(gx), fd_x, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(np.array(gf), fd_f, rtol=2e-3, atol=1e-3)


def test_gradient_for_positions_raises_clearly():
    x = mx.ones((4, 2, 8))
    p = mx.arange(4, dtype=mx.int32)
    with pytest.raises(ValueError, match="positions are integers"):
        mx.vjp(lambda a, q: ops.rope(a, q, 8), [x, p], [x])


@pytest.mark.parametrize("mode", MODES)
def test_jvp_for_x_and_freq_factors(mode):
    rng = np.random.default_rng(33)
    x, tx = (random_array(rng, (2, 4, 3, 12), mx.float32) for _ in range(2))
    ff, tf = mx.array(random_factors(rng, 12)), mx.array(rng.standard_normal(6).astype(np.float32))
    p = mx.array(random_positions(rng, 4, 50))
    f = lambda a, b: ops.rope(a, p, 12, mode, freq_factors=b, ext_factor=0.5, **YARN)
    _, (jx,) = mx.jvp(lambda a: f(a, ff), [x], [tx])
    assert_close(jx, to_numpy(f(tx, ff)), "rope", mx.float32)  # linear in x
    # <J t, g> == <t, J^T g> for both inputs together
    g = random_array(rng, x.shape, mx.float32)
    _, (jt,) = mx.jvp(f, [x, ff], [tx, tf])
    _, (vx, vf) = mx.vjp(f, [x, ff], [g])
    lhs, rhs = _inner(jt, g), _inner(tx, vx) + _inner(tf, vf)
    assert abs(lhs - rhs) <= 1e-4 * max(abs(lhs), 1.0)


def test_bfloat16_grad_dtype():
    x = mx.ones((3, 2, 8), dtype=mx.bfloat16)
    g = mx.grad(lambda a: ops.rope(a, 0, 8).astype(mx.float32).sum())(x)
    assert g.dtype == mx.bfloat16


# ----------------------------------------------------------------------------- heads_first (MLX's layout)

@pytest.mark.parametrize("mode", MODES)
def test_heads_first_layout(mode):
    """x (B, H, T, D) with heads_first: the reference on x's (B, T, H, D) view, YaRN and freq_factors included;
    both derivatives (freq_factors' too, whose broadcast follows the layout) equal the ggml layout's."""
    rng = np.random.default_rng(44)
    x = random_array(rng, (2, 3, 5, 16), mx.float32)
    positions, factors = random_positions(rng, 5), random_factors(rng, 12)
    kw = dict(ext_factor=0.5, freq_scale=0.5, **YARN)
    f = lambda a, ff: ops.rope(a, mx.array(positions), 12, mode, freq_factors=ff, heads_first=True, **kw)
    g = lambda a, ff: ops.rope(a.transpose(0, 2, 1, 3), mx.array(positions), 12, mode, freq_factors=ff,
                               **kw).transpose(0, 2, 1, 3)
    expected = reference.rope(to_numpy(x).transpose(0, 2, 1, 3), positions, 12, mode, freq_factors=factors,
                              **kw).transpose(0, 2, 1, 3)
    ff = mx.array(factors)
    assert_close(f(x, ff), expected, "rope", mx.float32)
    cot = random_array(rng, x.shape, mx.float32)
    (_, (vx, vf)), (_, (wx, wf)) = mx.vjp(f, [x, ff], [cot]), mx.vjp(g, [x, ff], [cot])
    np.testing.assert_allclose(np.array(vx), np.array(wx), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(vf), np.array(wf), rtol=1e-5, atol=1e-5)
    tf = mx.array(rng.standard_normal(6).astype(np.float32))
    (_, (jf,)), (_, (kf,)) = mx.jvp(f, [x, ff], [cot, tf]), mx.jvp(g, [x, ff], [cot, tf])
    np.testing.assert_allclose(np.array(jf), np.array(kf), rtol=1e-5, atol=1e-5)
    # vmap with positions batched per sequence, and an int offset
    pos = np.stack([random_positions(rng, 5) for _ in range(2)])
    y = mx.vmap(lambda a, p: ops.rope(a, p, 12, mode, heads_first=True))(x, mx.array(pos))
    xn = to_numpy(x)
    assert_close(y, np.stack([reference.rope(xn[i].transpose(1, 0, 2), pos[i], 12, mode).transpose(1, 0, 2)
                              for i in range(2)]), "rope", mx.float32)
    np.testing.assert_array_equal(np.array(ops.rope(x, 7, 12, mode, heads_first=True)),
                                  np.array(ops.rope(x.transpose(0, 2, 1, 3), 7, 12, mode).transpose(0, 2, 1, 3)))
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(5,\).*\(\.\.\., H, T, D\)"):
        ops.rope(x, mx.arange(3, dtype=mx.int32), 12, mode, heads_first=True)
    with pytest.raises(TypeError, match="heads_first must be a bool"):
        ops.rope(x, 0, 12, mode, heads_first=1)


# ----------------------------------------------------------------------------- vmap / compile

@pytest.mark.parametrize("in_axis", [0, 1, 2, 3])
def test_vmap_over_any_x_axis(in_axis):
    rng = np.random.default_rng(40)
    x = random_array(rng, (4, 6, 4, 8), mx.float32)
    tokens = np.moveaxis(to_numpy(x), in_axis, 0).shape[1]
    positions = random_positions(rng, tokens)
    y = mx.vmap(lambda a: ops.rope(a, mx.array(positions), 4, "normal"), in_axes=in_axis)(x)
    xm = np.moveaxis(to_numpy(x), in_axis, 0)
    assert_close(y, reference.rope(xm, positions, 4, "normal"), "rope", mx.float32)


def test_vmap_with_batched_positions_and_factors():
    rng = np.random.default_rng(41)
    x = random_array(rng, (3, 5, 2, 16), mx.float32)
    pos = np.stack([random_positions(rng, 5) for _ in range(3)])
    ff = np.stack([random_factors(rng, 16) for _ in range(3)])
    xn = to_numpy(x)
    ref = lambda i, j, k: reference.rope(xn[i], pos[j], 16, "neox", freq_factors=ff[k])

    y = mx.vmap(lambda a, p, f: ops.rope(a, p, 16, "neox", freq_factors=f))(x, mx.array(pos), mx.array(ff))
    assert_close(y, np.stack([ref(i, i, i) for i in range(3)]), "rope", mx.float32)
    # positions batched along their axis 1, x and freq_factors shared
    y = mx.vmap(lambda p: ops.rope(x[0], p, 16, "neox", freq_factors=mx.array(ff[0])), in_axes=1)(
        mx.array(np.ascontiguousarray(pos.T)))
    assert_close(y, np.stack([ref(0, j, 0) for j in range(3)]), "rope", mx.float32)
    # only freq_factors batched
    y = mx.vmap(lambda f: ops.rope(x[1], mx.array(pos[1]), 16, "neox", freq_factors=f))(mx.array(ff))
    assert_close(y, np.stack([ref(1, 1, k) for k in range(3)]), "rope", mx.float32)


def test_nested_vmap_batches_positions_and_factors_at_different_levels():
    rng = np.random.default_rng(42)
    x = random_array(rng, (2, 3, 4, 2, 8), mx.float32)  # (outer, inner, T, H, D)
    pos = np.stack([random_positions(rng, 4) for _ in range(2)])   # per outer
    ff = np.stack([random_factors(rng, 8) for _ in range(3)])      # per inner
    inner = lambda a, p: mx.vmap(lambda b, f: ops.rope(b, p, 8, "normal", freq_factors=f))(a, mx.array(ff))
    y = mx.vmap(inner)(x, mx.array(pos))
    xn = to_numpy(x)
    expected = np.stack([np.stack([reference.rope(xn[i, j], pos[i], 8, "normal", freq_factors=ff[j])
                                   for j in range(3)]) for i in range(2)])
    assert_close(y, expected, "rope", mx.float32)
    # and gradients through it
    g = mx.grad(lambda a: mx.vmap(inner)(a, mx.array(pos)).sum())(x)
    expected_g = np.stack([np.stack([reference.rope(np.ones(xn.shape[2:]), pos[i], 8, "normal", freq_factors=ff[j],
                                                    inverse=True) for j in range(3)]) for i in range(2)])
    assert_close(g, expected_g, "rope", mx.float32)


def test_compile_including_shapeless():
    rng = np.random.default_rng(43)
    ff = mx.array(random_factors(rng, 16))
    f = lambda a, p: ops.rope(a, p, 16, "neox", ext_factor=0.5, freq_factors=ff, **YARN) * 2.0
    for compiled in (mx.compile(f), mx.compile(f, shapeless=True)):
        for tokens in (3, 9):
            x = random_array(rng, (tokens, 2, 16), mx.float32)
            positions = random_positions(rng, tokens)
            expected = 2.0 * reference.rope(to_numpy(x), positions, 16, "neox", ext_factor=0.5,
                                            freq_factors=np.array(ff), **YARN)
            assert_close(compiled(x, mx.array(positions)), expected, "rope", mx.float32)


def test_shapeless_compile_rechecks_shapes():
    """Shapes that stop fitting under shapeless compilation raise instead of reading out
    of bounds: an int offset's positions keep the traced length."""
    x4, x6 = mx.ones((4, 2, 8)), mx.ones((6, 2, 8))
    f = mx.compile(lambda a: ops.rope(a, 3, 8, "neox"), shapeless=True)
    np.testing.assert_array_equal(np.array(f(x4)), np.array(ops.rope(x4, 3, 8, "neox")))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) do not match x of shape \(6, 2, 8\)"):
        mx.eval(f(x6))
    g = mx.compile(lambda a, p: ops.rope(a, p, 8, "neox"), shapeless=True)
    mx.eval(g(x4, mx.arange(4, dtype=mx.int32)))
    with pytest.raises(ValueError, match=r"positions of shape \(5,\)"):
        mx.eval(g(x6, mx.arange(5, dtype=mx.int32)))
    with pytest.raises(ValueError, match=r"x of shape \(4, 2, 6\) does not fit n_dims = 8"):
        mx.eval(g(mx.ones((4, 2, 6)), mx.arange(4, dtype=mx.int32)))


# ----------------------------------------------------------------------------- bad input

X = mx.ones((4, 2, 8))
P = mx.arange(4, dtype=mx.int32)


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((X, P.astype(mx.int64), 8), {}, TypeError, r"positions must be int32, got int64"),
    ((X, P.astype(mx.float32), 8), {}, TypeError, r"positions must be int32, got float32"),
    ((X, mx.arange(5, dtype=mx.int32), 8), {}, ValueError, r"positions must have shape \(T,\) = \(4,\).*\(5,\)"),
    ((X, P.reshape(1, 4), 8), {}, ValueError, r"positions must have shape \(T,\)"),
    ((X, P, 7), {}, ValueError, r"n_dims must be even and in \[2, D = 8\].*got 7"),
    ((X, P, 10), {}, ValueError, r"n_dims must be even.*got 10"),
    ((X, P, 0), {}, ValueError, r"n_dims must be even.*got 0"),
    ((mx.ones((4, 2, 9)), P, 8), {}, ValueError, r"head dimension D = x.shape\[-1\] must be even, got D = 9"),
    ((mx.ones((4, 8)), P, 8), {}, ValueError, r"at least 3 dimensions \(\.\.\., T, H, D\).*\(4, 8\)"),
    ((X.astype(mx.int32), P, 8), {}, TypeError, r"x must be float32.*int32"),
    ((X, P, 8), {"freq_factors": mx.ones((3,))}, ValueError, r"freq_factors must have shape \(n_dims/2,\) = \(4,\)"),
    ((X, P, 8), {"freq_factors": mx.ones((4,), mx.float16)}, TypeError, r"freq_factors must be float32, got float16"),
    ((X, P, 8), {"mode": "rotary"}, ValueError, r"unknown mode 'rotary'"),
    ((X, P, 8), {"mode": 1}, ValueError, r"unknown mode 1"),
    ((X, P, 8), {"mode": "mrope"}, NotImplementedError, r"MROPE \(ggml mode 8\)"),
    ((X, P, 8), {"mode": 24}, NotImplementedError, r"VISION \(ggml mode 24\)"),
    ((X, P, 8), {"mode": 40}, NotImplementedError, r"IMROPE \(ggml mode 40\)"),
    ((X, P, 8), {"freq_base": 0.0}, ValueError, r"freq_base must be finite and > 0"),
    ((X, P, 8), {"freq_scale": float("nan")}, ValueError, r"freq_scale must be finite"),
    ((X, P, 8), {"ext_factor": float("inf")}, ValueError, r"ext_factor must be finite"),
    ((X, P, 8), {"n_ctx_orig": -1}, ValueError, r"n_ctx_orig must be >= 0"),
    ((X, 2**31 - 2, 8), {}, ValueError, r"overflows int32"),
    ((X, 2**40, 8), {}, ValueError, r"offset must fit in int32, got 1099511627776"),
    ((X, 1.5, 8), {}, TypeError, r"positions must be an int32 mlx.core.array or an int offset, got float"),
    ((np.ones((4, 2, 8), np.float32), P, 8), {}, TypeError, r"x must be an mlx.core.array, got ndarray"),
    ((X, P, 8.0), {}, TypeError, r"n_dims must be an int, got float"),
    ((X, P, 8), {"mode": True}, TypeError, r"mode must be a str"),
    ((X, P, 8), {"freq_base": "1e4"}, TypeError, r"freq_base must be a float, got str"),
    ((X, P, 8), {"freq_factors": np.ones(4, np.float32)}, TypeError, r"freq_factors must be an mlx.core.array"),
])
def test_bad_input_raises_clearly(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ops.rope(*args, **kwargs)
