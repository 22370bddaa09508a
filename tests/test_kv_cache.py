"""ops.kv_cache_append: new key/value rows appended to an attention cache, against numpy's concatenation, and
written in place where the cache's buffer has room. Runs on the device of MLX_GGML_EXT_DEVICE (the Metal kernel has
run only in the emulator: tests/test_metal_emulation_kv_cache.py)."""

import gc

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import ops
from conftest import DEVICE, METAL
from harness import DTYPES, random_array, to_numpy


def check(got, cache, rows, offset):
    """A copy changes no bit: equal to numpy's concatenation, dtype and shape included."""
    want = np.concatenate([to_numpy(cache)[:, :, :offset], to_numpy(rows.astype(cache.dtype))], axis=2)
    assert got.dtype == cache.dtype and got.shape == want.shape
    np.testing.assert_array_equal(to_numpy(got), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,R,T,offset,D", [
    (1, 8, 256, 1, 17, 64),     # a decode token into a cache mlx-lm made
    (1, 2, 0, 5, 0, 8),         # a prefill into an empty cache
    (2, 3, 12, 4, 12, 16),      # after the last row: a new buffer
    (1, 1, 9, 1, 8, 3),         # one head, odd sizes
    (2, 2, 10, 0, 3, 8),        # no new rows: the first three
])
def test_rows_land_where_concatenation_puts_them(dtype, B, H, R, T, offset, D):
    rng = np.random.default_rng(R * 31 + T)
    cache, rows = random_array(rng, (B, H, R, D), dtype), random_array(rng, (B, H, T, D), dtype)
    check(ops.kv_cache_append(cache, rows, offset), cache, rows, offset)


def test_a_decode_loop_writes_in_place_and_matches_concatenation():
    """Each output fed back as the next cache: the rows so far are the concatenation of every step's rows, and
    MLX's memory does not grow by a buffer a step (a 64 MB cache, 8 steps); at `step` rows a new buffer."""
    S, D = 8192, 256
    cache = mx.array(np.zeros((1, 8, S, D), np.float32))  # memory of its own, as mlx-lm's after a prefill
    mx.eval(cache)
    rng = np.random.default_rng(5)
    steps = [random_array(rng, (1, 8, 1, D), mx.float32) for _ in range(8)]
    mx.eval(steps)
    gc.collect()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    offset = 3
    for rows in steps:
        cache = ops.kv_cache_append(cache, rows, offset)
        mx.eval(cache)
        offset += 1
    if DEVICE == mx.cpu or METAL:  # on CUDA, MLX counts only what its allocator handed out
        assert mx.get_peak_memory() - base < S * D * 4
    got = to_numpy(cache)
    assert got.shape == (1, 8, 11, D)
    assert not got[:, :, :3].any()
    np.testing.assert_array_equal(got[:, :, 3:], np.concatenate([to_numpy(r) for r in steps], axis=2))


def test_a_full_buffer_moves_to_one_of_step_rows():
    rng = np.random.default_rng(11)
    cache = ops.kv_cache_append(random_array(rng, (1, 2, 0, 4), mx.float16),
                                random_array(rng, (1, 2, 3, 4), mx.float16), 0, step=4)  # a buffer of 4 rows
    parts = [to_numpy(cache)]
    for t in range(3):  # the 4th row in place, then a buffer of 8 rows, then in place again
        rows = random_array(rng, (1, 2, 1, 4), mx.float16)
        cache = ops.kv_cache_append(cache, rows, 3 + t, step=4)
        parts.append(to_numpy(rows))
    np.testing.assert_array_equal(to_numpy(cache), np.concatenate(parts, axis=2))


def test_strided_inputs_are_read_as_they_are():
    """Rows in rope_qkv's layout (a transposed view) and with a step, a cache sliced out of a larger array."""
    rng = np.random.default_rng(3)
    rows = random_array(rng, (2, 6, 3, 8), mx.float32).swapaxes(1, 2)            # (2, 3, 6, 8), token-major
    cache = random_array(rng, (2, 5, 16, 8), mx.float32)[:, 1:4]                 # (2, 3, 16, 8)
    stepped = random_array(rng, (2, 3, 6, 16), mx.float32)[..., ::2]             # (2, 3, 6, 8)
    mx.eval(rows, cache, stepped)
    check(ops.kv_cache_append(cache, rows, 7), cache, rows, 7)
    check(ops.kv_cache_append(cache, stepped, 16), cache, stepped, 16)


@pytest.mark.parametrize("held", ["array", "view"])
def test_a_held_cache_is_not_written(held):
    """A cache the caller still holds, or a view of whose memory is alive, keeps its numbers: the op writes a
    new buffer (here the appended row would land inside the held one's memory otherwise)."""
    rng = np.random.default_rng(4)
    big = random_array(rng, (1, 2, 8, 4), mx.float16) + 0
    cache = big[:, :, :3]
    mx.eval(cache)
    before = to_numpy(big).copy()
    if held == "view":
        del big
        keep = cache[:, :, :1] + 0
        mx.eval(keep)
    rows = random_array(rng, (1, 2, 2, 4), mx.float16)
    out = ops.kv_cache_append(cache, rows, 3)
    mx.eval(out)
    check(out, mx.array(before).astype(mx.float16), rows, 3)
    np.testing.assert_array_equal(to_numpy(cache), before[:, :, :3])
    if held == "array":
        np.testing.assert_array_equal(to_numpy(big), before)


