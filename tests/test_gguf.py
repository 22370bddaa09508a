"""GGUF loading and saving against the `gguf` package (GGUFWriter / GGUFReader), hand-built
malformed files, memory use of the mapping, and a fuzz test of the reader.

The fuzz test runs 300 derandomized examples (a CI failure reproduces exactly). Run it longer,
and with fresh random examples, with
    MLX_GGML_EXT_FUZZ_EXAMPLES=30000 MLX_GGML_EXT_FUZZ_RANDOM=1 pytest -q tests/test_gguf.py -k fuzz
"""

import gc
import itertools
import math
import os
import struct
import tempfile

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import GGMLTensor, GGMLType, _ext
from mlx_ggml_ext import gguf as mgguf
from mlx_ggml_ext.gguf import GGUFFormatError, Value, ValueType

gguf = pytest.importorskip("gguf")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

GT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
HAVE_PROC = os.path.exists("/proc/self/statm")


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------

def write_with_gguf_writer(path, kvs=(), tensors=(), alignment=None):
    """kvs: (key, value, GGUFValueType, sub_type); tensors: (name, numpy array, raw_dtype or None)."""
    w = gguf.GGUFWriter(str(path), "test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub_type in kvs:
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, array, raw_dtype in tensors:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def raw_bytes(t: GGMLTensor) -> bytes:
    return np.asarray(t.data).tobytes()


def random_tensor(rng, ggml_type: GGMLType, shape):
    """(numpy array for GGUFWriter, raw_dtype) holding random blocks of `shape` (MLX order)."""
    if ggml_type == GGMLType.F32:
        return rng.standard_normal(shape).astype(np.float32), None
    if ggml_type == GGMLType.F16:
        return rng.standard_normal(shape).astype(np.float16), None
    rows_shape = tuple(shape[:-1]) + (ggml_type.row_bytes(shape[-1]),)
    return rng.integers(0, 256, rows_shape, dtype=np.uint8), GT(int(ggml_type))


def shape_for(ggml_type: GGMLType, n_dims: int):
    """A shape of n_dims whose rows hold 3 blocks (several blocks per row)."""
    ne0 = 3 * ggml_type.block_size
    return ((2, 3, 1)[:n_dims - 1] + (ne0,))


def assert_matches_reader(f: mgguf.GGUFFile, path):
    """Every tensor equals what gguf.GGUFReader reads: names, order, types, shapes, bytes, offsets."""
    reader = gguf.GGUFReader(str(path))
    assert list(f.tensors) == [t.name for t in reader.tensors]
    assert f.data_offset == reader.data_offset and f.alignment == reader.alignment
    for rt in reader.tensors:
        t, info = f.tensors[rt.name], f.tensor_info[rt.name]
        assert int(t.ggml_type) == int(rt.tensor_type)
        assert t.shape == tuple(int(d) for d in reversed(rt.shape.tolist()))
        assert info.offset == rt.data_offset and info.nbytes == rt.n_bytes
        assert raw_bytes(t) == rt.data.tobytes()
    return reader


# A minimal GGUF encoder written from the format description, to build files that
# gguf.GGUFWriter cannot (malformed ones, v2, odd layouts).
def u32(x):
    return struct.pack("<I", x)


def u64(x):
    return struct.pack("<Q", x)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + u32(vtype) + payload


def tinfo(name, ne, type_id, offset):
    return gstr(name) + u32(len(ne)) + b"".join(u64(d) for d in ne) + u32(type_id) + u64(offset)


def build(kvs=(), infos=(), data=b"", version=3, n_tensors=None, n_kv=None, alignment=32, magic=b"GGUF",
          pad=True):
    out = magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors) + \
        u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    if infos and pad:
        out += bytes(-len(out) % alignment)
    return out + data


