"""The Metal kernels (kernels/metal/*.metal), verified without Apple hardware.

1. The Metal-language check: every .metal file compiles as C++ against the project's Metal shim
   (tests/metal_emu/metal_stdlib) with warnings as errors.
2. The emulator: the kernels run on the CPU with Metal's execution model (tests/metal_emu/runtime.cpp:
   concurrent lanes per threadgroup, real barriers and simdgroup collectives, guarded buffers, shuffled
   lane order), dispatched with the grid and arguments csrc/backend/metal uses, and compared with
   independent references (gguf, float64 numpy) under the tolerances of the other backends.

Needs only g++. Nothing here ran on a Mac: Apple's compiler and GPU may still disagree (see README).
"""

import shutil

import numpy as np
import pytest

from metal_emu import emulator as emu
from metal_emu.emulator import DTYPES

pytestmark = pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++")

# Relative to the largest reference magnitude, as tests/harness.py's TOLERANCES.
TOL = {"f32": 2e-6, "f16": 1e-3, "bf16": 8e-3}


@pytest.fixture(scope="session")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu"))


def assert_close(got, expected, tol, what=""):
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.1e} * {scale:.3e}"


# ---------------------------------------------------------------------------------------------------
# 1. Metal-language check
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("metal_file", emu.metal_sources(), ids=lambda p: p.name)
def test_metal_source_compiles(metal_file, tmp_path):
    result = emu.compile_check(metal_file, tmp_path)
    assert result.returncode == 0, result.stderr


def test_compile_check_rejects_a_type_error(tmp_path):
    """The check can fail: a kernel storing a pointer into a float is an error."""
    bad = tmp_path / "bad.metal"
    bad.write_text('#include "kernels/metal/common.h"\n'
                   "[[kernel]] void bad(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
                   "  y[i] = y;\n}\n")
    assert emu.compile_check(bad, tmp_path).returncode != 0


# ---------------------------------------------------------------------------------------------------
# rms_norm
# ---------------------------------------------------------------------------------------------------
def rms_norm_reference(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


def rms_norm_args(dim, rows_per_weight, weighted, eps):
    return np.array([dim, rows_per_weight, int(weighted)], np.uint32).tobytes() + np.float32(eps).tobytes()


def rms_norm_threads(dim):
    # csrc/backend/metal: one simdgroup per 128 elements, 32..256 threads.
    return int(min(256, max(32, -(-dim // 128) * 32)))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dim,rows,weighted", [(1, 3, True), (33, 4, False), (200, 3, True), (1100, 2, True)])
def test_rms_norm(metal, dtype, dim, rows, weighted):
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng = np.random.default_rng(dim)
    x = to_storage(rng.standard_normal((rows, dim)) * 3)
    w = to_storage(rng.standard_normal(dim))
    eps = 1e-5
    out = metal.dispatch(f"rms_norm_{dtype}", groups=(rows,), threads=(rms_norm_threads(dim),),
                         buffers={0: x, 1: w if weighted else x, 2: np.full(x.shape, 0xFF, storage),
                                  3: rms_norm_args(dim, rows, weighted, eps)},
                         threadgroup={0: 128}, seed=dim)
    got = to_f32(out[2]).reshape(rows, dim)
    expected = rms_norm_reference(to_f32(x), to_f32(w) if weighted else None, eps)
    assert_close(got, expected, TOL[dtype], f"rms_norm {dtype}")
