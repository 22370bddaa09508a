"""Rotary embedding with per-dimension frequency factors from the file (llama.cpp's `rope_freqs.weight`).

llama.cpp's converter does not store Llama 3.1+'s "llama3" rope scaling as metadata: it bakes it into one
factor per rotated pair, and ggml divides that pair's angle by the factor. mx.fast.rope takes the pair's
period (base ** (2i / dims)) instead of a base, so the factor multiplies the period."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class FactorRoPE(nn.Module):
    def __init__(self, dims: int, base: float, traditional: bool, factors: mx.array):
        super().__init__()
        if tuple(factors.shape) != (dims // 2,):
            raise ValueError(f"rope_freqs must have {dims // 2} factors (one per rotated pair of {dims} dims), "
                             f"got shape {tuple(factors.shape)}")
        self.dims = dims
        self.traditional = traditional
        periods = mx.power(mx.array(base, mx.float32), mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        self._periods = periods * factors.astype(mx.float32)

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}, per-pair factors"

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset,
                            freqs=self._periods)
