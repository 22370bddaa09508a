"""ggml tensor types and a tensor of raw ggml blocks.

Block sizes and byte counts follow ggml (docs/formats.md); the C++ side defines the
same layouts once in kernels/common/. This module imports only the compiled extension,
never ops.py (ops imports this one)."""

from __future__ import annotations

import enum
import math
from typing import Sequence

import mlx.core as mx

from . import _ext


class GGMLType(enum.IntEnum):
    """ggml's type ids (as stored in GGUF files) for the formats this package handles."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39

    @property
    def block_size(self) -> int:
        """Elements per block."""
        return _LAYOUT[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return _LAYOUT[self][1]

    @property
    def is_float(self) -> bool:
        return self in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of n elements; n must be a multiple of the block size."""
        if n % self.block_size:
            raise ValueError(f"{self.name} rows must hold a multiple of {self.block_size} elements, got {n}")
        return n // self.block_size * self.type_size

    @classmethod
    def of(cls, value: "GGMLType | str | int") -> "GGMLType":
        """Accepts a GGMLType, a name in any case ("q4_k", "Q4_K") or a ggml type id."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"unknown ggml type {value!r}; known: "
                                 f"{', '.join(t.name.lower() for t in cls)}") from None
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"unsupported ggml type id {value}") from None
        raise TypeError(f"ggml_type must be a GGMLType, a name or an id, got {type(value).__name__}")


_LAYOUT = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34),
    GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210),
    GGMLType.IQ4_NL: (32, 18), GGMLType.IQ4_XS: (256, 136), GGMLType.MXFP4: (32, 17),
    GGMLType.IQ2_XXS: (256, 66), GGMLType.IQ2_XS: (256, 74), GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ3_XXS: (256, 98), GGMLType.IQ3_S: (256, 110), GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ1_M: (256, 56), GGMLType.TQ1_0: (256, 54), GGMLType.TQ2_0: (256, 66),
}


class GGMLTensor:
    """Raw ggml blocks plus their logical shape.

    data: uint8 mx.array of shape (rows, bytes_per_row) (a flat (rows * bytes_per_row,)
    array is accepted and reshaped); shape: the logical MLX shape, last axis = ggml's ne0,
    rows = product of the other axes.
    """

    def __init__(self, data: mx.array, ggml_type: "GGMLType | str | int", shape: Sequence[int]):
        self.ggml_type = GGMLType.of(ggml_type)
        if not isinstance(data, mx.array):
            raise TypeError(f"data must be a uint8 mlx.core.array, got {type(data).__name__}")
        if data.dtype != mx.uint8:
            raise TypeError(f"data must have dtype uint8, got {data.dtype}")
        shape = tuple(int(s) for s in shape)
        if not shape or any(s < 0 for s in shape):
            raise ValueError(f"shape must have at least one non-negative dimension, got {shape}")
        row_bytes = self.ggml_type.row_bytes(shape[-1])
        rows = math.prod(shape[:-1])
        if data.ndim == 1 and data.size == rows * row_bytes:
            data = data.reshape(rows, row_bytes)
        if tuple(data.shape) != (rows, row_bytes):
            raise ValueError(
                f"{self.ggml_type.name} tensor of shape {shape} needs {rows} x {row_bytes} bytes "
                f"(rows x bytes per row), got data of shape {tuple(data.shape)}")
        self.data = data
        self.shape = shape

    @property
    def nbytes(self) -> int:
        return self.data.size

    def dequantize(self, dtype: mx.Dtype = mx.float32, *, stream=None) -> mx.array:
        """The tensor as floats of the logical shape (``ops.dequantize`` on this tensor's blocks)."""
        if not isinstance(dtype, mx.Dtype):
            raise TypeError(f"dtype must be an mlx.core.Dtype, got {type(dtype).__name__}")
        # The primitive directly, not ops.dequantize: ops imports this module, and the data, type and
        # shape were already checked by the constructor.
        return _ext.dequantize(self.data, int(self.ggml_type), list(self.shape), dtype, stream=stream)

    def __repr__(self) -> str:
        return f"GGMLTensor({self.ggml_type.name}, shape={self.shape}, {self.nbytes} bytes)"
