"""quantized_matmul and mul_mat against exact float64 math on the blocks as gguf decodes them, against an
emulation of ggml's own CPU scheme (activations quantized to Q8_0 / Q8_K), MLX's own ops for gradients,
and finite differences; vmap, compile, the nn layer, and bad input."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_ggml_ext import GGMLTensor, GGMLType, gguf as ggext_gguf, ops, reference
from mlx_ggml_ext.nn import GGMLLinear, load_gguf_linears, replace_linear_layers
from harness import DTYPES, nmse, ties_and_one_hot_q8_0, to_numpy

gguf = pytest.importorskip("gguf")

ALL_TYPES = list(GGMLType)
QUANT_TYPES = [t for t in GGMLType if not t.is_float]
# ggml's own tolerance for MUL_MAT (test-backend-ops) is NMSE 5e-4; ours, measured, is near 3e-5 for
# quantized weights (int8 activations per 32) and rounding only for float weights.
QUANT_NMSE = 2e-4
FLOAT_NMSE = {mx.float32: 1e-11, mx.float16: 2e-6, mx.bfloat16: 3e-5}  # the output's one rounding


def blocks_and_matrix(rng, t: GGMLType, n: int, k: int):
    """Random blocks with finite scales (every code pattern) and their float64 matrix as gguf decodes it."""
    data = reference.random_blocks(rng, t.name, n, k)
    if t == GGMLType.MXFP4:  # exponents near 2^-4, so that float16 outputs of long rows stay finite
        data.reshape(-1, t.type_size)[:, 0] = rng.integers(118, 126, data.size // t.type_size)
    if t.is_float:
        dense = to_numpy(ops.dequantize(mx.array(data), t, (n, k), mx.float32))
    else:
        dense = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
    return data, dense.reshape(n, k)


def random_x(rng, shape, dtype):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def tolerance(t: GGMLType, dtype) -> float:
    return FLOAT_NMSE[dtype] if t.is_float else QUANT_NMSE


# ----------------------------------------------------------------------------- forward accuracy

# The decoded types (IQ grids, ternary): gguf's numpy decoder, their reference here, is slow on long rows:
# K = 11008 is left to the other types.
FORWARD_CASES = [(t, k) for t in ALL_TYPES for k in (256, 4096, 11008)
                 if not (k == 11008 and t.name in reference.GGUF_DECODED)]


@pytest.mark.parametrize("m", [1, 2, 7, 33])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t, k", FORWARD_CASES, ids=lambda v: v.name if isinstance(v, GGMLType) else str(v))
def test_matches_float64_on_the_decoded_weight(t, dtype, m, k):
    rng = np.random.default_rng(int(t) * 1000 + m + k)
    n = 48
    if k % t.block_size:
        # K = 11008 is not a multiple of 256: the K-quant rows cannot hold it, and the op says so.
        with pytest.raises(ValueError, match=f"not a multiple of {t.name}'s block size"):
            ops.quantized_matmul(random_x(rng, (m, k), dtype), mx.zeros((n, 10), mx.uint8), t)
        return
    data, dense = blocks_and_matrix(rng, t, n, k)
    x = random_x(rng, (m, k), dtype)
    y = ops.quantized_matmul(x, GGMLTensor(mx.array(data), t, (n, k)))
    assert y.dtype == dtype and y.shape == (m, n)
    expected = to_numpy(x) @ dense.T
    assert nmse(to_numpy(y), expected) <= tolerance(t, dtype)


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q3_K,
                               GGMLType.Q2_K, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K,
                               GGMLType.IQ4_XS], ids=lambda t: t.name)
def test_decode_on_a_weight_of_many_rows(t):
    """More than 8192 rows, K = 2048 (rows on 16-byte boundaries for every type here), which the GPU's decode
    routes apart from small weights: a few rows of x in one kernel (x quantized in each block's shared memory),
    and the staged tensor-core kernel from a few rows of x on, which for most formats (shared_x_route; not Q2_K,
    Q3_K) quantizes x in its own shared memory, its blocks taking many groups of 16 rows each."""
    rng = np.random.default_rng(int(t) + 77)
    n, k = 8200, 2048
    data, dense = blocks_and_matrix(rng, t, n, k)
    w = GGMLTensor(mx.array(data), t, (n, k))
    for m in (1, 2, 3, 4, 5, 8):
        x = random_x(rng, (m, k), mx.float16)
        y = ops.quantized_matmul(x, w)
        assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE, f"m={m}"


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q5_K, GGMLType.Q4_1], ids=lambda t: t.name)
def test_decode_on_a_weight_of_few_long_rows(t):
    """1000 rows of 14336 (few rows, the GPU's other decode routes): Q4_0 and Q5_K at m=1 in the fused kernel, Q4_0,
    Q8_0 and Q5_K at m=2 in the staged kernel with x inside; Q4_1, and every format from m=3, both steps."""
    rng = np.random.default_rng(int(t) + 91)
    n, k = 1000, 14336
    data, dense = blocks_and_matrix(rng, t, n, k)
    w = GGMLTensor(mx.array(data), t, (n, k))
    for m in (1, 2, 3):
        x = random_x(rng, (m, k), mx.float16)
        y = ops.quantized_matmul(x, w)
        assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE, f"m={m}"


@pytest.mark.parametrize("n", [256, 8200])
def test_x_codes_round_to_nearest_even(n):
    """Rows of x are quantized per 32 elements to x / d rounded to the nearest integer, ties to even (d = amax /
    127): exact ties and their neighbours, read back through a one-hot weight, the same on every device. On the
    GPU, 256 rows take the quantize step (m=1) and the few-rows staged kernel with x inside (m=2); 8200 rows the
    fused kernel (m=1) and the staged kernel with x inside (m=2)."""
    rng = np.random.default_rng(n)
    k = 256
    x, codes, blocks = ties_and_one_hot_q8_0(rng, n, k)
    w = GGMLTensor(mx.array(blocks), GGMLType.Q8_0, (n, k))
    for m in (1, 2):
        y = to_numpy(ops.quantized_matmul(mx.array(x[:m]), w))
        np.testing.assert_array_equal(y, codes[:m, np.arange(n) % k], err_msg=f"m={m}")


@pytest.mark.parametrize("dense_rows", ["1", "0"], ids=["dense_route", "blocks_route"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_many_rows_of_half_x_on_either_route(t, dtype, dense_rows, monkeypatch):
    """Many rows of float16/bfloat16 x. With CUDA, from MLX_GGML_EXT_CUDA_DENSE_ROWS rows on (default 9; 0:
    never) the product is our dequantize kernel (the weight in x's dtype) followed by MLX's matmul, else the
    primitive's tensor-core tiles; elsewhere the variable changes nothing. Forward, x's gradient, a batch of
    weights under vmap, and the weight's (absent) gradient, against float64 math."""
    monkeypatch.setenv("MLX_GGML_EXT_CUDA_DENSE_ROWS", dense_rows)
    rng = np.random.default_rng(int(t) + 500)
    n, k, m = 40, 512, 160
    pairs = [blocks_and_matrix(rng, t, n, k) for _ in range(2)]
    data, dense = pairs[0]
    blocks = mx.array(data)
    x = random_x(rng, (2, m // 2, k), dtype)
    y = ops.quantized_matmul(x, GGMLTensor(blocks, t, (n, k)))
    assert y.dtype == dtype and y.shape == (2, m // 2, n)
    assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= tolerance(t, dtype)
    g = random_x(rng, (2, m // 2, n), dtype)
    _, (grad,) = mx.vjp(lambda v: ops.quantized_matmul(v, blocks, t), [x], [g])
    assert grad.dtype == dtype and grad.shape == x.shape
    assert nmse(to_numpy(grad), to_numpy(g) @ dense) <= tolerance(t, dtype)
    stacked = mx.array(np.stack([p[0] for p in pairs]))
    xs = random_x(rng, (2, m, k), dtype)
    y = mx.vmap(lambda v, w: ops.quantized_matmul(v, w, t))(xs, stacked)
    expected = np.stack([to_numpy(xs)[i] @ pairs[i][1].T for i in range(2)])
    assert nmse(to_numpy(y), expected) <= tolerance(t, dtype)
    with pytest.raises(ValueError, match="raw ggml blocks"):
        mx.grad(lambda w: ops.quantized_matmul(x, w, t).astype(mx.float32).sum())(blocks)


def ggml_activations(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """x as ggml's CPU sees it before its integer dot products: Q8_K (one float scale per 256, -128/max) for
    the K-quants and IQ4_XS, else Q8_0/Q8_1 (per 32, amax/127, the scale stored as float16)."""
    rows = x.reshape(-1, 256 if t.block_size == 256 else 32)
    if t.block_size == 256:
        amax_at = np.argmax(np.abs(rows), axis=1)
        vmax = rows[np.arange(rows.shape[0]), amax_at]
        iscale = np.where(vmax != 0, -128.0 / np.where(vmax != 0, vmax, 1), 0.0).astype(np.float32)
        q = np.minimum(127, np.round(iscale[:, None] * rows))
        d = np.where(iscale != 0, 1.0 / np.where(iscale != 0, iscale, 1), 0.0)
    else:
        d32 = np.abs(rows).max(axis=1) / 127.0
        inv = np.where(d32 != 0, 1.0 / np.where(d32 != 0, d32, 1), 0.0)
        v = rows * inv[:, None]
        q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # roundf: half away from zero
        d = d32.astype(np.float16).astype(np.float64)
    return (q * d[:, None]).reshape(x.shape)


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_no_less_accurate_than_ggmls_cpu_scheme(t):
    """Same blocks, same x: our error against exact math is at most ggml's (emulated) own."""
    rng = np.random.default_rng(7 + int(t))
    n, k, m = 128, 2048, 8
    data, dense = blocks_and_matrix(rng, t, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, ::97] *= 8.0  # a few outliers, as real activations have
    exact = x.astype(np.float64) @ dense.T
    ours = nmse(to_numpy(ops.quantized_matmul(mx.array(x), mx.array(data), t)), exact)
    theirs = nmse(ggml_activations(x.astype(np.float64), t) @ dense.T, exact)
    assert ours <= 1.1 * theirs, f"{t.name}: ours {ours:.3e}, ggml's scheme {theirs:.3e}"


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_precise_x_takes_x_with_its_rounding_residual(cpu_isa, t):
    """precise_x: x in two int8 passes (codes, then the codes of what they left out) on every CPU kernel
    variant: the error against exact math falls by orders of magnitude on x with outliers, for one row of x,
    a few, and more than a tile (pairs of rows of activations per row of x); the layer and the tied head
    take it too."""
    rng = np.random.default_rng(11 + int(t))
    n, k = 40, 512
    data, dense = blocks_and_matrix(rng, t, n, k)
    w = GGMLTensor(mx.array(data), t, (n, k))
    for m in (1, 3, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::37] *= 20.0
        exact = x.astype(np.float64) @ dense.T
        one_pass = nmse(to_numpy(ops.quantized_matmul(mx.array(x), w)), exact)
        y = ops.quantized_matmul(mx.array(x), w, precise_x=True)
        two_pass = nmse(to_numpy(y), exact)
        assert two_pass <= max(one_pass / 1000, 1e-12), (t.name, m, one_pass, two_pass)
    layer = GGMLLinear(w, precise_x=True)
    assert np.array_equal(to_numpy(layer(mx.array(x))), to_numpy(y))
    from mlx_ggml_ext.nn import GGMLEmbedding
    assert np.array_equal(to_numpy(GGMLEmbedding(w, precise_x=True).as_linear(mx.array(x))), to_numpy(y))


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "x_grad"])
def test_never_materializes_the_dequantized_weight(t, transpose):
    """Peak memory while the op (or x's gradient, the transposed product) runs stays below the packed weight
    plus the output and x; the dequantized float32 matrix alone would be 6-8x the packed weight."""
    rng = np.random.default_rng(3)
    n, k, m = 2048, 4096, 4
    w = mx.array(reference.random_blocks(rng, t.name, n, k))
    x = random_x(rng, (m, n if transpose else k), mx.float32)
    mx.eval(w, x)
    mx.synchronize()
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    if transpose:
        _, (g,) = mx.vjp(lambda v: ops.quantized_matmul(v, w, t), [random_x(rng, (m, k), mx.float32)], [x])
        y = g
    else:
        y = ops.quantized_matmul(x, w, t)
    mx.eval(y)
    mx.synchronize()
    extra = mx.get_peak_memory() - base
    dense = n * k * 4
    assert extra <= w.nbytes + 2 * y.nbytes + 2 * x.nbytes + (1 << 20), (extra, w.nbytes, dense)


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                               GGMLType.Q2_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL,
                               GGMLType.MXFP4, GGMLType.F16, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
                               GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ1_0],
                         ids=lambda t: t.name)
def test_every_cpu_kernel_variant(cpu_isa, t):
    rng = np.random.default_rng(int(t))
    # odd block counts: a half-filled last group, after 1 or 3 blocks past the kernels' steps of 4; an odd
    # number of weight rows (the two-row kernels' lone last row)
    for k in ((32 * 9, 32 * 7) if t.block_size == 32 else (512,)):
        data, dense = blocks_and_matrix(rng, t, 41, k)
        for m in (1, 3, 8, 13):
            x = random_x(rng, (m, k), mx.float32)
            y = ops.quantized_matmul(x, mx.array(data), t)
            assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= tolerance(t, mx.float32), (cpu_isa, k, m)


def test_quantized_weights_from_real_data():
    """Weights quantized from normal data (the usual case) by gguf and by this package."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 1024)).astype(np.float32)
    x = rng.standard_normal((5, 1024)).astype(np.float32)
    for t in [GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]:
        blocks = np.array(ops.quantize(mx.array(w), t, stream=mx.cpu))
        dense = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
        y = ops.quantized_matmul(mx.array(x), GGMLTensor(mx.array(blocks), t, w.shape))
        assert nmse(to_numpy(y), x.astype(np.float64) @ dense.T) <= QUANT_NMSE, t.name


def test_leading_axes_and_large_multithreaded_shapes():
    rng = np.random.default_rng(11)
    t = GGMLType.Q4_K
    data, dense = blocks_and_matrix(rng, t, 700, 1024)
    x = random_x(rng, (2, 3, 45, 1024), mx.float32)
    y = ops.quantized_matmul(x, mx.array(data), t)
    assert y.shape == (2, 3, 45, 700)
    assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE


def test_non_finite_inputs_propagate():
    rng = np.random.default_rng(5)
    data, _ = blocks_and_matrix(rng, GGMLType.Q4_0, 8, 64)
    x = np.ones((3, 64), np.float32)
    x[1, 5] = np.nan
    x[2, 40] = np.inf
    y = np.array(ops.quantized_matmul(mx.array(x), mx.array(data), GGMLType.Q4_0))
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and not np.isfinite(y[2]).all()


def test_empty_shapes():
    data = mx.zeros((0, 18), mx.uint8)
    assert ops.quantized_matmul(mx.zeros((3, 32)), data, GGMLType.Q4_0).shape == (3, 0)
    y = ops.quantized_matmul(mx.zeros((0, 32)), mx.zeros((4, 18), mx.uint8), GGMLType.Q4_0)
    assert y.shape == (0, 4)


# ----------------------------------------------------------------------------- mul_mat

@pytest.mark.parametrize("a_batch,b_batch", [((), ()), ((2,), (4,)), ((1, 2), (3, 4)), ((2, 1), (2, 3)),
                                             ((3,), ())], ids=str)
@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q6_K, GGMLType.F32, GGMLType.F16], ids=lambda t: t.name)
def test_mul_mat_broadcasts_as_ggml(t, a_batch, b_batch):
    rng = np.random.default_rng(int(t) + len(a_batch) + len(b_batch))
    M, N, K = 24, 5, 256
    a_shape = (*a_batch, M, K)
    data, dense = blocks_and_matrix(rng, t, int(np.prod(a_shape[:-1])), K)
    dense = dense.reshape(a_shape)
    b = random_x(rng, (*b_batch, N, K), mx.float32)
    a4 = dense.reshape((1,) * (4 - dense.ndim) + dense.shape)
    b4 = to_numpy(b).reshape((1,) * (4 - b.ndim) + tuple(b.shape))
    if b4.shape[1] % a4.shape[1] or b4.shape[0] % a4.shape[0]:
        with pytest.raises(ValueError, match="multiples"):
            ops.mul_mat(GGMLTensor(mx.array(data), t, a_shape), b)
        return
    out = ops.mul_mat(GGMLTensor(mx.array(data), t, a_shape), b)
    # ggml: batch (i3, i2) of b meets a's (i3 // (B3 // A3), i2 // (B2 // A2)); result (B3, B2, N, M), float32
    expected = np.empty((b4.shape[0], b4.shape[1], N, M))
    for i3 in range(b4.shape[0]):
        for i2 in range(b4.shape[1]):
            ai3, ai2 = i3 // (b4.shape[0] // a4.shape[0]), i2 // (b4.shape[1] // a4.shape[1])
            expected[i3, i2] = b4[i3, i2] @ a4[ai3, ai2].T
    nd = max(len(a_shape), b.ndim)
    assert out.dtype == mx.float32 and out.shape == expected.shape[4 - nd:]
    assert nmse(to_numpy(out), expected.reshape(out.shape)) <= tolerance(t, mx.float32)


def test_mul_mat_with_a_plain_float_array():
    rng = np.random.default_rng(2)
    a = random_x(rng, (2, 16, 64), mx.bfloat16)
    b = random_x(rng, (4, 3, 64), mx.float16)
    out = ops.mul_mat(a, b)
    an, bn = to_numpy(a), to_numpy(b)
    expected = np.stack([bn[i] @ an[i // 2].T for i in range(4)])
    assert out.dtype == mx.float32 and out.shape == (4, 3, 16)
    assert nmse(to_numpy(out), expected) <= 1e-11


# ----------------------------------------------------------------------------- transformations

def dense_weight(t, data, n, k):
    return mx.array(to_numpy(ops.dequantize(mx.array(data), t, (n, k), mx.float32)).astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.IQ4_XS,
                               GGMLType.MXFP4, GGMLType.BF16], ids=lambda t: t.name)
def test_vjp_is_the_transposed_product_on_the_blocks(t, dtype):
    """grad x of <g, x @ W^T> = g @ W, computed blockwise in float32: against MLX's matmul on the decoded W."""
    rng = np.random.default_rng(int(t))
    n, k = 72, 512
    data, _ = blocks_and_matrix(rng, t, n, k)
    w = dense_weight(t, data, n, k)
    x = random_x(rng, (2, 5, k), dtype)
    g = random_x(rng, (2, 5, n), dtype)
    blocks = mx.array(data)
    _, grad = mx.vjp(lambda v: ops.quantized_matmul(v, blocks, t), [x], [g])
    expected = to_numpy(g) @ to_numpy(w)
    assert grad[0].dtype == dtype and grad[0].shape == x.shape
    assert nmse(to_numpy(grad[0]), expected) <= FLOAT_NMSE[dtype]
    # second order: the transposed product's own vjp is the forward product again
    _, back = mx.vjp(lambda v: mx.vjp(lambda u: ops.quantized_matmul(u, blocks, t), [x], [v])[1][0], [g], [x])
    assert nmse(to_numpy(back[0]), to_numpy(x) @ to_numpy(w).T) <= tolerance(t, dtype) + QUANT_NMSE


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    t = GGMLType.Q8_0
    n, k = 16, 64
    data, dense = blocks_and_matrix(rng, t, n, k)
    blocks = mx.array(data)
    c = rng.standard_normal(n)
    x0 = rng.standard_normal(k)

    def loss(v):
        return mx.sum(ops.quantized_matmul(v, blocks, t) * mx.array(c.astype(np.float32)))

    grad = np.array(mx.grad(loss)(mx.array(x0.astype(np.float32))), np.float64)
    # the loss is linear in x: central differences of the exact function recover its gradient, W^T c
    h = 1e-3
    fd = np.array([((x0 + h * e) @ dense.T @ c - (x0 - h * e) @ dense.T @ c) / (2 * h) for e in np.eye(k)])
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5 * np.abs(fd).max())


def test_jvp_is_the_product_of_the_tangent():
    rng = np.random.default_rng(1)
    t = GGMLType.Q6_K
    data, dense = blocks_and_matrix(rng, t, 32, 256)
    x, tangent = random_x(rng, (3, 256), mx.float32), random_x(rng, (3, 256), mx.float32)
    blocks = mx.array(data)
    _, (jv,) = mx.jvp(lambda v: ops.quantized_matmul(v, blocks, t), [x], [tangent])
    assert nmse(to_numpy(jv), to_numpy(tangent) @ dense.T) <= QUANT_NMSE


def test_weight_has_no_gradient():
    blocks = mx.zeros((4, 18), mx.uint8)
    with pytest.raises(ValueError, match="differentiable in x"):
        mx.grad(lambda w: ops.quantized_matmul(mx.ones((1, 32)), w, GGMLType.Q4_0).sum())(blocks)


def test_vmap_over_x_and_over_a_batch_of_weights():
    rng = np.random.default_rng(4)
    t = GGMLType.Q4_K
    n, k = 20, 256
    pairs = [blocks_and_matrix(rng, t, n, k) for _ in range(3)]
    stacked = mx.array(np.stack([p[0] for p in pairs]))
    x = random_x(rng, (3, 2, k), mx.float32)
    # over x only (axis 1), one weight
    y = mx.vmap(lambda v: ops.quantized_matmul(v, stacked[0], t), in_axes=1, out_axes=1)(x)
    assert nmse(to_numpy(y), to_numpy(x) @ pairs[0][1].T) <= QUANT_NMSE
    # over weights and x together
    y = mx.vmap(lambda v, w: ops.quantized_matmul(v, w, t))(x, stacked)
    expected = np.stack([to_numpy(x)[i] @ pairs[i][1].T for i in range(3)])
    assert nmse(to_numpy(y), expected) <= QUANT_NMSE
    # over weights only
    y = mx.vmap(lambda w: ops.quantized_matmul(x[0], w, t))(stacked)
    expected = np.stack([to_numpy(x)[0] @ pairs[i][1].T for i in range(3)])
    assert nmse(to_numpy(y), expected) <= QUANT_NMSE
    # the gradient under vmap
    g = mx.vmap(mx.grad(lambda v, w: ops.quantized_matmul(v, w, t).sum()))(x, stacked)
    expected = np.stack([np.ones((2, n)) @ pairs[i][1] for i in range(3)])
    assert nmse(to_numpy(g), expected) <= 1e-10


def test_compile():
    rng = np.random.default_rng(6)
    t = GGMLType.Q5_0
    data, dense = blocks_and_matrix(rng, t, 24, 128)
    blocks = mx.array(data)
    f = mx.compile(lambda v: ops.quantized_matmul(v, blocks, t) * 2.0)
    fs = mx.compile(lambda v: ops.quantized_matmul(v, blocks, t), shapeless=True)
    for m in (1, 4):
        x = random_x(rng, (m, 128), mx.float32)
        assert nmse(to_numpy(f(x)), 2.0 * to_numpy(x) @ dense.T) <= QUANT_NMSE
        assert nmse(to_numpy(fs(x)), to_numpy(x) @ dense.T) <= QUANT_NMSE


# ----------------------------------------------------------------------------- nn

def test_ggml_linear_layer_and_swapping_a_models_linears(tmp_path):
    rng = np.random.default_rng(8)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    t = GGMLType.Q4_K
    tensor = GGMLTensor(ops.quantize(mx.array(w), t, stream=mx.cpu), t, w.shape)
    bias = mx.array(rng.standard_normal(32).astype(np.float32))
    layer = GGMLLinear(tensor, bias)
    x = random_x(rng, (4, 256), mx.float32)
    dense = to_numpy(tensor.dequantize())
    assert nmse(to_numpy(layer(x)), to_numpy(x) @ dense.T + to_numpy(bias)) <= QUANT_NMSE
    assert set(layer.trainable_parameters()) == {"bias"}
    assert set(layer.unfreeze().trainable_parameters()) == {"bias"}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(256, 32), nn.Linear(32, 8)]

        def __call__(self, v):
            return self.layers[1](self.layers[0](v))

    model = Model()
    path = tmp_path / "w.gguf"
    ggext_gguf.save(str(path), {"general.architecture": "test"}, {"blk.0.w": tensor})
    replaced = load_gguf_linears(model, str(path), lambda p: "blk.0.w" if p == "layers.0" else None)
    assert replaced == ["layers.0"] and isinstance(model.layers[0], GGMLLinear)
    h = to_numpy(x) @ dense.T + to_numpy(model.layers[0].bias)
    expected = h @ to_numpy(model.layers[1].weight).T + to_numpy(model.layers[1].bias)
    assert nmse(to_numpy(model(x)), expected) <= QUANT_NMSE
    # the float layer on top still trains; gradients reach it through the quantized one
    grads = nn.value_and_grad(model, lambda m, v: m(v).sum())(model, x)[1]
    assert grads["layers"][1]["weight"].shape == (8, 32) and "weight" not in grads["layers"][0]
    with pytest.raises(ValueError, match="out, in"):
        replace_linear_layers(Model(), {"w": tensor}, {"layers.1": "w"})


# ----------------------------------------------------------------------------- bad input

def q4_0(n, k):
    return mx.zeros((n, k // 32 * 18), mx.uint8)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), q4_0(4, 32), GGMLType.Q4_0), ValueError, r"\(N, 36\)"),
    (lambda: ops.quantized_matmul(mx.ones((2, 48)), q4_0(4, 32), GGMLType.Q4_0), ValueError, "not a multiple"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), mx.zeros((4, 35), mx.uint8), "q4_0"), ValueError, "36"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64), mx.int32), q4_0(4, 64), "q4_0"), TypeError, "int32"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), q4_0(4, 64)), TypeError, "give its ggml type"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), mx.ones((4, 64)), "q4_0"), TypeError, "raw blocks"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), np.zeros((4, 36), np.uint8), "q4_0"), TypeError, "ndarray"),
    (lambda: ops.quantized_matmul(mx.array(1.0), q4_0(4, 64), "q4_0"), ValueError, "at least one dimension"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), GGMLTensor(q4_0(8, 64), "q4_0", (2, 4, 64))), ValueError,
     "2-D"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), GGMLTensor(q4_0(4, 64), "q4_0", (4, 64)), "q8_0"), ValueError,
     "does not match"),
    (lambda: ops.quantized_matmul(mx.ones((2, 64)), q4_0(4, 64), 5), ValueError, "unsupported ggml type"),
    (lambda: ops.mul_mat(GGMLTensor(q4_0(6, 64), "q4_0", (3, 2, 64)), mx.ones((2, 5, 64))), ValueError, "multiples"),
    (lambda: ops.mul_mat(GGMLTensor(q4_0(2, 64), "q4_0", (2, 64)), mx.ones((5, 32))), ValueError, "agree on K"),
    (lambda: ops.mul_mat(mx.ones((2, 64)), mx.ones((5, 64), mx.int8)), TypeError, "int8"),
    (lambda: ops.mul_mat(mx.ones((1, 1, 1, 1, 2, 64)), mx.ones((5, 64))), ValueError, "1 to 4 dimensions"),
])
def test_bad_input_raises_clearly(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

