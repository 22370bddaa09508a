"""The ops on transposed, sliced and broadcast inputs: on the CPU they add no Contiguous node to the graph and
copy a strided input inside the primitive instead (csrc/backend/cpu/row_major.h), so the results must equal
those on the same values made row-major first, bit for bit."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import GGMLTensor, ops

rng = np.random.default_rng(5)


def _strided_variants(shape):
    """(name, array) pairs: the same logical values in different memory layouts (shape is the logical one)."""
    base = mx.array(rng.standard_normal(shape).astype(np.float32))
    t = mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(np.array(base), -1, -2))), -1, -2)
    wide = mx.array(np.repeat(np.array(base), 2, axis=-1))[..., ::2]
    row = mx.broadcast_to(base[..., :1, :], base.shape)
    return [("transposed", base, t), ("every other column", base, wide), ("broadcast", mx.contiguous(row), row)]


def _same(fn, contiguous, strided):
    expected = fn(contiguous)
    got = fn(strided)
    mx.eval(expected, got)
    assert np.array_equal(np.array(expected), np.array(got))


@pytest.mark.parametrize("case", range(3), ids=["transposed", "strided", "broadcast"])
def test_elementwise_ops_on_strided_inputs(case):
    _, contiguous, strided = _strided_variants((3, 5, 64))[case]
    weight = mx.array(rng.standard_normal(64).astype(np.float32))
    _same(lambda a: ops.rms_norm(a, weight, 1e-6), contiguous, strided)
    _same(lambda a: ops.rope(a, 7, 32, "neox"), contiguous, strided)
    _same(lambda a: ops.glu(a, a * 2, kind="swiglu"), contiguous, strided)
    _same(lambda a: ops.glu(a, kind="geglu"), contiguous, strided)


@pytest.mark.parametrize("case", range(3), ids=["transposed", "strided", "broadcast"])
def test_quantized_matmul_on_strided_x(case):
    _, contiguous, strided = _strided_variants((4, 3, 64))[case]
    w = ops.quantize(mx.array(rng.standard_normal((16, 64)).astype(np.float32)), "q8_0",
                     stream=mx.cpu)
    wt = GGMLTensor(w, "q8_0", (16, 64))
    _same(lambda a: ops.quantized_matmul(a, wt), contiguous, strided)
    _same(lambda a: ops.quantized_matmul(a, wt, precise_x=True), contiguous, strided)


def test_mul_mat_id_on_strided_x_and_ids():
    w = ops.quantize(mx.array(rng.standard_normal((4 * 16, 64)).astype(np.float32)), "q8_0", stream=mx.cpu)
    experts = GGMLTensor(w, "q8_0", (4, 16, 64))
    x = mx.array(rng.standard_normal((3, 2, 64)).astype(np.float32))
    x_t = mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(np.array(x), 0, 1))), 0, 1)
    ids = mx.array([[0, 3], [2, 1], [1, 1]], mx.int32)
    ids_t = mx.swapaxes(mx.array(np.ascontiguousarray(np.array(ids).T)), 0, 1)
    expected = ops.mul_mat_id(experts, x, ids)
    got = ops.mul_mat_id(experts, x_t, ids_t)
    mx.eval(expected, got)
    assert np.array_equal(np.array(expected), np.array(got))
