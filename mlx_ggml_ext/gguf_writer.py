"""GGUF writing: `save` (re-exported as `mlx_ggml_ext.gguf.save`; see that module for the format)."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping

import mlx.core as mx
import numpy as np

from .gguf import (ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH, MAX_DIMS,
                   _FLOAT_TYPES, _HEADER, _NUMERIC_DTYPES, _SCALAR_STRUCTS, _U32, _U64, Value, ValueType)
from .types import GGMLTensor, GGMLType

_NUMPY_TO_VALUE_TYPE = {np.dtype(d).newbyteorder("="): t for t, d in _NUMERIC_DTYPES.items() if t != ValueType.BOOL}
_NUMPY_TO_VALUE_TYPE[np.dtype(bool)] = ValueType.BOOL


def _int_type_for(lo: int, hi: int, what: str) -> ValueType:
    """INT32 when the values fit (as gguf.GGUFWriter infers), else INT64, else UINT64."""
    for t in (ValueType.INT32, ValueType.INT64, ValueType.UINT64):
        info = np.iinfo(_NUMERIC_DTYPES[t])
        if info.min <= lo and hi <= info.max:
            return t
    raise ValueError(f"{what}: integer {lo if lo < 0 else hi} does not fit a GGUF integer type")


def _scalar_type(obj, what: str) -> "ValueType | None":
    """The inferred type of a scalar, or None when obj is not a scalar."""
    if isinstance(obj, np.generic):  # first: np.float64 is also a float
        t = _NUMPY_TO_VALUE_TYPE.get(obj.dtype)
        if t is None:
            raise TypeError(f"{what}: numpy {obj.dtype} has no GGUF value type")
        return t
    if isinstance(obj, bool):
        return ValueType.BOOL
    if isinstance(obj, int):
        return _int_type_for(obj, obj, what)
    if isinstance(obj, float):
        return ValueType.FLOAT32  # as gguf.GGUFWriter; use np.float64 or Value for FLOAT64
    if isinstance(obj, str):
        return ValueType.STRING
    return None


def _to_value(obj, what: str) -> Value:
    """Normalizes a metadata value into a Value with concrete types (arrays: numpy arrays
    for numbers and bools, lists of str for strings, lists of Value for arrays of arrays)."""
    if isinstance(obj, Value):
        if obj.type == ValueType.ARRAY:
            return _array_value(obj.value, obj.element_type, what)
        return Value(_scalar(obj.value, obj.type, what), obj.type)
    t = _scalar_type(obj, what)
    if t is not None:
        return Value(_scalar(obj, t, what), t)
    if isinstance(obj, (list, tuple, np.ndarray)):
        return _array_value(obj, None, what)
    raise TypeError(f"{what}: cannot store a {type(obj).__name__} in GGUF metadata (use int, float, bool, "
                    "str, a list/tuple or 1-D numpy array of those, or mlx_ggml_ext.gguf.Value)")


def _scalar(v, t: ValueType, what: str):
    if t == ValueType.STRING:
        if isinstance(v, bytes):
            try:
                return v.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{what}: GGUF strings must be UTF-8") from None
        if not isinstance(v, str):
            raise TypeError(f"{what}: a STRING value must be str, got {type(v).__name__}")
        return v
    if t == ValueType.ARRAY:
        raise ValueError(f"{what}: an ARRAY element needs an array value")
    if t == ValueType.BOOL:
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
            return bool(v)
        raise TypeError(f"{what}: a BOOL value must be a bool, got {v!r}")
    if t in _FLOAT_TYPES:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{what}: a {t.name} value must be a number, got {type(v).__name__}")
        return float(v)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what}: a {t.name} value must be an int, got {type(v).__name__}")
    info = np.iinfo(_NUMERIC_DTYPES[t])
    if not info.min <= int(v) <= info.max:
        raise ValueError(f"{what}: {int(v)} is out of range for {t.name} [{info.min}, {info.max}]")
    return int(v)


def _array_value(seq, element_type: "ValueType | None", what: str) -> Value:
    if isinstance(seq, np.ndarray):
        if seq.ndim != 1:
            raise ValueError(f"{what}: numpy arrays must be 1-D, got shape {seq.shape}")
        if seq.dtype.kind == "U":
            seq = seq.tolist()
        elif element_type is None:
            element_type = _NUMPY_TO_VALUE_TYPE.get(seq.dtype.newbyteorder("="))
            if element_type is None:
                raise TypeError(f"{what}: numpy {seq.dtype} has no GGUF value type")
    elif not isinstance(seq, (list, tuple)):
        raise TypeError(f"{what}: an ARRAY value must be a list, tuple or 1-D numpy array, got {type(seq).__name__}")
    if element_type is None:
        element_type = _infer_element_type(seq, what)
    if element_type == ValueType.STRING:
        return Value([_scalar(s, ValueType.STRING, f"{what}[{i}]") for i, s in enumerate(seq)],
                     ValueType.ARRAY, element_type)
    if element_type == ValueType.ARRAY:
        inner = [_to_value(x, f"{what}[{i}]") for i, x in enumerate(seq)]
        for i, x in enumerate(inner):
            if x.type != ValueType.ARRAY:
                raise TypeError(f"{what}[{i}]: an array of arrays needs array elements, got {x.type.name}")
        return Value(inner, ValueType.ARRAY, element_type)
    return Value(_numeric_array(seq, element_type, what), ValueType.ARRAY, element_type)


def _infer_element_type(seq, what: str) -> ValueType:
    if len(seq) == 0:
        raise ValueError(f"{what}: cannot infer the element type of an empty array; pass a numpy array or "
                         "Value([...], ValueType.ARRAY, element_type)")
    if all(isinstance(x, (list, tuple, np.ndarray, Value)) for x in seq):
        return ValueType.ARRAY
    # Python numbers (not numpy scalars, which keep their own type; not bools)
    python_ints = [isinstance(x, int) and not isinstance(x, (bool, np.generic)) for x in seq]
    if all(python_ints):
        return _int_type_for(min(seq), max(seq), what)
    if all(i or (isinstance(x, float) and not isinstance(x, np.generic)) for i, x in zip(python_ints, seq)):
        return ValueType.FLOAT32
    types = {_scalar_type(x, f"{what} element") for x in seq}
    if len(types) != 1 or None in types:
        raise TypeError(f"{what}: array elements must share one type, got "
                        f"{sorted({type(x).__name__ for x in seq})}")
    return types.pop()


def _numeric_array(seq, t: ValueType, what: str) -> np.ndarray:
    if t == ValueType.BOOL:
        a = np.asarray(seq)
        if a.size and not (a.dtype == bool or (a.dtype.kind in "iu" and np.isin(a, (0, 1)).all())):
            raise TypeError(f"{what}: BOOL arrays take bools")
        return a.astype(bool).reshape(-1)
    dtype = _NUMERIC_DTYPES[t].newbyteorder("=")
    if t in _FLOAT_TYPES:
        a = np.asarray(seq)
        if a.size and a.dtype.kind not in "iuf":
            raise TypeError(f"{what}: {t.name} arrays take numbers, got {a.dtype}")
        return a.astype(dtype).reshape(-1)
    if isinstance(seq, np.ndarray):
        if seq.size and seq.dtype.kind not in "iu":
            raise TypeError(f"{what}: {t.name} arrays take integers, got {seq.dtype}")
        lo, hi = (int(seq.min()), int(seq.max())) if seq.size else (0, 0)
    else:
        for x in seq:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{what}: {t.name} arrays take integers, got {type(x).__name__}")
        lo, hi = (int(min(seq)), int(max(seq))) if len(seq) else (0, 0)
    info = np.iinfo(dtype)
    if lo < info.min or hi > info.max:
        raise ValueError(f"{what}: {lo if lo < info.min else hi} is out of range for {t.name}")
    return np.asarray(seq, dtype=object if not isinstance(seq, np.ndarray) else None).astype(dtype).reshape(-1)


def _encode_string(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what}: not encodable as UTF-8 ({e.reason})") from None
    return _U64.pack(len(b)) + b


def _encode_payload(v: Value, what: str, out: bytearray) -> None:
    if v.type == ValueType.STRING:
        out += _encode_string(v.value, what)
    elif v.type != ValueType.ARRAY:
        out += _SCALAR_STRUCTS[v.type].pack(v.value)
    else:
        out += _U32.pack(v.element_type) + _U64.pack(len(v.value))
        if v.element_type == ValueType.STRING:
            for i, s in enumerate(v.value):
                out += _encode_string(s, f"{what}[{i}]")
        elif v.element_type == ValueType.ARRAY:
            for i, x in enumerate(v.value):
                _encode_payload(x, f"{what}[{i}]", out)
        else:
            out += np.ascontiguousarray(v.value, dtype=_NUMERIC_DTYPES[v.element_type]).tobytes()


def _array_depth(v: Value) -> int:
    if v.type != ValueType.ARRAY:
        return 0
    if v.element_type != ValueType.ARRAY:
        return 1
    return 1 + max((_array_depth(x) for x in v.value), default=1)


_FLOAT_MX = {mx.float32: GGMLType.F32, mx.float16: GGMLType.F16, mx.bfloat16: GGMLType.BF16}
_FLOAT_NP = {np.dtype(np.float32): GGMLType.F32, np.dtype(np.float16): GGMLType.F16}


def _tensor_bytes(name: str, t) -> tuple:
    """(ggml type, MLX-order shape, contiguous uint8 numpy array of its blocks)."""
    what = f"tensor '{name}'"
    if isinstance(t, GGMLTensor):
        return t.ggml_type, tuple(t.shape), np.ascontiguousarray(np.asarray(t.data))
    if isinstance(t, mx.array):
        if t.dtype not in _FLOAT_MX:
            raise TypeError(f"{what}: mx.array tensors must be float32, float16 or bfloat16 (or use GGMLTensor), "
                            f"got {t.dtype}")
        bits = t.view(mx.uint16) if t.dtype == mx.bfloat16 else t
        return _FLOAT_MX[t.dtype], tuple(t.shape), np.ascontiguousarray(np.asarray(bits)).view(np.uint8)
    if isinstance(t, np.ndarray):
        ggml_type = _FLOAT_NP.get(t.dtype.newbyteorder("=")) if t.dtype.kind == "f" else None
        if t.dtype.name == "bfloat16" and t.dtype.itemsize == 2:  # ml_dtypes
            ggml_type = GGMLType.BF16
        if ggml_type is None:
            raise TypeError(f"{what}: numpy tensors must be float32, float16 or bfloat16 (or use GGMLTensor), "
                            f"got {t.dtype}")
        le = t.astype(t.dtype.newbyteorder("<")) if t.dtype.byteorder == ">" else t
        return ggml_type, tuple(t.shape), np.ascontiguousarray(le).view(np.uint8)
    raise TypeError(f"{what}: expected a GGMLTensor, mx.array or numpy array, got {type(t).__name__}")


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def save(path: "str | os.PathLike", metadata: "Mapping[str, Any] | None" = None,
         tensors: "Mapping[str, Any] | None" = None, alignment: "int | None" = None) -> None:
    """Writes a GGUF v3 file.

    metadata: key -> value. Types are inferred: bool -> BOOL, int -> INT32 (INT64/UINT64
    when it does not fit), float -> FLOAT32, str -> STRING, numpy scalars -> their own
    type, lists/tuples/1-D numpy arrays -> ARRAY (elements inferred the same way; nested
    lists -> arrays of arrays). `Value(v, type, element_type)` forces a type; a loaded
    file's `typed_metadata` holds Values, so it is written back unchanged.
    tensors: name -> GGMLTensor (its blocks as they are), or a float32/float16/bfloat16
    mx.array or numpy array (stored as F32/F16/BF16), in MLX order (last axis = ne0), 1 to
    4 dims. Tensors are written in order, each at a multiple of the alignment.
    alignment: a power of two; default: metadata's 'general.alignment', else 32. It is
    stored as a UINT32 'general.alignment' unless it is the default 32 and metadata has none.

    The file is written under a temporary name and renamed over `path`, so a file that is
    currently loaded (and mapped) can be overwritten safely.
    """
    metadata = dict(metadata or {})
    tensors = dict(tensors or {})
    if ALIGNMENT_KEY in metadata:
        stored = metadata[ALIGNMENT_KEY]
        stored = stored.value if isinstance(stored, Value) else stored
        if alignment is not None and stored != alignment:
            raise ValueError(f"alignment={alignment} conflicts with metadata['{ALIGNMENT_KEY}'] = {stored!r}")
        alignment = stored
    alignment = DEFAULT_ALIGNMENT if alignment is None else alignment
    if not isinstance(alignment, (int, np.integer)) or isinstance(alignment, bool) or \
            not 0 < alignment < 2**32 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two below 2**32, got {alignment!r}")
    alignment = int(alignment)
    if ALIGNMENT_KEY in metadata or alignment != DEFAULT_ALIGNMENT:
        metadata[ALIGNMENT_KEY] = Value(alignment, ValueType.UINT32)

    out = bytearray(_HEADER.pack(GGUF_MAGIC, GGUF_VERSION, len(tensors), len(metadata)))
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata keys must be non-empty strings, got {key!r}")
        what = f"metadata '{key}'"
        v = _to_value(value, what)
        if _array_depth(v) > MAX_ARRAY_DEPTH:
            raise ValueError(f"{what}: arrays nest more than {MAX_ARRAY_DEPTH} deep")
        out += _encode_string(key, f"metadata key {key!r}")
        out += _U32.pack(v.type)
        _encode_payload(v, what, out)

    blobs = []
    relative = 0
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got {name!r}")
        ggml_type, shape, blob = _tensor_bytes(name, t)
        if not 1 <= len(shape) <= MAX_DIMS:
            raise ValueError(f"tensor '{name}': GGUF tensors have 1 to {MAX_DIMS} dims, got shape {shape}")
        ggml_type.row_bytes(shape[-1])  # rows must be whole blocks
        out += _encode_string(name, f"tensor name {name!r}")
        out += _U32.pack(len(shape))
        for d in reversed(shape):
            out += _U64.pack(d)
        out += _U32.pack(ggml_type) + _U64.pack(relative)
        blobs.append(blob)
        relative += -(-blob.nbytes // alignment) * alignment

    out += bytes(-len(out) % alignment)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gguf-", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):  # mkstemp creates 0600; give the file open()'s usual mode
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(out)
            for blob in blobs:
                f.write(memoryview(blob.reshape(-1)))
                f.write(bytes(-blob.nbytes % alignment))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