def write(tmp_path, data: bytes, name="f.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ----------------------------------------------------------------------------------------
# Reading files written by gguf.GGUFWriter
# ----------------------------------------------------------------------------------------

def test_every_tensor_type_reads_back_like_gguf_reader(tmp_path):
    rng = np.random.default_rng(0)
    tensors, expected = [], {}
    for i, ggml_type in enumerate(GGMLType):
        for n_dims in (2, (1, 3, 4)[i % 3]):
            shape = shape_for(ggml_type, n_dims)
            array, raw_dtype = random_tensor(rng, ggml_type, shape)
            name = f"{ggml_type.name.lower()}.{n_dims}d"
            tensors.append((name, array, raw_dtype))
            expected[name] = (ggml_type, shape, array)
    # Blocks made by ggml's quantizers (the gguf package is byte-exact with them), zeros included.
    w = rng.standard_normal((4, 64)).astype(np.float32)
    w[1] = 0.0
    for qtype in (GT.Q8_0, GT.Q4_0, GT.MXFP4):
        q = gguf.quants.quantize(w, qtype)
        tensors.append((f"quantized.{qtype.name}", q, qtype))
        expected[f"quantized.{qtype.name}"] = (GGMLType(int(qtype)), (4, 64), q)
    path = write_with_gguf_writer(tmp_path / "types.gguf", tensors=tensors)

    f = mgguf.load(path)
    assert_matches_reader(f, path)
    assert list(f.tensors) == list(expected)
    for name, (ggml_type, shape, array) in expected.items():
        t = f.tensors[name]
        assert isinstance(t, GGMLTensor) and t.ggml_type == ggml_type and t.shape == shape
        assert t.data.dtype == mx.uint8 and t.data.shape == (math.prod(shape[:-1]), ggml_type.row_bytes(shape[-1]))
        assert raw_bytes(t) == array.tobytes()
        if ggml_type in (GGMLType.F32, GGMLType.F16):  # floats by value
            values = np.asarray(t.data).view(array.dtype).reshape(shape)
            np.testing.assert_array_equal(values, array)
    assert f.version == 3 and f.alignment == 32


def test_mapped_tensors_dequantize_like_gguf(tmp_path):
    """End to end: GGUFWriter file -> zero-copy load -> ops.dequantize on the mapped blocks, bit-identical to
    gguf.quants.dequantize of the same bytes, for every type."""
    from mlx_ggml_ext.reference import random_blocks
    rng = np.random.default_rng(11)
    tensors = []
    for ggml_type in GGMLType:
        shape = (3, 2 * max(ggml_type.block_size, 32))
        blocks = random_blocks(rng, ggml_type.name, shape[0], shape[1])
        if ggml_type.is_float:  # GGUFWriter takes float tensors by value
            dtype = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}.get(ggml_type)
            tensors.append((ggml_type.name, blocks.view(dtype) if dtype else blocks, None if dtype else GT.BF16))
        else:
            tensors.append((ggml_type.name, blocks, GT(int(ggml_type))))
    f = mgguf.load(write_with_gguf_writer(tmp_path / "deq.gguf", tensors=tensors))
    for ggml_type in GGMLType:
        t = f.tensors[ggml_type.name]
        expected = gguf.quants.dequantize(np.asarray(t.data), GT(int(ggml_type))).reshape(t.shape)
        got = np.asarray(t.dequantize(mx.float32))
        np.testing.assert_array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32),
                                      err_msg=ggml_type.name)


def test_every_metadata_value_type_reads_back(tmp_path):
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    cases = [  # key, value written, value type, element type, expected plain value
        ("u8", 255, VT.UINT8, None, 255), ("i8", -128, VT.INT8, None, -128),
        ("u16", 65535, VT.UINT16, None, 65535), ("i16", -32768, VT.INT16, None, -32768),
        ("u32", 2**32 - 1, VT.UINT32, None, 2**32 - 1), ("i32", -2**31, VT.INT32, None, -2**31),
        ("u64", 2**64 - 1, VT.UINT64, None, 2**64 - 1), ("i64", -2**63, VT.INT64, None, -2**63),
        ("f32", 0.1, VT.FLOAT32, None, f32(0.1)), ("f64", 1 / 3, VT.FLOAT64, None, 1 / 3),
        ("f32.inf", float("-inf"), VT.FLOAT32, None, float("-inf")),
        ("b.true", True, VT.BOOL, None, True), ("b.false", False, VT.BOOL, None, False),
        ("s", "héllo ✓ 世界", VT.STRING, None, "héllo ✓ 世界"), ("s.empty", "", VT.STRING, None, ""),
        ("a.strings", ["a", "", "ü✓"], VT.ARRAY, VT.STRING, ["a", "", "ü✓"]),
        ("a.bool", [True, False, True], VT.ARRAY, VT.BOOL, np.array([True, False, True])),
        ("a.nested", [[1, 2], [3]], VT.ARRAY, VT.ARRAY,
         [np.array([1, 2], np.int32), np.array([3], np.int32)]),
        ("a.nested.strings", [["a"], ["b", "c"]], VT.ARRAY, VT.ARRAY, [["a"], ["b", "c"]]),
        ("a.nested3", [[[1.5]], [[2.5, 3.5], [4.5]]], VT.ARRAY, VT.ARRAY,
         [[np.array([1.5], np.float32)], [np.array([2.5, 3.5], np.float32), np.array([4.5], np.float32)]]),
    ]
    for vt, dtype in [(VT.UINT8, np.uint8), (VT.INT8, np.int8), (VT.UINT16, np.uint16), (VT.INT16, np.int16),
                      (VT.UINT32, np.uint32), (VT.INT32, np.int32), (VT.UINT64, np.uint64),
                      (VT.INT64, np.int64), (VT.FLOAT32, np.float32), (VT.FLOAT64, np.float64)]:
        if np.dtype(dtype).kind == "f":
            values = [np.finfo(dtype).min, -0.0, 1.5, np.finfo(dtype).max, np.finfo(dtype).tiny]
        else:
            values = [int(np.iinfo(dtype).min), 0, 7, int(np.iinfo(dtype).max)]
        cases.append((f"a.{vt.name.lower()}", values, VT.ARRAY, vt, np.array(values, dtype=dtype)))
    path = write_with_gguf_writer(tmp_path / "kv.gguf",
                                  kvs=[(k, v, t, s) for k, v, t, s, _ in cases])
    f = mgguf.load(path)
    reader = gguf.GGUFReader(str(path))

    assert list(f.metadata) == ["general.architecture"] + [c[0] for c in cases]
    assert f.metadata["general.architecture"] == "test"
    for key, _, vtype, sub_type, expected in cases:
        got, typed = f.metadata[key], f.typed_metadata[key]
        assert (int(typed.type), typed.element_type) == (int(vtype), None if sub_type is None else ValueType(sub_type))
        assert mgguf._values_equal(got, expected), (key, got, expected)
        if isinstance(expected, np.ndarray):
            assert got.dtype == expected.dtype
        field = reader.fields[key]
        assert [int(t) for t in field.types[:2]] == [int(vtype)] + ([int(sub_type)] if sub_type is not None else [])
        if sub_type != VT.ARRAY:  # GGUFReader flattens nested arrays
            as_list = got.tolist() if isinstance(got, np.ndarray) else got
            assert field.contents() == as_list, key


