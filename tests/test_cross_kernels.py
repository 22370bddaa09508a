"""The CPU kernels' portable baseline as it is built for arm64 (the NEON path that Apple Silicon
and other arm64 machines run), checked here on x86 under emulation.

tests/cross/kernel_check.cpp calls the kernels directly (no MLX); it is cross-compiled for
aarch64 with the flags cmake/cpu_variants.cmake gives the kernels and run under qemu-aarch64.
Its outputs are held to the same references as the package's own tests: gguf for the block
formats (bit and byte exact), the float64 SPEC formulas for rms_norm and rope.

Needs `aarch64-linux-gnu-g++` and `qemu-aarch64` (Debian: g++-aarch64-linux-gnu, qemu-user);
without them the module is skipped, naming what is missing. On an arm64 machine the package's
own tests already run this path natively.
"""

import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
import pytest

from mlx_ggml_ext import GGMLType, reference
from harness import nmse

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")

if platform.machine() in ("aarch64", "arm64"):
    pytest.skip("native arm64: the package's own tests run the NEON kernels", allow_module_level=True)
if not (CXX and QEMU):
    missing = " and ".join(n for n, p in [("aarch64-linux-gnu-g++", CXX), ("qemu-aarch64", QEMU)] if not p)
    pytest.skip(f"cross check of the arm64 kernels needs {missing} (Debian: g++-aarch64-linux-gnu, qemu-user)",
                allow_module_level=True)

# cmake/cpu_variants.cmake: every kernel -O3 -fno-math-errno -ffp-contract=fast, (de)quantize without
# contraction; the baseline variant holds the dispatching entry points. NEON is part of arm64's baseline.
COMMON_FLAGS = ["-std=c++20", "-O3", "-fno-math-errno", "-ffp-contract=fast", f"-I{ROOT}"]
NO_CONTRACTION = {"dequantize.cpp", "quantize.cpp"}


@pytest.fixture(scope="module")
def kernel_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("aarch64")
    sources = [(p, ["-DGGML_EXT_ISA=isa_base", "-DGGML_EXT_ISA_DISPATCH=1"])
               for p in sorted((ROOT / "kernels/cpu").glob("*.cpp"))]
    sources += [(p, []) for p in sorted((ROOT / "kernels/cpu/runtime").glob("*.cpp"))]
    sources += [(ROOT / "tests/cross/kernel_check.cpp", [])]

    def compile_one(item):
        src, defs = item
        obj = out / f"{src.parent.name}_{src.stem}.o"
        extra = ["-ffp-contract=off"] if src.name in NO_CONTRACTION else []
        subprocess.run([CXX, *COMMON_FLAGS, *extra, *defs, "-c", str(src), "-o", str(obj)], check=True)
        return str(obj)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, sources))
    binary = out / "kernel_check"
    subprocess.run([CXX, "-static", "-pthread", *objects, "-o", str(binary)], check=True)

    def run(*args, inputs=(), out_dtype=np.uint8):
        paths = []
        for i, data in enumerate(inputs):
            path = out / f"in{i}.bin"
            path.write_bytes(np.ascontiguousarray(data).tobytes())
            paths.append(str(path))
        result = out / "out.bin"
        argv = [QEMU, str(binary), *[str(a) for a in args[:1]], *[str(a) for a in args[1:]], *paths, str(result)]
        subprocess.run(argv, check=True, timeout=120)
        return np.fromfile(result, dtype=out_dtype)

    return run


def _gguf_type(t: GGMLType):
    return gguf.GGMLQuantizationType(int(t))


@pytest.mark.parametrize("ggml_type", [t for t in GGMLType if not t.is_float], ids=lambda t: t.name)
def test_dequantize_bit_identical_to_gguf(kernel_check, ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    rows, k = 3, 4 * ggml_type.block_size
    blocks = reference.random_blocks(rng, ggml_type.name, rows, k)
    n_blocks = rows * k // ggml_type.block_size
    got = kernel_check("dequantize", int(ggml_type), n_blocks, inputs=[blocks], out_dtype=np.float32)
    expected = gguf.quants.dequantize(blocks, _gguf_type(ggml_type)).astype(np.float32).reshape(-1)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


EXACT_QUANTIZE = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.MXFP4]


