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
aligned, non-overlapping offsets inside the file, arrays nested up to 8 deep, and at most
MAX_TENSORS tensors, MAX_METADATA_KEYS keys, MAX_METADATA_STRINGS strings and MAX_NESTED_ARRAYS
inner arrays (so a small file cannot cost gigabytes of Python objects). Rejected
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
from dataclasses import dataclass
from typing import Any, NoReturn

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
# Limits on what one file's header may ask for, so that a small file cannot make the reader build millions
# of Python objects (an empty inner array is 12 bytes in the file but ~200 bytes as a Python object).
# Real models stay far below them: ggml allows no nested arrays at all, vocabularies have < 300k tokens
# (plus their merges), and the largest models have a few thousand tensors.
MAX_TENSORS = 1 << 16  # tensors per file
MAX_METADATA_KEYS = 1 << 16  # metadata entries per file
MAX_METADATA_STRINGS = 1 << 22  # strings in all metadata values and string arrays together
MAX_NESTED_ARRAYS = 1 << 16  # arrays inside arrays, all keys together
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
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    31: "Q4_0_4_4 (removed from GGUF)", 32: "Q4_0_4_8 (removed from GGUF)",
    33: "Q4_0_8_8 (removed from GGUF)", 36: "IQ4_NL_4_4 (removed)",
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
                 tensors, zero_copy, mapped=None):
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
        self._mapped = mapped  # the _ext.MappedFile the tensors point into (None for a file built otherwise)

    def prefault(self) -> None:
        """Maps every page of the file into this process now, reading it from disk where the system has not
        cached it, so that no later use of a tensor page-faults (llama.cpp maps model files with MAP_POPULATE for
        the same reason: a mixture of experts' decode tokens otherwise fault in each expert the first time they
        route to it). `models.load` calls it. Nothing to do when the tensors are copies (`zero_copy` False)."""
        if self._mapped is not None and self.zero_copy:
            self._mapped.prefault()

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
        self.strings_left = MAX_METADATA_STRINGS
        self.nested_arrays_left = MAX_NESTED_ARRAYS

    def take(self, n: int, budget: str, limit: int, what: str, at: int) -> None:
        """Spends n of a per-file budget (strings_left or nested_arrays_left), failing past its limit."""
        left = getattr(self, budget)
        if n > left:
            self.fail(f"{what} takes the file past {limit} {budget[:-5].replace('_', ' ')} in its metadata "
                      "(a limit of this reader: see docs/reliability.md)", at)
        setattr(self, budget, left - n)

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
            self.take(1, "strings_left", MAX_METADATA_STRINGS, what, self.pos)
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
            n = self.count(f"length of {what}", 8)
            self.take(n, "strings_left", MAX_METADATA_STRINGS, what, at)
            return Value(self.string_array(n, what), vtype, etype)
        if etype == ValueType.ARRAY:
            n = self.count(f"length of {what}", 12)  # each inner array: type + length
            self.take(n, "nested_arrays_left", MAX_NESTED_ARRAYS, what, at)
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
    if n_tensors > MAX_TENSORS:
        p.fail(f"tensor count {n_tensors} is past this reader's limit of {MAX_TENSORS}", 8)
    if n_kv > MAX_METADATA_KEYS:
        p.fail(f"metadata key count {n_kv} is past this reader's limit of {MAX_METADATA_KEYS}", 16)

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
                    mapped.zero_copy, mapped)


# The writer lives in gguf_writer.py (imported last: it uses the names above).
from .gguf_writer import save  # noqa: E402


__all__ = ["load", "save", "GGUFFile", "TensorInfo", "Value", "ValueType", "GGUFFormatError",
           "DEFAULT_ALIGNMENT", "GGUF_MAGIC", "SUPPORTED_VERSIONS"]
