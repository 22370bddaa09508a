"""Inputs at the edges that once crashed or misread (the reliability audit, issue 30): each is now a clear
exception or a correct result. Guard pages (no read past a tensor) are in test_guard_page.py; the GGUF fuzzer
is tests/fuzz_gguf.py."""

import struct

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import GGMLTensor, GGMLType, gguf as ggext_gguf, ops
from mlx_ggml_ext.gguf import GGUFFormatError, ValueType
from mlx_ggml_ext.nn import GGMLLinear
from harness import to_numpy


# ----------------------------------------------------------------------------- K = 0, empty batches

@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.Q4_0, GGMLType.Q4_K], ids=lambda t: t.name)
def test_an_empty_contraction_is_zeros(t):
    # x (2, 0) against a (3, 0) weight: every output is an empty sum (numpy: zeros((2, 3))).
    w = mx.zeros((3, 0)) if t == GGMLType.F32 else mx.zeros((3, 0), dtype=mx.uint8)
    out = ops.quantized_matmul(mx.zeros((2, 0)), w, None if t == GGMLType.F32 else t)
    assert out.shape == (2, 3) and np.array_equal(to_numpy(out), np.zeros((2, 0)) @ np.zeros((3, 0)).T)
    grad = mx.grad(lambda x: ops.quantized_matmul(x, w, None if t == GGMLType.F32 else t).sum())(mx.zeros((2, 0)))
    assert grad.shape == (2, 0)


def test_a_gguf_tensor_with_no_columns_makes_a_linear_of_zeros(tmp_path):
    path = tmp_path / "empty_rows.gguf"
    ggext_gguf.save(path, {}, {"w": GGMLTensor(mx.zeros((3, 0), dtype=mx.uint8), GGMLType.Q4_0, (3, 0))})
    layer = GGMLLinear(ggext_gguf.load(path).tensors["w"])
    out = layer(mx.ones((2, 0)))
    assert out.shape == (2, 3) and np.array_equal(to_numpy(out), np.zeros((2, 3)))


def test_mul_mat_with_an_empty_batch_axis():
    # a has no batches, b has 2: nothing to broadcast (ggml: ne2 of b a multiple of a's), a clear error.
    with pytest.raises(ValueError, match="must be multiples of a's"):
        ops.mul_mat(mx.zeros((0, 4, 32)), mx.zeros((2, 3, 32)))
    # Both empty: an empty result of the broadcast shape, as numpy's matmul gives.
    out = ops.mul_mat(mx.zeros((0, 4, 32)), mx.zeros((0, 3, 32)))
    assert out.shape == (np.zeros((0, 3, 32)) @ np.zeros((0, 32, 4))).shape
    out = ops.mul_mat(mx.zeros((2, 4, 32)), mx.zeros((0, 3, 32)))
    assert out.shape == (0, 3, 4)


# ----------------------------------------------------------------------------- shapeless compile

def test_shapeless_compile_rechecks_k_of_quantized_matmul():
    rng = np.random.default_rng(30)
    t = GGMLType.Q8_0
    w = ops.quantize(mx.array(rng.standard_normal((3, 32)).astype(np.float32)), t, stream=mx.cpu)
    f = mx.compile(lambda x, blocks: ops.quantized_matmul(x, blocks, t), shapeless=True)
    x = mx.array(rng.standard_normal((2, 32)).astype(np.float32))
    dense = to_numpy(ops.dequantize(w, t, (3, 32)))
    expected = to_numpy(x).astype(np.float64) @ dense.T
    assert np.abs(to_numpy(f(x, w)) - expected).max() <= 0.02 * np.abs(expected).max()
    with pytest.raises(ValueError, match="has 64 elements per row but the Q8_0 weight"):
        f(mx.zeros((2, 64)), w)  # the weight holds rows of 32: the kernel would read 2 blocks per row