def test_v2_files_and_other_alignments(tmp_path):
    rng = np.random.default_rng(1)
    tensors = [("a", rng.standard_normal((3, 5)).astype(np.float32), None),
               ("b", rng.integers(0, 256, (2, 2 * 18), dtype=np.uint8), GT.Q4_0),
               ("c", rng.standard_normal((7,)).astype(np.float16), None)]
    for alignment in (1, 8, 64, 256, 4096):
        path = write_with_gguf_writer(tmp_path / f"align{alignment}.gguf", tensors=tensors, alignment=alignment)
        f = mgguf.load(path)
        assert f.alignment == alignment and f.metadata["general.alignment"] == alignment
        assert all(i.relative_offset % alignment == 0 for i in f.tensor_info.values())
        assert f.data_offset % alignment == 0
        assert_matches_reader(f, path)

        # The same file as GGUF v2 (identical layout for little-endian files).
        data = bytearray(path.read_bytes())
        data[4:8] = u32(2)
        v2 = write(tmp_path, bytes(data), f"v2_align{alignment}.gguf")
        g = mgguf.load(v2)
        assert g.version == 2
        assert_matches_reader(g, v2)
        assert {k: raw_bytes(t) for k, t in g.tensors.items()} == {k: raw_bytes(t) for k, t in f.tensors.items()}


def test_hand_built_layouts(tmp_path):
    # Tensors stored out of header order with gaps; a zero-element tensor; a 0-dim tensor;
    # no tensors at all; empty arrays (which GGUFWriter refuses to write).
    a = np.arange(8, dtype=np.float32)
    b = np.arange(16, dtype=np.float32)
    data = bytearray(256)
    data[128:160] = a.tobytes()
    data[0:64] = b.tobytes()
    data[192:196] = np.float32(2.5).tobytes()
    kvs = [kv("empty.u32", 9, u32(4) + u64(0)), kv("empty.str", 9, u32(8) + u64(0)), kv("bool.2", 7, b"\x02")]
    infos = [tinfo("a", [8], 0, 128), tinfo("b", [16], 0, 0), tinfo("empty", [0, 4], 0, 64),
             tinfo("scalar", [], 0, 192)]
    path = write(tmp_path, build(kvs, infos, data=bytes(data)))
    f = mgguf.load(path)
    np.testing.assert_array_equal(np.asarray(f.tensors["a"].data).view(np.float32).reshape(8), a)
    np.testing.assert_array_equal(np.asarray(f.tensors["b"].data).view(np.float32).reshape(16), b)
    assert f.tensors["empty"].shape == (4, 0) and f.tensors["empty"].nbytes == 0
    assert f.tensors["scalar"].shape == (1,) and np.asarray(f.tensors["scalar"].data).view(np.float32)[0, 0] == 2.5
    assert f.metadata["empty.u32"].dtype == np.uint32 and f.metadata["empty.u32"].size == 0
    assert f.metadata["empty.str"] == [] and f.metadata["bool.2"] is True
    assert [(i.offset - f.data_offset, i.nbytes) for i in f.tensor_info.values()] == \
        [(128, 32), (0, 64), (64, 0), (192, 4)]
    assert f.data_offset == len(build(kvs, infos))

    none = mgguf.load(write(tmp_path, build(kvs=[kv("k", 8, gstr("v"))]), "no_tensors.gguf"))
    assert none.tensors == {} and none.metadata == {"k": "v"}


# ----------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------

