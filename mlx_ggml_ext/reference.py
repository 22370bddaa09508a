"""float64 numpy references written from ../shared/SPEC.md, used by the tests and by
`python -m mlx_ggml_ext` to check the ops. Plain math, no MLX."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * np.asarray(weight, dtype=np.float64)


def rope(x: np.ndarray, positions, n_dims: int, mode: str = "normal", freq_base: float = 10000.0,
         freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
         beta_slow: float = 1.0, n_ctx_orig: int = 0, freq_factors=None, inverse: bool = False,
         angle_dtype=np.float32) -> np.ndarray:
    """ggml rope_ext on x (..., T, H, D), positions (T,), mode 'normal' or 'neox'.

    The angle follows the SPEC's float32 arithmetic step by step (theta = (float)pos,
    theta *= theta_scale, the YaRN mix), because those roundings are part of ggml's
    semantics: at positions near 1e5 the float32 iterated product alone moves the result
    by an NMSE of about 5e-7 from the same product in float64. cos, sin and the
    rotation are float64. inverse=True rotates by minus the angle (the vjp).
    angle_dtype=np.float64 computes the angle chain in float64 instead (exact math, for
    finite differences and to measure how far ggml's float32 semantics are from it)."""
    f32 = np.float32
    fa = np.dtype(angle_dtype).type
    x = np.asarray(x, dtype=np.float64)
    half = n_dims // 2
    # powf(freq_base, -2.0f/n_dims), rounded once from double
    theta_scale = fa(np.float64(f32(freq_base)) ** np.float64(f32(-2.0) / f32(n_dims)))
    ramp = np.zeros(half, dtype=f32)
    mscale = f32(attn_factor)
    if ext_factor != 0.0:
        with np.errstate(divide="ignore"):
            def corr_dim(beta):
                return (f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(beta) * f32(2.0) * f32(np.pi)))
                        / (f32(2.0) * np.log(f32(freq_base))))
            low = max(f32(0.0), np.floor(corr_dim(beta_fast)))
            high = min(f32(n_dims - 1), np.ceil(corr_dim(beta_slow)))
        y = (np.arange(half, dtype=f32) - f32(low)) / max(f32(0.001), f32(high - low))
        ramp = ((f32(1.0) - np.clip(y, f32(0.0), f32(1.0))) * f32(ext_factor)).astype(f32)
        mscale = f32(mscale * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / f32(freq_scale))))
    factors = np.ones(half, dtype=fa) if freq_factors is None else np.asarray(freq_factors).astype(fa)
    ramp = ramp.astype(fa)

    theta = np.asarray(positions).astype(fa)
    angles = np.empty((theta.shape[0], half), dtype=fa)
    for i in range(half):
        extrap = theta / factors[i]
        interp = fa(freq_scale) * extrap
        angles[:, i] = interp if ext_factor == 0.0 else interp * (fa(1.0) - ramp[i]) + extrap * ramp[i]
        theta = theta * theta_scale
    a = angles.astype(np.float64)[:, None, :]  # (T, 1, half) against (..., T, H, half)
    cos, sin = np.cos(a) * float(mscale), np.sin(a) * float(mscale) * (-1.0 if inverse else 1.0)

    y = x.copy()
    if mode == "normal":
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        y[..., 0:n_dims:2], y[..., 1:n_dims:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    elif mode == "neox":
        x0, x1 = x[..., :half], x[..., half:n_dims]
        y[..., :half], y[..., half:n_dims] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return y
