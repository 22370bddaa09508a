"""GGUF files: `load` (memory-mapped; tensor bytes are never copied) and `save`.

`load(path)` returns a `GGUFFile`:

- `.metadata`: dict key -> plain Python value. Integers -> int, FLOAT32/FLOAT64 -> float,
  BOOL -> bool, STRING -> str. Arrays of numbers or bools -> 1-D numpy arrays of the
  stored type (uint8 ... float64, bool; copies, not views into the file), arrays of strings
  -> list of str, arrays of arrays -> list of those.
- `.typed_metadata`: the same values as `Value(value, type, element_type)`, which keep the
  GGUF value types so that `save(path, f.typed_metadata, f.tensors)` rewrites them exactly.
- `.tensors`: dict name -> `GGMLTensor` for every tensor type, floats (F32, F16, BF16)
  included: `.data` is a uint8 mx.array of shape (rows, bytes_per_row) pointing into the
  mapped file, `.shape` the logical shape in MLX order (ggml's ne reversed: last axis = ne0).
- `.tensor_info`: dict name -> `TensorInfo` (type, shape, byte offset in the file, size),
  plus `.version`, `.alignment`, `.data_offset` (start of the tensor data section),
  `.file_size` and `.zero_copy`.

The file stays mapped while any tensor array made from it is alive and is unmapped after
the last one is freed. The mapping is copy-on-write: MLX hands numpy writable views of any
array, and a write through one changes this process's copy of those pages, never the file.
Do not truncate or rewrite a file in place while its tensors are in use (`save` writes a
new file and renames it over the old one, which is safe). Zero copy needs an MLX allocator
that can address the mapping: MLX's CPU build (tested) and Metal (untested: written for
MLX's make_buffer); with CUDA the tensors are copied once (`zero_copy` is False). Windows
is not supported yet (NotImplementedError).

Malformed files raise `GGUFFormatError` (a ValueError) naming the problem and its byte
offset; nothing is read outside the file. Accepted: GGUF v2 and v3 (little-endian), any
power-of-two `general.alignment` (a UINT32, as ggml requires), tensors in any order at
aligned, non-overlapping offsets inside the file, arrays nested up to 8 deep. Rejected
like ggml does: duplicate keys or tensor names, empty keys, more than 4 dims, negative
dims or element counts past int64, rows not a whole number of blocks, unknown type ids.
ggml additionally requires tensors packed in header order and names under 64 bytes; this
reader (like `gguf.GGUFReader`) does not. Tensor types are those of `GGMLType`; other ggml
types (IQ2_XXS, I32, ...) are rejected by name. A 0-dim tensor gets the shape (1,). A BOOL
byte other than 0 reads as True.
"""

from __future__ import annotations

import codecs
import enum
import math
import os
import struct
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn

import mlx.core as mx
import numpy as np

from . import _ext
from .types import GGMLTensor, GGMLType

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3  # what save() writes
SUPPORTED_VERSIONS = (2, 3)  # v3 only added big-endian files, which are not supported
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8  # arrays of arrays; ggml itself allows no nesting
_INT64_MAX = 2**63 - 1
_MLX_DIM_MAX = 2**31 - 1  # MLX shapes hold int32 dimensions