def test_save_is_read_identically_by_gguf_reader(tmp_path):
    rng = np.random.default_rng(2)
    q6 = GGMLTensor(mx.array(rng.integers(0, 256, (3, 2 * 210), dtype=np.uint8)), "q6_k", (3, 512))
    q4 = GGMLTensor(mx.array(rng.integers(0, 256, (2, 3, 18), dtype=np.uint8).reshape(6, 18)), "q4_0", (2, 3, 32))
    f32 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    f16 = rng.standard_normal((6,)).astype(np.float16)
    bf16 = mx.array(rng.standard_normal((4, 8)).astype(np.float32)).astype(mx.bfloat16)
    tensors = {"q6": q6, "q4": q4, "mx.f32": mx.array(f32), "np.f32": f32, "mx.f16": mx.array(f16),
               "np.f16": f16, "mx.bf16": bf16, "transposed": mx.array(f32[0, 0]).T}
    metadata = {
        "int": 5, "int.big": 2**40, "int.huge": 2**63, "int.neg": -3, "float": 0.25, "bool": True,
        "str": "ü", "list.int": [1, -2, 3], "list.int64": [0, 2**40], "list.float": [1.0, 2.5],
        "list.mixed": [1, 2.5], "list.str": ["x", "yz"], "list.bool": [True, False], "tuple": (1, 2),
        "np.u8": np.uint8(200), "np.i16": np.int16(-5), "np.f64": np.float64(1 / 3), "np.bool": np.bool_(False),
        "np.arr.u16": np.array([1, 65535], np.uint16), "np.arr.f64": np.array([0.1, 0.2]),
        "np.arr.str": np.array(["a", "bc"]),
        "v.u64": Value(2**64 - 1, ValueType.UINT64), "v.i8": Value(-1, ValueType.INT8),
        "v.f64": Value(0.1, ValueType.FLOAT64), "v.arr.u8": Value([1, 2, 255], ValueType.ARRAY, ValueType.UINT8),
        "v.arr.empty": Value([], ValueType.ARRAY, ValueType.INT64),
        "nested": [[1, 2], [3]], "nested.str": [["a"], ["b", "c"]],
    }
    expected_types = {
        "int": (VT.INT32,), "int.big": (VT.INT64,), "int.huge": (VT.UINT64,), "int.neg": (VT.INT32,),
        "float": (VT.FLOAT32,), "bool": (VT.BOOL,), "str": (VT.STRING,), "list.int": (VT.ARRAY, VT.INT32),
        "list.int64": (VT.ARRAY, VT.INT64), "list.float": (VT.ARRAY, VT.FLOAT32),
        "list.mixed": (VT.ARRAY, VT.FLOAT32), "list.str": (VT.ARRAY, VT.STRING),
        "list.bool": (VT.ARRAY, VT.BOOL), "tuple": (VT.ARRAY, VT.INT32), "np.u8": (VT.UINT8,),
        "np.i16": (VT.INT16,), "np.f64": (VT.FLOAT64,), "np.bool": (VT.BOOL,),
        "np.arr.u16": (VT.ARRAY, VT.UINT16), "np.arr.f64": (VT.ARRAY, VT.FLOAT64),
        "np.arr.str": (VT.ARRAY, VT.STRING), "v.u64": (VT.UINT64,), "v.i8": (VT.INT8,),
        "v.f64": (VT.FLOAT64,), "v.arr.u8": (VT.ARRAY, VT.UINT8), "v.arr.empty": (VT.ARRAY,),
        "nested": (VT.ARRAY, VT.ARRAY), "nested.str": (VT.ARRAY, VT.ARRAY),
    }
    expected_values = {
        "int": 5, "int.big": 2**40, "int.huge": 2**63, "int.neg": -3, "float": 0.25, "bool": True, "str": "ü",
        "list.int": [1, -2, 3], "list.int64": [0, 2**40], "list.float": [1.0, 2.5], "list.mixed": [1.0, 2.5],
        "list.str": ["x", "yz"], "list.bool": [True, False], "tuple": [1, 2], "np.u8": 200, "np.i16": -5,
        "np.f64": 1 / 3, "np.bool": False, "np.arr.u16": [1, 65535], "np.arr.f64": [0.1, 0.2],
        "np.arr.str": ["a", "bc"], "v.u64": 2**64 - 1, "v.i8": -1, "v.f64": 0.1, "v.arr.u8": [1, 2, 255],
        "v.arr.empty": [],
    }
    for alignment in (32, 64, 1):
        path = tmp_path / f"ours{alignment}.gguf"
        mgguf.save(path, metadata, tensors, alignment=alignment)
        reader = gguf.GGUFReader(str(path))
        keys = [k for k in reader.fields if not k.startswith("GGUF.")]
        assert keys == list(metadata) + (["general.alignment"] if alignment != 32 else [])
        for key, types in expected_types.items():
            field = reader.fields[key]
            assert tuple(int(t) for t in field.types[:len(types)]) == tuple(int(t) for t in types), key
            if key in expected_values:
                assert field.contents() == expected_values[key], key
        if alignment != 32:
            assert reader.fields["general.alignment"].types == [VT.UINT32]
            assert reader.fields["general.alignment"].contents() == alignment
        assert reader.alignment == alignment
        rt = {t.name: t for t in reader.tensors}
        assert list(rt) == list(tensors)
        for name, t in tensors.items():
            r = rt[name]
            assert r.data_offset % alignment == 0
            if isinstance(t, GGMLTensor):
                assert (int(r.tensor_type), r.data.tobytes()) == (int(t.ggml_type), raw_bytes(t))
                assert tuple(reversed(r.shape.tolist())) == t.shape
                continue
            assert tuple(reversed(r.shape.tolist())) == tuple(t.shape)
            if isinstance(t, mx.array) and t.dtype == mx.bfloat16:
                assert r.tensor_type == GT.BF16
                assert r.data.tobytes() == np.asarray(t.view(mx.uint16)).tobytes()
            else:
                values = np.asarray(t)
                assert r.tensor_type == (GT.F32 if values.dtype == np.float32 else GT.F16)
                np.testing.assert_array_equal(r.data.reshape(values.shape), values)