def test_shapeless_compile_rechecks_k_of_a_ggml_linear():
    rng = np.random.default_rng(31)
    w = ops.quantize(mx.array(rng.standard_normal((4, 64)).astype(np.float32)), GGMLType.Q4_0, stream=mx.cpu)
    layer = GGMLLinear(GGMLTensor(w, GGMLType.Q4_0, (4, 64)))
    f = mx.compile(layer, shapeless=True)
    assert f(mx.ones((1, 64))).shape == (1, 4)
    with pytest.raises(ValueError, match="quantized_matmul"):
        f(mx.ones((1, 128)))


def test_shapeless_compile_rechecks_the_bytes_of_dequantize():
    f = mx.compile(lambda d: ops.dequantize(d, GGMLType.Q8_0, (2, 32)), shapeless=True)
    assert f(mx.zeros((2, 34), dtype=mx.uint8)).shape == (2, 32)
    with pytest.raises(ValueError, match="not rows of whole 34-byte blocks"):
        f(mx.zeros((2, 35), dtype=mx.uint8))


# ----------------------------------------------------------------------------- rope positions near 2^31

def test_rope_offset_up_to_the_int32_limit():
    rng = np.random.default_rng(32)
    x = mx.array(rng.standard_normal((4, 3, 8)).astype(np.float32))
    last = 2**31 - 1
    by_offset = ops.rope(x, last - 3, 8)
    by_positions = ops.rope(x, mx.array(np.arange(last - 3, last + 1, dtype=np.int64).astype(np.int32)), 8)
    assert np.array_equal(to_numpy(by_offset), to_numpy(by_positions))
    with pytest.raises(ValueError, match="int32"):
        ops.rope(x, last - 2, 8)  # the last position would be 2^31


# ----------------------------------------------------------------------------- GGUF metadata amplification

def _gguf_with_metadata(path, entries: bytes, n_kv: int) -> None:
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, n_kv) + entries)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_many_nested_empty_arrays_are_refused_not_built(tmp_path):
    # 12 bytes of file per empty inner array; each was ~200 bytes of Python objects (a 69 MiB file of them took
    # 2.2 GiB and 22 s). Past MAX_NESTED_ARRAYS: GGUFFormatError at once.
    n = ggext_gguf.MAX_NESTED_ARRAYS + 1
    inner = struct.pack("<IQ", ValueType.UINT8, 0)
    payload = _key("a") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.ARRAY, n) + inner * n
    path = tmp_path / "nested.gguf"
    _gguf_with_metadata(path, payload, 1)
    with pytest.raises(GGUFFormatError, match="nested arrays"):
        ggext_gguf.load(path)


def test_nested_arrays_up_to_the_limit_load(tmp_path):
    n = ggext_gguf.MAX_NESTED_ARRAYS
    inner = struct.pack("<IQ", ValueType.INT32, 1) + struct.pack("<i", 7)
    path = tmp_path / "nested_ok.gguf"
    _gguf_with_metadata(path, _key("a") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.ARRAY, n) + inner * n, 1)
    value = ggext_gguf.load(path).metadata["a"]
    assert len(value) == n and all(v.tolist() == [7] for v in value[:3] + value[-3:])


@pytest.mark.parametrize("limit, build", [
    ("MAX_METADATA_STRINGS", lambda: {"tokens": ["a", "b", "c", "d", "e"]}),
    ("MAX_METADATA_KEYS", lambda: {f"k{i}": i for i in range(5)}),
])
def test_metadata_counts_past_the_limits_are_refused(tmp_path, monkeypatch, limit, build):
    path = tmp_path / "many.gguf"
    ggext_gguf.save(path, build(), {})
    assert ggext_gguf.load(path).metadata == build()
    monkeypatch.setattr(ggext_gguf, limit, 4)
    with pytest.raises(GGUFFormatError, match="limit"):
        ggext_gguf.load(path)


def test_tensor_count_past_the_limit_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "tensors.gguf"
    ggext_gguf.save(path, {}, {f"t{i}": np.full(4, i, np.float32) for i in range(5)})
    assert len(ggext_gguf.load(path).tensors) == 5
    monkeypatch.setattr(ggext_gguf, "MAX_TENSORS", 4)
    with pytest.raises(GGUFFormatError, match="tensor count 5 is past this reader's limit of 4"):
        ggext_gguf.load(path)
