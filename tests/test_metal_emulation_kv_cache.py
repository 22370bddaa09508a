"""kernels/metal/kv_cache.metal (ops.kv_cache_append's Metal copies) in the project's Metal emulator (tests/metal_emu;
see tests/test_metal_emulation.py's docstring), launched with the plan csrc/backend/metal encodes (launch_plans.h's
plan_rows_copy): the rows land bit for bit where numpy puts them, read through any strides, and no other element of
the buffer changes. Nothing here ran on Apple hardware."""
import sys

import numpy as np
import pytest

from metal_emu import emulator as emu

pytestmark = [
    pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the Metal emulator is for Linux CI (ucontext fibers, guard pages); on a Mac run "
                              "the op itself: MLX_GGML_EXT_DEVICE=gpu pytest -q tests/test_kv_cache.py"),
]

WORDS = {2: np.uint16, 4: np.uint32}


@pytest.fixture(scope="module")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu_kv_cache"), [emu.METAL_DIR / "kv_cache.metal"])


def run(metal, element_bytes, src, dst_rows, row0, seed=0):
    """src: an (B, H, T, D) numpy view (any strides, in elements of its own base array) copied into rows row0.. of a
    (B, H, dst_rows, D) buffer that starts filled with a sentinel."""
    B, H, T, D = src.shape
    base = src.base if src.base is not None else src
    itemsize = src.itemsize
    strides = [s // itemsize for s in src.strides]
    offset = (src.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // itemsize
    assert offset == 0, "bind views at their first element"
    plan = metal.plan("rows_copy", element_bytes=element_bytes, batch=B, heads=H, rows=T, dim=D,
                      strides=",".join(map(str, strides)), dst_rows=dst_rows, row0=row0)
    assert plan["kernel"] == f"rows_copy_u{8 * element_bytes}"
    assert plan["threads"] == 256 and plan["groups"] == [-(-T * D // 256), B * H, 1]
    sentinel = np.full((B, H, dst_rows, D), 0xA5A5A5A5 & ((1 << (8 * element_bytes)) - 1), WORDS[element_bytes])
    out = metal.dispatch_plan(plan, {0: np.ascontiguousarray(base), 1: sentinel}, args_index=2, seed=seed)
    got = out[1].view(WORDS[element_bytes]).reshape(B, H, dst_rows, D)
    expected = sentinel.copy()
    expected[:, :, row0:row0 + T] = src.view(WORDS[element_bytes]) if src.dtype != WORDS[element_bytes] else src
    np.testing.assert_array_equal(got, expected)


def words(rng, shape, element_bytes):
    return rng.integers(0, 1 << (8 * element_bytes), size=shape, dtype=np.uint64).astype(WORDS[element_bytes])


@pytest.mark.parametrize("element_bytes", [2, 4])
@pytest.mark.parametrize("B,H,T,D,dst_rows,row0", [
    (1, 8, 1, 64, 256, 5),     # a decode token's row into a 256-row cache
    (1, 2, 7, 3, 9, 2),        # odd sizes: a partial threadgroup per head
    (2, 3, 40, 16, 64, 24),    # a prefill's rows, two batches, past one threadgroup per head
    (1, 1, 3, 100, 3, 0),      # filling the buffer exactly
])
def test_rows_land_where_numpy_puts_them(metal, element_bytes, B, H, T, D, dst_rows, row0):
    rng = np.random.default_rng(B * 1000 + T * 10 + D)
    run(metal, element_bytes, words(rng, (B, H, T, D), element_bytes), dst_rows, row0, seed=T)


@pytest.mark.parametrize("element_bytes", [2, 4])
def test_strided_rows(metal, element_bytes):
    """rope_qkv's k and v views: (B, T, H, D) memory read as (B, H, T, D); a transposed head dim too."""
    rng = np.random.default_rng(7)
    tokens_major = words(rng, (2, 5, 3, 8), element_bytes)
    run(metal, element_bytes, tokens_major.transpose(0, 2, 1, 3), 12, 4)
    dim_major = words(rng, (1, 2, 8, 6), element_bytes)
    run(metal, element_bytes, dim_major.transpose(0, 1, 3, 2), 7, 1)


def test_old_rows_into_a_new_buffer(metal):
    """The copy of a cache that moves to a bigger buffer: its rows 0..offset from a (B, H, capacity, D) layout."""
    rng = np.random.default_rng(3)
    cache = words(rng, (2, 4, 16, 8), 2)
    run(metal, 2, cache[:, :, :10], 32, 0)