@pytest.mark.parametrize("ggml_type", EXACT_QUANTIZE, ids=lambda t: t.name)
def test_quantize_byte_identical_to_gguf(kernel_check, ggml_type):
    rng = np.random.default_rng(100 + int(ggml_type))
    w = (rng.standard_normal((4, 256)) * rng.uniform(0.01, 10, (4, 1))).astype(np.float32)
    w[1] = 0.0
    got = kernel_check("quantize", int(ggml_type), w.size // ggml_type.block_size, inputs=[w])
    expected = gguf.quants.quantize(w, _gguf_type(ggml_type)).reshape(-1)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_k_quants_write_the_same_bytes_as_this_machine(kernel_check, ggml_type):
    """The K-quant search is written to give the same bytes on every ISA: the arm64 build must agree
    with this machine's build (whose quality the package's own tests hold against a reference)."""
    import mlx.core as mx
    from mlx_ggml_ext import ops
    rng = np.random.default_rng(200 + int(ggml_type))
    w = rng.standard_t(3, (4, 512)).astype(np.float32)
    got = kernel_check("quantize", int(ggml_type), w.size // 256, inputs=[w])
    here = np.array(ops.quantize(mx.array(w), ggml_type, stream=mx.cpu)).reshape(-1)
    np.testing.assert_array_equal(got, here)


def _as_storage(x: np.ndarray, float_type: int) -> np.ndarray:
    """float32 values in the kernels' storage format, and those values back as float64."""
    if float_type == 0:
        return x, x.astype(np.float64)
    if float_type == 1:
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    bits = x.view(np.uint32)
    b = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return b, (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _from_storage(raw: np.ndarray, float_type: int) -> np.ndarray:
    if float_type == 0:
        return raw.view(np.float32).astype(np.float64)
    if float_type == 1:
        return raw.view(np.float16).astype(np.float64)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# float32 accumulation plus one rounding to the storage format (tests/harness.py's bounds)
REL_TOL = {0: 2e-6, 1: 1e-3, 2: 8e-3}


@pytest.mark.parametrize("float_type", [0, 1, 2], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dim", [7, 64, 1000])
def test_rms_norm(kernel_check, float_type, dim):
    rng = np.random.default_rng(dim + float_type)
    rows = 37
    x, x64 = _as_storage((rng.standard_normal((rows, dim)) * 3).astype(np.float32), float_type)
    w, w64 = _as_storage(rng.standard_normal(dim).astype(np.float32), float_type)
    raw = kernel_check("rms_norm", float_type, rows, dim, "1e-5", inputs=[x, w])
    got = _from_storage(raw, float_type).reshape(rows, dim)
    expected = reference.rms_norm(x64, w64, 1e-5)
    assert np.max(np.abs(got - expected)) <= REL_TOL[float_type] * np.max(np.abs(expected))


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("dim, n_dims", [(128, 128), (80, 32)])
def test_rope(kernel_check, mode, dim, n_dims):
    rng = np.random.default_rng(dim + n_dims)
    tokens, heads = 19, 3
    x = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    positions = rng.integers(0, 100_000, tokens).astype(np.int32)
    raw = kernel_check("rope", 0, tokens, heads, dim, n_dims, int(mode == "neox"), "10000", "0.25",
                       inputs=[x, positions])
    got = raw.view(np.float32).astype(np.float64).reshape(tokens, heads, dim)
    expected = reference.rope(x.astype(np.float64), positions, n_dims, mode, freq_base=10000.0, freq_scale=0.25)
    assert nmse(got, expected) <= 1e-7  # ggml's own rope tolerance, as in test_rope.py
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q2_K,
                                       GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL,
                                       GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.F16,
                                       GGMLType.TQ2_0, GGMLType.TQ1_0, GGMLType.IQ2_XXS, GGMLType.IQ2_S,
                                       GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_M], ids=lambda t: t.name)
def test_quantized_matmul(kernel_check, ggml_type):
    """The NEON product (int8 activations, 16-element chunks) against float64 on the gguf-decoded weight; the
    transposed product (float32 on the decoded values) much tighter."""
    rng = np.random.default_rng(300 + int(ggml_type))
    n, k = 24, 768 if ggml_type.block_size == 256 else 32 * 23
    blocks = reference.random_blocks(rng, ggml_type.name, n, k)
    if ggml_type.is_float:
        dense = blocks.view(np.float16).astype(np.float64).reshape(n, k)
    else:
        dense = gguf.quants.dequantize(blocks, _gguf_type(ggml_type)).astype(np.float64).reshape(n, k)
    for m in (1, 5, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = kernel_check("matmul", int(ggml_type), m, n, k, 0, inputs=[x, blocks], out_dtype=np.float32)
        assert nmse(got.reshape(m, n), x.astype(np.float64) @ dense.T) <= (1e-11 if ggml_type.is_float else 2e-4)
    g = rng.standard_normal((3, n)).astype(np.float32)
    got = kernel_check("matmul", int(ggml_type), 3, n, k, 1, inputs=[g, blocks], out_dtype=np.float32)
    assert nmse(got.reshape(3, k), g.astype(np.float64) @ dense) <= 1e-11
