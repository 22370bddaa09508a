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


# ---------------------------------------------------------------------------------------------------
# dequantize
# ---------------------------------------------------------------------------------------------------
QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
               "IQ4_XS", "MXFP4"]
FLOAT_TYPES = ["F32", "F16", "BF16"]


def same_bits_or_both_nan(got: np.ndarray, expected: np.ndarray) -> bool:
    nan = np.isnan(expected)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan], expected[~nan])
                and np.array_equal(np.signbit(got[~nan]), np.signbit(expected[~nan])))


def rounded_to(expected_f32: np.ndarray, dtype: str) -> np.ndarray:
    _, to_storage, to_f32 = DTYPES[dtype]
    return to_f32(to_storage(expected_f32))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("type_name", QUANT_TYPES + FLOAT_TYPES)
def test_dequantize_every_byte_pattern(metal, type_name, dtype):
    """Random bytes (NaN/inf/subnormal scales included) decode to gguf's float32 bits, rounded once for
    float16/bfloat16."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 7 if block_size > 1 else 300
    rng = np.random.default_rng(int(qtype) * 3 + len(dtype))
    data = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf scales are part of the test
        expected = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(-1)
    units = n_blocks * block_size // 16 if block_size > 1 else n_blocks
    storage = DTYPES[dtype][0]
    out = metal.dispatch(f"dequantize_{type_name.lower()}_{dtype}", groups=(-(-units // 64),), threads=(64,),
                         buffers={0: data, 1: np.full(expected.size, 0xFF, storage),
                                  2: np.array([units], np.uint32)}, seed=int(qtype))
    got = DTYPES[dtype][2](out[1])
    assert same_bits_or_both_nan(got, rounded_to(expected, dtype)), type_name