def test_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(3)
    kvs = [("u16", 9, VT.UINT16, None), ("f64", 0.1, VT.FLOAT64, None), ("u64s", [1, 2**64 - 1], VT.ARRAY, VT.UINT64),
           ("nested", [["a", "b"], ["c"]], VT.ARRAY, VT.ARRAY), ("bools", [False, True], VT.ARRAY, VT.BOOL)]
    tensors = [(t.name, *random_tensor(rng, t, shape_for(t, 2))) for t in GGMLType]
    src = write_with_gguf_writer(tmp_path / "src.gguf", kvs=kvs, tensors=tensors, alignment=64)
    f = mgguf.load(src)

    # typed metadata keeps every value type; tensors keep their bytes, types and shapes
    mgguf.save(tmp_path / "a.gguf", f.typed_metadata, f.tensors)
    a = mgguf.load(tmp_path / "a.gguf")
    assert a.typed_metadata == f.typed_metadata and a.alignment == 64
    assert {k: (t.ggml_type, t.shape, raw_bytes(t)) for k, t in a.tensors.items()} == \
        {k: (t.ggml_type, t.shape, raw_bytes(t)) for k, t in f.tensors.items()}
    # GGUFWriter's layout is the same as ours, so the files are byte-identical
    assert (tmp_path / "a.gguf").read_bytes() == src.read_bytes()

    # plain metadata keeps the values (types follow the inference rules)
    mgguf.save(tmp_path / "b.gguf", f.metadata, f.tensors)
    b = mgguf.load(tmp_path / "b.gguf")
    assert b.metadata.keys() == f.metadata.keys()
    for key, value in f.metadata.items():
        if key == "f64":  # a Python float is stored as FLOAT32
            assert b.typed_metadata[key].type == ValueType.FLOAT32 and b.metadata[key] == float(np.float32(0.1))
        else:
            assert mgguf._values_equal(b.metadata[key], value), key
    assert b.typed_metadata["u16"].type == ValueType.INT32


def test_save_over_a_loaded_file_keeps_its_tensors_valid(tmp_path):
    path = tmp_path / "m.gguf"
    w = np.arange(4096, dtype=np.float32).reshape(16, 256)
    mgguf.save(path, {"v": 1}, {"w": w})
    f = mgguf.load(path)
    mgguf.save(path, {"v": 2}, {"w": w[:, :128] * 2})  # a smaller file: the old mapping must not shrink
    np.testing.assert_array_equal(np.asarray(f.tensors["w"].data).view(np.float32), w)
    g = mgguf.load(path)
    assert g.metadata["v"] == 2 and g.tensors["w"].shape == (16, 128)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("metadata, tensors, error, match", [
    ({"k": []}, {}, ValueError, "empty array"),
    ({"k": [1, "a"]}, {}, TypeError, "share one type"),
    ({"k": 2**64}, {}, ValueError, "does not fit"),
    ({"k": Value(256, ValueType.UINT8)}, {}, ValueError, "out of range for UINT8"),
    ({"k": Value([1, -1], ValueType.ARRAY, ValueType.UINT32)}, {}, ValueError, "out of range for UINT32"),
    ({"k": Value("x", ValueType.INT32)}, {}, TypeError, "must be an int"),
    ({"k": Value(b"\xff", ValueType.STRING)}, {}, ValueError, "UTF-8"),
    ({"k": "\ud800"}, {}, ValueError, "UTF-8"),
    ({"k": object()}, {}, TypeError, "cannot store a object"),
    ({"k": np.zeros((2, 2))}, {}, ValueError, "1-D"),
    ({"k": np.float16(1)}, {}, TypeError, "float16 has no GGUF value type"),
    ({"": 1}, {}, ValueError, "non-empty strings"),
    ({}, {"t": mx.zeros((2, 3), dtype=mx.int32)}, TypeError, "float32, float16 or bfloat16"),
    ({}, {"t": np.zeros((2, 3), np.float64)}, TypeError, "float32, float16 or bfloat16"),
    ({}, {"t": np.zeros((1, 1, 1, 1, 2), np.float32)}, ValueError, "1 to 4 dims"),
    ({}, {"t": [1.0]}, TypeError, "expected a GGMLTensor"),
    ({"general.alignment": 48}, {}, ValueError, "power of two"),
])
def test_save_rejects_bad_input(tmp_path, metadata, tensors, error, match):
    with pytest.raises(error, match=match):
        mgguf.save(tmp_path / "bad.gguf", metadata, tensors)
    assert not os.listdir(tmp_path)  # no partial or temporary file left behind


def test_save_alignment_argument(tmp_path):
    with pytest.raises(ValueError, match="conflicts"):
        mgguf.save(tmp_path / "x.gguf", {"general.alignment": 64}, {}, alignment=128)
    with pytest.raises(ValueError, match="power of two"):
        mgguf.save(tmp_path / "x.gguf", {}, {}, alignment=0)
    mgguf.save(tmp_path / "x.gguf", {"general.alignment": 64}, {"t": np.ones(3, np.float32)})
    f = mgguf.load(tmp_path / "x.gguf")
    assert f.alignment == 64 and f.typed_metadata["general.alignment"] == Value(64, ValueType.UINT32)


# ----------------------------------------------------------------------------------------
# Malformed files
# ----------------------------------------------------------------------------------------

F32_8 = tinfo("t", [8], 0, 0)  # 33 bytes: name 9, n_dims 4, dim 8, type 4, offset 8