class ValueType(enum.IntEnum):
    """GGUF metadata value types (ids as stored in the file)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Little-endian numpy dtype of every fixed-size type.
_NUMERIC_DTYPES = {
    ValueType.UINT8: np.dtype("<u1"), ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"), ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"), ValueType.INT32: np.dtype("<i4"),
    ValueType.UINT64: np.dtype("<u8"), ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT32: np.dtype("<f4"), ValueType.FLOAT64: np.dtype("<f8"),
    ValueType.BOOL: np.dtype("u1"),
}
_SCALAR_STRUCTS = {t: struct.Struct("<" + c) for t, c in {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.UINT64: "Q", ValueType.INT64: "q",
    ValueType.FLOAT32: "f", ValueType.FLOAT64: "d", ValueType.BOOL: "?"}.items()}
_INT_TYPES = (ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
              ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64)
_FLOAT_TYPES = (ValueType.FLOAT32, ValueType.FLOAT64)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")

# ggml type ids this package does not handle, for error messages (ggml.h).
_OTHER_GGML_TYPES = {
    4: "Q4_2 (removed from ggml)", 5: "Q4_3 (removed from ggml)", 9: "Q8_1", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 21: "IQ3_S", 22: "IQ2_S",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    31: "Q4_0_4_4 (removed from GGUF)", 32: "Q4_0_4_8 (removed from GGUF)",
    33: "Q4_0_8_8 (removed from GGUF)", 34: "TQ1_0", 35: "TQ2_0", 36: "IQ4_NL_4_4 (removed)",
    37: "IQ4_NL_4_8 (removed)", 38: "IQ4_NL_8_8 (removed)", 40: "NVFP4", 41: "Q1_0", 42: "Q2_0",
}


class GGUFFormatError(ValueError):
    """A malformed or unsupported GGUF file; `offset` is the byte offset of the problem."""

    def __init__(self, path: str, problem: str, offset: int):
        super().__init__(f"malformed GGUF file '{path}': {problem} (at byte offset {offset})")
        self.path = path
        self.problem = problem
        self.offset = offset


class Value:
    """A metadata value with its GGUF type, to force a type on save or to keep it on load.

    Scalars: `Value(7, ValueType.UINT32)`. Arrays: `Value([1, 2], ValueType.ARRAY,
    ValueType.UINT16)`; the element type may be left out to infer it. Arrays of arrays hold
    a list of inner arrays (each a Value, list or numpy array). `value` as loaded: a Python
    scalar or str, a numpy array for numeric/bool arrays, a list of str, or a list of Value.
    """

    __slots__ = ("value", "type", "element_type")

    def __init__(self, value: Any, type: "ValueType | int", element_type: "ValueType | int | None" = None):
        self.value = value
        self.type = ValueType(type)
        self.element_type = None if element_type is None else ValueType(element_type)
        if self.type != ValueType.ARRAY and self.element_type is not None:
            raise ValueError(f"element_type is only for arrays, got {self.type.name} with {self.element_type.name}")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Value):
            return NotImplemented
        return (self.type, self.element_type) == (other.type, other.element_type) and \
            _values_equal(self.value, other.value)

    def __repr__(self) -> str:
        element = f", {self.element_type.name}" if self.element_type is not None else ""
        return f"Value({self.value!r}, {self.type.name}{element})"


def _values_equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and \
            np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives in the file. `shape` is in MLX order (ggml's ne reversed)."""

    name: str
    ggml_type: GGMLType
    shape: tuple
    offset: int  # absolute byte offset of the first block in the file
    relative_offset: int  # as stored: from the start of the data section
    nbytes: int

    @property
    def ne(self) -> tuple:
        """The dims in ggml order (ne0 first)."""
        return tuple(reversed(self.shape))


class GGUFFile:
    """A loaded GGUF file (see the module docstring). Returned by `load`."""

    def __init__(self, path, version, alignment, data_offset, file_size, typed_metadata, tensor_info,
                 tensors, zero_copy):
        self.path: str = path
        self.version: int = version
        self.alignment: int = alignment
        self.data_offset: int = data_offset
        self.file_size: int = file_size
        self.typed_metadata: dict = typed_metadata
        self.metadata: dict = {k: _plain(v) for k, v in typed_metadata.items()}
        self.tensor_info: dict = tensor_info
        self.tensors: dict = tensors
        self.zero_copy: bool = zero_copy

    def __repr__(self) -> str:
        return (f"GGUFFile('{self.path}', v{self.version}, {len(self.metadata)} metadata keys, "
                f"{len(self.tensors)} tensors, alignment {self.alignment})")


def _plain(v: Value):
    if v.type == ValueType.ARRAY and v.element_type == ValueType.ARRAY:
        return [_plain(x) for x in v.value]
    return v.value


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------