def test_rows_are_converted_to_the_caches_dtype():
    rng = np.random.default_rng(6)
    cache, rows = random_array(rng, (1, 2, 6, 4), mx.bfloat16), random_array(rng, (1, 2, 2, 4), mx.float32)
    check(ops.kv_cache_append(cache, rows, 3), cache, rows, 3)


def unfused(cache, rows, offset):
    """The same array by MLX's ops."""
    return mx.concatenate([cache[:, :, :offset], rows.astype(cache.dtype)], axis=2)


def test_vjp_jvp_vmap_are_the_unfused_graphs():
    rng = np.random.default_rng(7)
    cache, rows = random_array(rng, (1, 2, 6, 4), mx.float32), random_array(rng, (1, 2, 2, 4), mx.float32)
    w = random_array(rng, (1, 2, 4, 4), mx.float32)
    got = mx.grad(lambda c, r: (ops.kv_cache_append(c, r, 2) * w).sum(), argnums=(0, 1))(cache, rows)
    want = mx.grad(lambda c, r: (unfused(c, r, 2) * w).sum(), argnums=(0, 1))(cache, rows)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(to_numpy(g), to_numpy(e))
    assert not to_numpy(got[0])[:, :, 2:].any() and to_numpy(got[1]).all()
    tangents = [random_array(rng, a.shape, mx.float32) for a in (cache, rows)]
    _, got = mx.jvp(lambda c, r: ops.kv_cache_append(c, r, 4), [cache, rows], tangents)
    _, want = mx.jvp(lambda c, r: unfused(c, r, 4), [cache, rows], tangents)
    np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(want[0]))
    caches, rowss = mx.stack([cache, cache * 2]), mx.stack([rows, rows * 3])
    out = mx.vmap(lambda c, r: ops.kv_cache_append(c, r, 5))(caches, rowss)
    for i in range(2):
        check(out[i], caches[i], rowss[i], 5)


def test_compiled_and_shapeless():
    rng = np.random.default_rng(9)
    cache, rows = random_array(rng, (1, 2, 8, 4), mx.float16), random_array(rng, (1, 2, 1, 4), mx.float16)
    for shapeless in (False, True):
        fn = mx.compile(lambda c, r: ops.kv_cache_append(c, r, 5), shapeless=shapeless)
        check(fn(cache, rows), cache, rows, 5)
    with pytest.raises(ValueError, match=r"offset must be in \[0, 4\]"):  # checked again at the new shapes
        mx.eval(fn(cache[:, :, :4], rows))


@pytest.mark.parametrize("case,error,match", [
    ("ndim", ValueError, "cache must be 4-D"),
    ("heads", ValueError, "rows must share batch, heads and head_dim"),
    ("head_dim", ValueError, "rows must share batch, heads and head_dim"),
    ("past_the_rows", ValueError, r"offset must be in \[0, 8\]"),
    ("negative", ValueError, "offset must be in"),
    ("huge", ValueError, "offset must be in"),
    ("step", ValueError, "step must be in"),
    ("bool", TypeError, "offset must be an int"),
    ("float_offset", TypeError, "offset must be an int"),
    ("int_cache", TypeError, "cache"),
    ("int_rows", TypeError, "rows"),
    ("not_array", TypeError, "rows must be an mlx.core.array"),
])
def test_bad_input_raises(case, error, match):
    cache, rows, offset, step = mx.zeros((1, 2, 8, 4)), mx.zeros((1, 2, 3, 4)), 2, 256
    if case == "ndim":
        cache = mx.zeros((2, 8, 4))
    elif case == "heads":
        rows = mx.zeros((1, 3, 3, 4))
    elif case == "head_dim":
        rows = mx.zeros((1, 2, 3, 5))
    elif case == "past_the_rows":
        offset = 9
    elif case == "negative":
        offset = -1
    elif case == "huge":
        offset = 2**31
    elif case == "step":
        step = 0
    elif case == "bool":
        offset = True
    elif case == "float_offset":
        offset = 2.0
    elif case == "int_cache":
        cache = mx.zeros((1, 2, 8, 4), dtype=mx.int32)
    elif case == "int_rows":
        rows = mx.zeros((1, 2, 3, 4), dtype=mx.int32)
    elif case == "not_array":
        rows = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(error, match=match):
        mx.eval(ops.kv_cache_append(cache, rows, offset, step))


def test_on_the_default_device_stream():
    """The op on the stream of MLX_GGML_EXT_DEVICE given explicitly (the CPU, CUDA or Metal kernel)."""
    rng = np.random.default_rng(10)
    cache, rows = random_array(rng, (1, 2, 8, 4), mx.float32), random_array(rng, (1, 2, 1, 4), mx.float32)
    check(ops.kv_cache_append(cache, rows, 3, stream=DEVICE), cache, rows, 3)
