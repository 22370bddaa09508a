"""Rotary embedding with per-dimension frequency factors from the file (llama.cpp's `rope_freqs.weight`).

llama.cpp's converter does not store Llama 3.1+'s "llama3" rope scaling as metadata: it bakes it into one
factor per rotated pair, and ggml divides that pair's angle by the factor. mx.fast.rope takes the pair's
period (base ** (2i / dims)) instead of a base, so the factor multiplies the period."""

from __future__ import annotations

import contextlib
import threading

import mlx.core as mx
import mlx.nn as nn

from .. import _ext


class FactorRoPE(nn.Module):
    def __init__(self, dims: int, base: float, traditional: bool, factors: mx.array):
        super().__init__()
        if tuple(factors.shape) != (dims // 2,):
            raise ValueError(f"rope_freqs must have {dims // 2} factors (one per rotated pair of {dims} dims), "
                             f"got shape {tuple(factors.shape)}")
        self.dims = dims
        self.traditional = traditional
        self.base = float(base)
        self._factors = factors.astype(mx.float32)
        periods = mx.power(mx.array(base, mx.float32), mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        self._periods = periods * self._factors

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}, per-pair factors"

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset,
                            freqs=self._periods)


# Positions shared by the layers of one forward pass (a dict while `sharing_positions` is active on this thread).
# Scoped to the pass, never kept: under mx.compile the arrays are the trace's own.
_forward = threading.local()


@contextlib.contextmanager
def sharing_positions():
    previous = getattr(_forward, "positions", None)
    _forward.positions = {}
    try:
        yield
    finally:
        _forward.positions = previous


class GGMLRoPE(nn.Module):
    """MLX's `nn.RoPE` (or a FactorRoPE: ggml's freq_factors) computed by the package's `ops.rope` on the CPU and by
    `mx.fast.rope` elsewhere. On the CPU ops.rope takes about half mx.fast.rope's time for a decode token's queries
    (measured). mlx-lm's x is (B, heads, L, D), which ops.rope takes as it is (heads_first: no reshape nodes), and
    every layer of a token shares one positions array (one arange node per token, not two per layer). `scale`
    multiplies positions (ggml's freq_scale)."""

    def __init__(self, rope: "nn.RoPE | FactorRoPE"):
        super().__init__()
        self.dims, self.traditional = rope.dims, rope.traditional
        self.base, self.scale = float(rope.base), float(getattr(rope, "scale", 1.0))
        self._mode = "normal" if self.traditional else "neox"
        # A FactorRoPE's per-pair factors (ggml's freq_factors) and mx.fast.rope's periods with them; None for nn.RoPE.
        self._factors = getattr(rope, "_factors", None)
        self._periods = getattr(rope, "_periods", None)

    def _extra_repr(self) -> str:
        factors = ", per-pair factors" if self._factors is not None else ""
        return f"{self.dims}, traditional={self.traditional}, base={self.base}, scale={self.scale}{factors}"

    def _mlx(self, x: mx.array, offset) -> mx.array:
        if self._periods is not None:
            return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=self.scale,
                                offset=offset, freqs=self._periods)
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                            offset=offset)

    @staticmethod
    def _positions(offset: int, length: int) -> mx.array:
        shared = getattr(_forward, "positions", None)
        if shared is None:  # outside a model's forward pass: nothing to share
            return mx.arange(offset, offset + length, dtype=mx.int32)
        positions = shared.get((offset, length))
        if positions is None:
            positions = shared[(offset, length)] = mx.arange(offset, offset + length, dtype=mx.int32)
        return positions

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if mx.default_device() != mx.cpu or x.ndim != 4:
            return self._mlx(x, offset)
        length = x.shape[2]
        if isinstance(offset, mx.array):
            if offset.ndim != 0:  # per-sequence offsets of a batched cache
                return self._mlx(x, offset)
            positions = offset.astype(mx.int32) + mx.arange(length, dtype=mx.int32)
        elif 0 <= offset and offset + length < 2**31:
            positions = self._positions(int(offset), length)
        else:
            positions = offset  # the op checks and builds what does not fit int32
        # The extension's rope directly: the arguments are valid by construction, and ops.rope's checks would
        # cost a few microseconds per call, twice per layer and token.
        return _ext.rope(x, positions, self.dims, self._mode, self.base, self.scale, freq_factors=self._factors,
                         heads_first=True)