class _Parser:
    """Reads the header from the mapped bytes, checking every length against the file."""

    def __init__(self, buf: memoryview, path: str):
        self.buf = buf
        self.size = len(buf)
        self.path = path
        self.pos = 0

    def fail(self, problem: str, offset: int) -> NoReturn:
        raise GGUFFormatError(self.path, problem, offset)

    def need(self, nbytes: int, what: str) -> None:
        remaining = self.size - self.pos
        if nbytes > remaining:
            self.fail(f"{what} needs {nbytes} bytes but only {remaining} remain in the file "
                      "(truncated file or a wrong length)", self.pos)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count of items of at least min_item_bytes each that must fit in the file."""
        at = self.pos
        n = self.u64(what)
        if n > (self.size - self.pos) // min_item_bytes:
            self.fail(f"{what} is {n}, but the {self.size - self.pos} bytes left in the file hold at most "
                      f"{(self.size - self.pos) // min_item_bytes}", at)
        return n

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            self.fail(f"{what} has length {n}, past the end of the file ({self.size - self.pos} bytes left)", at)
        start = self.pos
        self.pos += n
        try:
            return codecs.utf_8_decode(self.buf[start:self.pos], "strict", True)[0]
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start} of the string)", start)

    def value_type(self, what: str) -> ValueType:
        at = self.pos
        raw = self.u32(what)
        try:
            return ValueType(raw)
        except ValueError:
            self.fail(f"{what} {raw} is not a GGUF value type (0..12)", at)

    def value(self, vtype: ValueType, what: str, depth: int = 0) -> Value:
        if vtype == ValueType.STRING:
            return Value(self.string(what), vtype)
        if vtype != ValueType.ARRAY:
            s = _SCALAR_STRUCTS[vtype]
            self.need(s.size, what)
            (v,) = s.unpack_from(self.buf, self.pos)
            self.pos += s.size
            return Value(bool(v) if vtype == ValueType.BOOL else v, vtype)

        at = self.pos
        if depth >= MAX_ARRAY_DEPTH:
            self.fail(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep", at)
        etype = self.value_type(f"element type of {what}")
        if etype == ValueType.STRING:
            return Value(self.string_array(self.count(f"length of {what}", 8), what), vtype, etype)
        if etype == ValueType.ARRAY:
            n = self.count(f"length of {what}", 12)  # each inner array: type + length
            return Value([self.value(etype, f"{what}[{i}]", depth + 1) for i in range(n)], vtype, etype)
        dtype = _NUMERIC_DTYPES[etype]
        n = self.count(f"length of {what}", dtype.itemsize)
        raw = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos) if n else np.empty(0, dtype)
        self.pos += n * dtype.itemsize
        values = raw != 0 if etype == ValueType.BOOL else raw.astype(dtype.newbyteorder("="))
        return Value(values, vtype, etype)

    def string_array(self, n: int, what: str) -> list:
        # The hot loop for tokenizer vocabularies (~150k strings): locals only.
        buf, size, pos = self.buf, self.size, self.pos
        unpack, decode = _U64.unpack_from, codecs.utf_8_decode
        out = [None] * n
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"length of {what}[{i}]")
            (length,) = unpack(buf, pos)
            if length > size - pos - 8:
                self.fail(f"{what}[{i}] has length {length}, past the end of the file "
                          f"({size - pos - 8} bytes left)", pos)
            pos += 8
            try:
                out[i] = decode(buf[pos:pos + length], "strict", True)[0]
            except UnicodeDecodeError as e:
                self.fail(f"{what}[{i}] is not valid UTF-8 ({e.reason} at byte {e.start} of the string)", pos)
            pos += length
        self.pos = pos
        return out


@dataclass
class _RawTensor:
    info_offset: int  # where its entry in the header starts
    offset_field: int  # where its stored offset is
    name: str
    ggml_type: GGMLType
    shape: tuple
    rows: int
    row_bytes: int
    relative_offset: int


def _parse_tensor_info(p: _Parser, index: int) -> _RawTensor:
    info_offset = p.pos
    name = p.string(f"name of tensor {index}")
    what = f"tensor '{name}'"
    at = p.pos
    n_dims = p.u32(f"number of dims of {what}")
    if n_dims > MAX_DIMS:
        p.fail(f"{what} has {n_dims} dims; ggml allows at most {MAX_DIMS}", at)
    ne = []
    for j in range(n_dims):
        at = p.pos
        d = p.u64(f"dim {j} of {what}")
        if d > _INT64_MAX:
            p.fail(f"dim {j} of {what} is {d}, negative as ggml's int64", at)
        ne.append(d)
    if math.prod(ne) > _INT64_MAX:
        p.fail(f"{what} has dims {ne} whose product overflows int64", at)
    at = p.pos
    type_id = p.u32(f"type of {what}")
    try:
        ggml_type = GGMLType(type_id)
    except ValueError:
        known = _OTHER_GGML_TYPES.get(type_id)
        p.fail(f"{what} has ggml type {known} (id {type_id}), which mlx_ggml_ext does not support"
               if known else f"{what} has unknown ggml type id {type_id}", at)
    ne0 = ne[0] if ne else 1
    if ne0 % ggml_type.block_size:
        p.fail(f"{what} of type {ggml_type.name} has rows of {ne0} elements, not a multiple of its "
               f"block size {ggml_type.block_size}", at)
    rows = math.prod(ne[1:])
    row_bytes = ne0 // ggml_type.block_size * ggml_type.type_size
    offset_field = p.pos
    relative_offset = p.u64(f"data offset of {what}")
    shape = tuple(reversed(ne)) if ne else (1,)  # a 0-dim ggml tensor is one element
    if rows > _MLX_DIM_MAX or row_bytes > _MLX_DIM_MAX or max(shape) > _MLX_DIM_MAX:
        p.fail(f"{what} with dims {ne} ({rows} rows of {row_bytes} bytes) is too large for MLX, "
               f"whose dimensions are int32", at)
    return _RawTensor(info_offset, offset_field, name, ggml_type, shape, rows, row_bytes, relative_offset)


def _parse(buf: memoryview, path: str):
    p = _Parser(buf, path)
    if p.size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        p.fail(f"bad magic {bytes(buf[:4])!r}, expected {GGUF_MAGIC!r}", 0)
    p.pos = 4
    version = p.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            p.fail("big-endian GGUF files are not supported", 4)
        if version == 1:
            p.fail("GGUF v1 is not supported (v2 and v3 are)", 4)
        p.fail(f"unsupported GGUF version {version} (v2 and v3 are supported)", 4)
    n_tensors = p.count("tensor count", 24)  # name length, n_dims, type, offset
    n_kv = p.count("metadata key count", 13)  # key length, value type, one byte

    metadata: dict = {}
    key_offsets: dict = {}
    for i in range(n_kv):
        at = p.pos
        key = p.string(f"key of metadata entry {i}")
        if not key:
            p.fail(f"metadata entry {i} has an empty key", at)
        if key in metadata:
            p.fail(f"duplicate metadata key '{key}' (first at byte offset {key_offsets[key]})", at)
        vtype = p.value_type(f"value type of '{key}'")
        key_offsets[key] = at
        metadata[key] = p.value(vtype, f"value of '{key}'")

    alignment = DEFAULT_ALIGNMENT
    if ALIGNMENT_KEY in metadata:
        v = metadata[ALIGNMENT_KEY]
        if v.type != ValueType.UINT32:
            p.fail(f"'{ALIGNMENT_KEY}' must be a UINT32, got {v.type.name}", key_offsets[ALIGNMENT_KEY])
        if v.value == 0 or v.value & (v.value - 1):
            p.fail(f"'{ALIGNMENT_KEY}' is {v.value}, not a power of two", key_offsets[ALIGNMENT_KEY])
        alignment = v.value

    raw_tensors: list = []
    seen: dict = {}
    for i in range(n_tensors):
        t = _parse_tensor_info(p, i)
        if t.name in seen:
            p.fail(f"duplicate tensor name '{t.name}' (first at byte offset {seen[t.name]})", t.info_offset)
        seen[t.name] = t.info_offset
        raw_tensors.append(t)
    data_offset = -(-p.pos // alignment) * alignment

    spans = []
    for t in raw_tensors:
        if t.relative_offset % alignment:
            p.fail(f"tensor '{t.name}' data offset {t.relative_offset} is not a multiple of the "
                   f"alignment {alignment}", t.offset_field)
        nbytes = t.rows * t.row_bytes
        start = data_offset + t.relative_offset
        if nbytes and start + nbytes > p.size:
            p.fail(f"tensor '{t.name}' data [{start}, {start + nbytes}) lies past the end of the file "
                   f"({p.size} bytes)", t.offset_field)
        if nbytes:
            spans.append((start, start + nbytes, t))
    spans.sort(key=lambda s: s[0])
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            p.fail(f"tensor '{b.name}' data starting at byte {start_b} overlaps tensor '{a.name}' "
                   f"(which ends at byte {end_a})", b.offset_field)
    return version, alignment, data_offset, metadata, raw_tensors


def load(path: "str | os.PathLike") -> GGUFFile:
    """Maps a GGUF file and returns its metadata and tensors (see the module docstring).

    Raises GGUFFormatError (a ValueError) for a malformed file and OSError when the file
    cannot be opened.
    """
    path = os.fsdecode(os.fspath(path))
    if sys.platform == "win32":
        raise NotImplementedError("mlx_ggml_ext.gguf.load: memory-mapped loading is not implemented on Windows yet")
    mapped = _ext.MappedFile(path)
    view = mapped.view()
    version, alignment, data_offset, metadata, raw_tensors = _parse(memoryview(view), path)
    del view

    tensors, info = {}, {}
    for t in raw_tensors:
        start = data_offset + t.relative_offset
        if t.rows * t.row_bytes:
            data = mapped.array(start, [t.rows, t.row_bytes])
        else:  # may sit past the end of a file whose data section is empty
            data = mx.zeros((t.rows, t.row_bytes), dtype=mx.uint8)
        tensors[t.name] = GGMLTensor(data, t.ggml_type, t.shape)
        info[t.name] = TensorInfo(t.name, t.ggml_type, t.shape, start, t.relative_offset, t.rows * t.row_bytes)
    return GGUFFile(path, version, alignment, data_offset, mapped.size, metadata, info, tensors,
                    mapped.zero_copy)


# ----------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------

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


__all__ = ["load", "save", "GGUFFile", "TensorInfo", "Value", "ValueType", "GGUFFormatError",
           "DEFAULT_ALIGNMENT", "GGUF_MAGIC", "SUPPORTED_VERSIONS"]
