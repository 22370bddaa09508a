"""kernels/cuda/rope.cu run on the host (tests/cuda_emulation, as test_cuda_emulation.py): ggml's rope_ext against
the float64 reference (modes, YaRN, freq_factors, the inverse rotation, rope_qkv's copied v heads) and rope_qkv's
per-head q/k norms before the rotation."""
import numpy as np
import pytest

from test_cuda_emulation import (BF16, F16, F32, TOL, RopeArgs, kernels, loaded, ptr,  # noqa: F401 (the fixture)
                                 stored)
from mlx_ggml_ext import reference


def rope_constants(n_dims, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig):
    """The host-side constants of csrc/rope.cpp (rope_angles, rope_ramp), as float32."""
    f32 = np.float32
    theta_scale = f32(np.float64(f32(freq_base)) ** np.float64(f32(-2.0) / f32(n_dims)))
    mscale = f32(attn_factor)
    if ext_factor == 0:
        return theta_scale, mscale, None
    corr = lambda beta: f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(beta) * f32(2) * f32(np.pi))) / (
        f32(2) * np.log(f32(freq_base)))
    low, high = max(f32(0), np.floor(corr(beta_fast))), min(f32(n_dims - 1), np.ceil(corr(beta_slow)))
    y = (np.arange(n_dims // 2, dtype=f32) - low) / max(f32(0.001), f32(high - low))
    ramp = ((1 - np.clip(y, 0, 1)) * f32(ext_factor)).astype(f32)
    mscale = f32(mscale * (f32(1) + f32(0.1) * np.log(f32(1) / f32(freq_scale))))
    return theta_scale, mscale, ramp


ROPE_CASES = [  # (batches, tokens, heads, dim, n_dims), YaRN, freq_factors
    ((2, 5, 3, 128, 128), False, False),   # vector path
    ((1, 7, 2, 64, 32), True, True),       # partial rotation, YaRN, factors, vectors
    ((3, 4, 2, 18, 18), False, True),      # scalar path (dim % 8 != 0)
    ((2, 3, 3, 34, 22), True, False),      # scalar path, partial rotation
]


@pytest.mark.parametrize("ftype", [F32, F16, BF16])
@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", ROPE_CASES, ids=str)
@pytest.mark.parametrize("inverse", [False, True])
def test_rope(kernels, ftype, mode, case, inverse):
    # The inverse rotations also copy their last head (rope_qkv's v heads): copying does not depend on the
    # direction, and a parameter of its own doubled this emulated test's time in CI.
    copied = 1 if inverse else 0
    (batches, tokens, heads, dim, n_dims), yarn, with_factors = case
    rng = np.random.default_rng(20 + ftype)
    params = dict(freq_base=10000.0, freq_scale=0.25 if yarn else 1.0, ext_factor=1.0 if yarn else 0.0,
                  attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=4096 if yarn else 0)
    x = stored(rng.standard_normal((batches, tokens, heads, dim)), ftype)
    # positions per batch (two rows: batches_per_positions_row = batches / 2 when even)
    pos_rows = 2 if batches % 2 == 0 else 1
    positions = rng.integers(-3000, 100000, (pos_rows, tokens)).astype(np.int32)
    factors = rng.uniform(1, 4, n_dims // 2).astype(np.float32) if with_factors else None
    theta_scale, mscale, ramp = rope_constants(n_dims, **params)
    y = np.zeros_like(x)
    args = RopeArgs(ptr(x), ptr(y), ptr(positions), ptr(factors) if factors is not None else None,
                    ptr(ramp) if ramp is not None else None, batches, tokens, heads, dim, n_dims,
                    batches // pos_rows, batches, theta_scale, params["freq_scale"], mscale, -1.0 if inverse else 1.0,
                    copied)
    assert kernels.emulated_rope(args, ftype, int(mode == "neox")) == 0
    xs = loaded(x, ftype)
    expected = np.stack([reference.rope(xs[b], positions[b // (batches // pos_rows)], n_dims, mode,
                                        freq_factors=factors, inverse=inverse, **params) for b in range(batches)])
    expected[:, :, heads - copied:] = xs[:, :, heads - copied:]
    err = np.max(np.abs(loaded(y, ftype) - expected))
    assert err <= TOL[ftype] * np.max(np.abs(expected)), err


@pytest.mark.parametrize("ftype", [F32, F16, BF16])
@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", [(2, 3, 5, 128, 128), (1, 2, 4, 80, 32), (1, 3, 3, 18, 18)], ids=str)
def test_rope_with_head_norms(kernels, ftype, mode, case):
    """rope_qkv's per-head norms (Qwen 3 / Gemma 3): heads [0, q_heads) normed with q_norm, the other rotated heads
    with k_norm, the last head copied (v), all before the rotation; float16 in place (rope_qkv's donated buffer)."""
    batches, tokens, heads, dim, n_dims = case
    in_place = ftype == F16
    rng = np.random.default_rng(40 + ftype + dim)
    x = stored(rng.standard_normal((batches, tokens, heads, dim)) * 3, ftype)
    positions = rng.integers(0, 30000, (1, tokens)).astype(np.int32)
    qw, kw = (rng.uniform(0.5, 1.5, dim).astype(np.float32) for _ in range(2))
    q_heads, eps = heads // 2, 1e-5
    theta_scale, mscale, _ = rope_constants(n_dims, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 0)
    xs = loaded(x, ftype)
    y = x if in_place else np.zeros_like(x)
    args = RopeArgs(ptr(x), ptr(y), ptr(positions), None, None, batches, tokens, heads, dim, n_dims, batches, batches,
                    theta_scale, 1.0, mscale, 1.0, 1, ptr(qw), ptr(kw), q_heads, eps)
    assert kernels.emulated_rope(args, ftype, int(mode == "neox")) == 0
    rotated = xs[:, :, :heads - 1]
    normed = rotated / np.sqrt(np.mean(rotated ** 2, axis=-1, keepdims=True) + eps)
    normed = normed * np.where(np.arange(heads - 1) < q_heads, 1, 0)[:, None] * qw + \
        normed * np.where(np.arange(heads - 1) < q_heads, 0, 1)[:, None] * kw
    expected = xs.copy()
    expected[:, :, :heads - 1] = np.stack([reference.rope(normed[b], positions[0], n_dims, mode)
                                           for b in range(batches)])
    err = np.max(np.abs(loaded(y, ftype) - expected))
    assert err <= TOL[ftype] * np.max(np.abs(expected)), err
