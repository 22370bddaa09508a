"""The package's operations. Each checks its Python-level arguments and calls the
C++ primitive; shapes, dtypes and values are validated in C++ (ValueError /
TypeError naming the offending argument)."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from . import _ext

Stream = Optional[mx.Stream | mx.Device]


def _require_array(name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, mx.array):
        raise TypeError(f"{name} must be an mlx.core.array, got {type(value).__name__}")


def rms_norm(x: mx.array, weight: Optional[mx.array] = None, eps: float = 1e-6, *,
             stream: Stream = None) -> mx.array:
    """Fused RMSNorm over the last axis: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    float32, float16 or bfloat16 input of any leading shape; ``weight`` of shape
    ``(D,)`` or None. Float32 accumulation and one rounding to the output dtype
    (x's, promoted with weight's). Differentiable in x and weight; supports vmap
    and mx.compile.
    """
    _require_array("x", x)
    _require_array("weight", weight, optional=True)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    return _ext.rms_norm(x, weight, float(eps), stream=stream)


__all__ = ["rms_norm"]
