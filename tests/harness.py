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


def ties_and_one_hot_q8_0(rng, n: int, k: int):
    """x (2, k) float32 whose 32-element blocks each hold +-127 (so the activation scale is exactly 1) and otherwise
    ties (j + 0.5) and their float neighbours, with its codes: to the nearest integer, ties to even (as ggml's x86
    quantizer rounds Q8_0 activations; its C reference rounds ties away from zero);
    and a Q8_0 weight whose row j has code 1 at element j % k and scale 1, so that (x @ W^T)[:, j] is x's code of
    element j % k itself."""
    halves = rng.integers(-253, 254, (2, k)).astype(np.float32) / 2
    step = rng.integers(-1, 2, (2, k))  # a tie, or the float just below or above it
    x = np.where(step < 0, np.nextafter(halves, np.float32(-np.inf)),
                 np.where(step > 0, np.nextafter(halves, np.float32(np.inf)), halves)).astype(np.float32)
    x[:, ::32] = np.where(rng.integers(0, 2, (2, k // 32)) == 1, 127.0, -127.0)
    x[:, 1:6] = [0.5, np.nextafter(np.float32(0.5), np.float32(0)), -2.5, 126.5, -126.5]
    codes = np.rint(x.astype(np.float64))
    blocks = np.zeros((n, k // 32, 34), np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    rows = np.arange(n)
    blocks[rows, rows % k // 32, 2 + rows % 32] = 1
    return x, codes, blocks.reshape(n, -1)
