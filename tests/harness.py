"""Shared helpers: per-op tolerances, conversions and comparison against float64 references."""

import mlx.core as mx
import numpy as np

DTYPES = [mx.float32, mx.float16, mx.bfloat16]

# Relative error bounds against a float64 reference, per op and output dtype: one
# rounding of the output dominates (half an ulp: 2^-11 fp16, 2^-8 bf16), plus float32
# accumulation for float32.
TOLERANCES = {
    "rms_norm": {mx.float32: 2e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3},
    "rope": {mx.float32: 2e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3},
}


def to_numpy(a: mx.array) -> np.ndarray:
    """float64 copy of an mx.array (bfloat16 goes through float32)."""
    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)
    return np.array(a, copy=True).astype(np.float64)


def random_array(rng: np.random.Generator, shape, dtype, scale=1.0) -> mx.array:
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)


def assert_close(actual: mx.array, expected: np.ndarray, op: str, dtype, scale=None):
    """max |actual - expected| <= tol * max(|expected|) (elementwise-relative to the row scale)."""
    tol = TOLERANCES[op][dtype]
    got = to_numpy(actual)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    ref_scale = np.max(np.abs(expected)) if scale is None else scale
    err = np.max(np.abs(got - expected)) if got.size else 0.0
    assert err <= tol * max(ref_scale, 1e-30), f"{op} {dtype}: max error {err:.3e} > {tol:.1e} * {ref_scale:.3e}"


def nmse(actual, expected) -> float:
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-300))