MALFORMED = {  # name: (file bytes, message regex, byte offset of the problem)
    "bad magic": (build(magic=b"GGML"), "bad magic b'GGML'", 0),
    "empty file": (b"", "bad magic", 0),
    "v1": (build(version=1), "GGUF v1 is not supported", 4),
    "v4": (build(version=4), "unsupported GGUF version 4", 4),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian", 4),
    "truncated header": (build()[:12], "tensor count needs 8 bytes but only 4 remain", 8),
    "huge tensor count": (build(n_tensors=2**63), "tensor count is 9223372036854775808", 8),
    "huge key count": (build(n_kv=2**64 - 1), "metadata key count is 18446744073709551615", 16),
    "key past the end": (build(kvs=[u64(1000) + b"abcdefgh"]),
                         "key of metadata entry 0 has length 1000, past the end", 24),
    "string past the end": (build(kvs=[kv("k", 8, u64(50) + b"x")]), "value of 'k' has length 50", 37),
    "huge array": (build(kvs=[kv("k", 9, u32(4) + u64(2**40))]), "length of value of 'k' is 1099511627776", 41),
    "huge string array": (build(kvs=[kv("k", 9, u32(8) + u64(2**61))]), "length of value of 'k' is", 41),
    "array string past the end": (build(kvs=[kv("k", 9, u32(8) + u64(2) + gstr("a") + u64(99))]),
                                  r"value of 'k'\[1\] has length 99", 58),
    "array truncated": (build(kvs=[kv("k", 9, u32(4) + u64(3) + u32(1) + u32(2))]), "length of value of 'k' is 3", 41),
    "unknown value type": (build(kvs=[kv("k", 13, b"")]), "value type of 'k' 13 is not a GGUF value type", 33),
    "unknown element type": (build(kvs=[kv("k", 9, u32(77) + u64(0))]), "element type of value of 'k' 77", 37),
    "arrays nested too deep": (build(kvs=[kv("k", 9, (u32(9) + u64(1)) * 8 + u32(0) + u64(0))]),
                               "nests arrays more than 8 deep", 37 + 12 * 8),
    "key not UTF-8": (build(kvs=[kv(b"\xff\xfe", 4, u32(1))]), "key of metadata entry 0 is not valid UTF-8", 32),
    "string not UTF-8": (build(kvs=[kv("k", 8, gstr(b"a\xc3"))]), "value of 'k' is not valid UTF-8", 45),
    "array string not UTF-8": (build(kvs=[kv("k", 9, u32(8) + u64(1) + gstr(b"\xed\xa0\x80"))]),
                               r"value of 'k'\[0\] is not valid UTF-8", 57),
    "tensor name not UTF-8": (build(infos=[tinfo(b"\x80", [8], 0, 0)], data=bytes(32)),
                              "name of tensor 0 is not valid UTF-8", 32),
    "duplicate key": (build(kvs=[kv("a", 4, u32(1)), kv("a", 4, u32(2))]),
                      r"duplicate metadata key 'a' \(first at byte offset 24\)", 41),
    "empty key": (build(kvs=[kv("", 4, u32(1))]), "metadata entry 0 has an empty key", 24),
    "duplicate tensor name": (build(infos=[F32_8, tinfo("t", [8], 0, 32)], data=bytes(64)),
                              r"duplicate tensor name 't' \(first at byte offset 24\)", 57),
    "alignment not UINT32": (build(kvs=[kv("general.alignment", 5, u32(64))]),
                             "'general.alignment' must be a UINT32, got INT32", 24),
    "alignment not a power of two": (build(kvs=[kv("general.alignment", 4, u32(48))]),
                                     "'general.alignment' is 48, not a power of two", 24),
    "alignment zero": (build(kvs=[kv("general.alignment", 4, u32(0))]), "is 0, not a power of two", 24),
    "too many dims": (build(infos=[tinfo("t", [1] * 5, 0, 0)]), "tensor 't' has 5 dims; ggml allows at most 4", 33),
    "negative dim": (build(infos=[tinfo("t", [2**63], 0, 0)]), "dim 0 of tensor 't' is 9223372036854775808", 37),
    "dims overflow": (build(infos=[tinfo("t", [2**32, 2**32], 0, 0)]), "whose product overflows int64", 45),
    "too large for MLX": (build(infos=[tinfo("t", [32, 2**31], 0, 0)]), "too large for MLX", 53),
    "unknown ggml type": (build(infos=[tinfo("t", [32], 99, 0)]), "tensor 't' has unknown ggml type id 99", 45),
    "unsupported ggml type": (build(infos=[tinfo("t", [256], 15, 0)]),
                              r"ggml type Q8_K \(id 15\), which mlx_ggml_ext does not support", 45),
    "row not whole blocks": (build(infos=[tinfo("t", [48, 2], 2, 0)], data=bytes(64)),
                             "Q4_0 has rows of 48 elements, not a multiple of its block size 32", 53),
    "offset not aligned": (build(infos=[tinfo("t", [8], 0, 8)], data=bytes(64)),
                           "data offset 8 is not a multiple of the alignment 32", 49),
    "tensor past the end": (build(infos=[tinfo("t", [64], 0, 0)], data=bytes(100)),
                            r"tensor 't' data \[64, 320\) lies past the end of the file \(164 bytes\)", 49),
    "huge offset": (build(infos=[tinfo("t", [8], 0, 2**64 - 32)], data=bytes(32)), "lies past the end", 49),
    "overlapping tensors": (build(infos=[tinfo("a", [16], 0, 0), tinfo("b", [16], 0, 32)], data=bytes(96)),
                            "tensor 'b' data starting at byte 128 overlaps tensor 'a'", 82),
    "truncated tensor info": (build(infos=[tinfo("t" * 10, [8], 0, 0)[:29]], pad=False),
                              "dim 0 of tensor 'tttttttttt' needs 8 bytes but only 7 remain", 46),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_raise_clear_errors(tmp_path, case):
    data, match, offset = MALFORMED[case]
    path = write(tmp_path, data)
    with pytest.raises(GGUFFormatError, match=match) as e:
        mgguf.load(path)
    assert isinstance(e.value, ValueError)
    assert e.value.offset == offset and f"(at byte offset {offset})" in str(e.value)
    assert str(path) in str(e.value)


def test_every_truncation_of_a_valid_file_is_rejected(tmp_path):
    rng = np.random.default_rng(4)
    path = write_with_gguf_writer(
        tmp_path / "full.gguf",
        kvs=[("s", "text", VT.STRING, None), ("a", ["x", "yy"], VT.ARRAY, VT.STRING),
             ("n", [[1], [2, 3]], VT.ARRAY, VT.ARRAY), ("f", 1.5, VT.FLOAT64, None)],
        tensors=[("w", rng.integers(0, 256, (2, 36), dtype=np.uint8), GT.Q4_0),
                 ("v", rng.standard_normal(8).astype(np.float32), None)])
    full = path.read_bytes()
    f = mgguf.load(path)
    end_of_data = max(i.offset + i.nbytes for i in f.tensor_info.values())
    for n in itertools.chain(range(0, f.data_offset + 1), range(f.data_offset + 1, end_of_data, 7)):
        p = write(tmp_path, full[:n], "cut.gguf")
        with pytest.raises(GGUFFormatError):
            mgguf.load(p)
        os.unlink(p)
    mgguf.load(write(tmp_path, full[:end_of_data], "cut.gguf"))  # trailing padding is optional


def test_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        mgguf.load(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError):
        mgguf.load(tmp_path)


# ----------------------------------------------------------------------------------------
# Zero copy: the mapping, its lifetime and the process's memory
# ----------------------------------------------------------------------------------------

def mappings_of(path):
    """(start, end, file offset) of this process's mappings of `path` (Linux)."""
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.append((start, end, int(fields[2], 16)))
    return out


def address_of(a: mx.array) -> int:
    return np.asarray(memoryview(a)).__array_interface__["data"][0]


def test_mapped_file_binding(tmp_path):
    data = bytes(range(256)) * 4
    path = write(tmp_path, data, "raw.bin")
    m = _ext.MappedFile(str(path))
    assert m.size == 1024 and m.bytes(10, 5) == data[10:15] and m.path == str(path)
    a = m.array(100, [3, 4])
    assert a.dtype == mx.uint8 and a.shape == (3, 4)
    assert np.asarray(a).tobytes() == data[100:112]
    assert np.asarray(m.array(1000, 24)).tobytes() == data[1000:]
    view = m.view()
    assert view.tobytes() == data and not view.flags.writeable
    for bad in [lambda: m.array(1001, 24), lambda: m.array(0, [2, 513]), lambda: m.bytes(1024, 1),
                lambda: m.array(-1, 1), lambda: m.bytes(0, -1), lambda: m.array(0, [2**31, 1]),
                lambda: m.array(2**62, [2**31 - 1, 2**31 - 1, 2**31 - 1])]:
        with pytest.raises(ValueError, match=r"\[MappedFile\]"):
            bad()
    assert m.array(1024, 0).size == 0
    if _ext.gpu_backend() == "cpu":
        assert m.zero_copy
    if m.zero_copy and HAVE_PROC:
        # the array's bytes are the file's pages, not a copy
        (start, end, file_offset), = mappings_of(path)
        assert file_offset == 0 and address_of(a) == start + 100


def test_tensors_point_into_the_mapping_and_keep_it_alive(tmp_path):
    path = tmp_path / "alive.gguf"
    w = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    mgguf.save(path, {}, {"w": w, "v": w[0]})
    f = mgguf.load(path)
    if not f.zero_copy:
        pytest.skip("this MLX allocator cannot wrap host memory (copying path); see README")
    data = f.tensors["w"].data
    if HAVE_PROC:
        (start, end, _), = mappings_of(path)
        assert address_of(data) == start + f.tensor_info["w"].offset
    # writes through numpy's (writable) view stay in this process: the file is unchanged
    np.asarray(memoryview(f.tensors["v"].data))[0, :4] = 0xFF
    assert path.read_bytes()[f.tensor_info["v"].offset] == w[0].view(np.uint8)[0]
    del f
    gc.collect()
    view = data[2:4, 4:8]
    del data
    gc.collect()
    np.testing.assert_array_equal(np.asarray(view).view(np.float32), w[2:4, 1:2])
    if HAVE_PROC:
        assert len(mappings_of(path)) == 1
        del view
        gc.collect()
        mx.synchronize()
        assert mappings_of(path) == []  # unmapped with the last array


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_loading_a_large_file_does_not_copy_it(tmp_path):
    rows, row_floats = 250, 2**18  # 250 rows of 1 MiB: 250 MiB of F32
    path = tmp_path / "large.gguf"
    with open(path, "wb") as out:  # written in 1 MiB pieces so the test itself stays small
        header = build(kvs=[kv("k", 8, gstr("v"))], infos=[tinfo("w", [row_floats, rows], 0, 0)])
        out.write(header)
        base = np.arange(row_floats, dtype=np.float32)
        for r in range(rows):
            out.write((base + r).tobytes())
    gc.collect()
    before = rss_bytes() if HAVE_PROC else 0
    f = mgguf.load(path)
    after_load = rss_bytes() if HAVE_PROC else 0
    t = f.tensors["w"]
    assert t.shape == (rows, row_floats) and t.nbytes == rows * row_floats * 4
    touched = [np.asarray(t.data[r, 64:80]).view(np.float32) for r in (0, 17, 249)]
    after_touch = rss_bytes() if HAVE_PROC else 0
    for r, values in zip((0, 17, 249), touched):
        np.testing.assert_array_equal(values, np.arange(16, 20, dtype=np.float32) + r)
    if not f.zero_copy:
        pytest.skip("this MLX allocator cannot wrap host memory (copying path); see README")
    if HAVE_PROC:  # the one assertion that needs /proc
        size = path.stat().st_size
        assert after_load - before < size // 32, f"RSS grew {(after_load - before) / 2**20:.1f} MiB on load"
        assert after_touch - before < size // 16, f"RSS grew {(after_touch - before) / 2**20:.1f} MiB"


def test_large_vocabulary_loads(tmp_path):
    vocab = [f"▁tok{i}" for i in range(150_000)]
    scores = np.linspace(-1, 1, len(vocab), dtype=np.float32)
    mgguf.save(tmp_path / "vocab.gguf", {"tokenizer.ggml.tokens": vocab, "tokenizer.ggml.scores": scores}, {})
    f = mgguf.load(tmp_path / "vocab.gguf")
    assert f.metadata["tokenizer.ggml.tokens"] == vocab
    np.testing.assert_array_equal(f.metadata["tokenizer.ggml.scores"], scores)


# ----------------------------------------------------------------------------------------
# Fuzzing: any mutation of a valid file loads or raises ValueError
# ----------------------------------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("MLX_GGML_EXT_FUZZ_EXAMPLES", "300"))


def _fuzz_bases():
    """Valid files (bytes, end of header) to mutate."""
    rng = np.random.default_rng(5)
    out = []
    tensors = {"a": GGMLTensor(mx.array(rng.integers(0, 256, (2, 36), dtype=np.uint8)), "q4_0", (2, 64)),
               "b": GGMLTensor(mx.array(rng.integers(0, 256, (1, 210), dtype=np.uint8)), "q6_k", (1, 256)),
               "c": np.arange(6, dtype=np.float32).reshape(2, 3)}
    metadata = {"general.architecture": "llama", "n": Value(7, ValueType.UINT32), "s": ["ab", "", "c"],
                "nested": [[1, 2], ["x"]], "f": np.float64(0.5), "b": True,
                "u8": np.array([1, 2, 3], np.uint8)}
    with tempfile.TemporaryDirectory() as d:
        for alignment in (32, 8):
            p = os.path.join(d, f"base{alignment}.gguf")
            mgguf.save(p, metadata, tensors, alignment=alignment)
            f = mgguf.load(p)
            out.append((open(p, "rb").read(), f.data_offset))
    return out


FUZZ_BASES = _fuzz_bases()
HUGE = [0, 1, 3, 8, 9, 13, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]


@st.composite
def mutated_files(draw):
    data, header_end = FUZZ_BASES[draw(st.integers(0, len(FUZZ_BASES) - 1))]
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "splice", "u64", "u32"]))
        # mostly the header, where the parser reads; sometimes anywhere
        limit = max(1, min(len(data), header_end if draw(st.integers(0, 3)) else len(data)))
        at = draw(st.integers(0, limit - 1))
        if kind == "truncate":
            data = data[:at]
        elif kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "splice":
            n = draw(st.integers(0, 16))
            data[at:at + n] = draw(st.binary(max_size=24))
        else:
            width = 8 if kind == "u64" else 4
            value = draw(st.sampled_from(HUGE)) % (1 << (8 * width))
            data[at:at + width] = value.to_bytes(width, "little")
        if not data:
            break
    return bytes(data)


_fuzz_counter = itertools.count()


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          derandomize=os.environ.get("MLX_GGML_EXT_FUZZ_RANDOM") is None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mutated_files())
def test_fuzz_mutated_files_load_or_raise_value_error(tmp_path, data):
    path = tmp_path / f"fuzz{next(_fuzz_counter)}.gguf"
    path.write_bytes(data)
    try:
        f = mgguf.load(path)
    except GGUFFormatError as e:
        assert e.offset <= len(data)
        hypothesis.event("rejected")
        return
    finally:
        os.unlink(path)  # the mapping (if any) outlives the name
    # Loaded: every tensor's bytes lie in the file and can be read.
    hypothesis.event("loaded")
    for name, t in f.tensors.items():
        info = f.tensor_info[name]
        assert info.nbytes == 0 or info.offset + info.nbytes <= len(data)
        assert raw_bytes(t) == data[info.offset:info.offset + info.nbytes]
