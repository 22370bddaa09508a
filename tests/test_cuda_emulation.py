"""The CUDA kernels (kernels/cuda/*.cu) run on the host, held to the package's references.

tests/cuda_emulation/cuda_emu.h compiles the .cu files as C++ and runs every CUDA thread of a block as a host
thread (barriers for __syncthreads, memory for warp shuffles); the kernels are chosen and launched by the
same *_launch functions that eval_gpu uses. This checks what a GPU-less machine can check: indexing, tails,
vector and scalar paths, broadcasting, bit-exact dequantize, against the same references as the GPU suite
(gguf, the float64 SPEC formulas). The WMMA calls are emulated tile by tile (the tiles' indexing is checked, not
the tensor cores' rounding); GPU-specific numerics (sincosf, NaN payloads) are not emulated. Needs g++ (C++20) and the CUDA headers
(cuda_fp16.h); without them the module is skipped, naming what is missing.
"""

import ctypes
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from harness import nmse, ties_and_one_hot_q8_0
from mlx_ggml_ext import GGMLType, reference

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("g++")
# Extra compile and link flags, e.g. tests/run_sanitized.sh's -fsanitize=address,undefined: an emulated kernel's
# read past a buffer (numpy's, sized exactly) is then reported on the host.
EMU_FLAGS = os.environ.get("MLX_GGML_EXT_EMU_CXXFLAGS", "").split()


def cuda_include_dir():
    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for c in candidates:
        if c and (Path(c) / "include" / "cuda_fp16.h").exists():
            return Path(c) / "include"
    return None


CUDA_INCLUDE = cuda_include_dir()
if not (CXX and CUDA_INCLUDE):
    missing = " and ".join(n for n, p in [("g++", CXX), ("the CUDA headers (cuda_fp16.h)", CUDA_INCLUDE)] if not p)
    pytest.skip(f"host emulation of the CUDA kernels needs {missing}", allow_module_level=True)

F32, F16, BF16 = 0, 1, 2  # ggml_ext::cpu::FloatType
NP_TYPES = {F32: np.float32, F16: np.float16, BF16: np.uint16}


def param_id(value):
    """A test id part: a type by its name (GGMLType is an IntEnum, whose str is its number)."""
    return value.name if isinstance(value, GGMLType) else str(value)


class RmsNormArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("weight", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("rows", ctypes.c_int64), ("dim", ctypes.c_int64), ("rows_per_weight", ctypes.c_int64),
                ("eps", ctypes.c_float), ("residual", ctypes.c_void_p), ("sum", ctypes.c_void_p)]


class GluArgs(ctypes.Structure):
    _fields_ = [("gate", ctypes.c_void_p), ("up", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("in_stride", ctypes.c_int64),
                ("alpha", ctypes.c_float), ("limit", ctypes.c_float)]


class RopeArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("positions", ctypes.c_void_p),
                ("freq_factors", ctypes.c_void_p), ("ramp", ctypes.c_void_p)] + \
               [(n, ctypes.c_int64) for n in ("batches", "tokens", "heads", "dim", "n_dims",
                                              "batches_per_positions_row", "batches_per_factors_row")] + \
               [(n, ctypes.c_float) for n in ("theta_scale", "freq_scale", "mscale", "sin_sign")] + \
               [("copied_heads", ctypes.c_int64), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("q_heads", ctypes.c_int64), ("norm_eps", ctypes.c_float)]


class DequantizeArgs(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_void_p), ("y", ctypes.c_void_p), ("n_blocks", ctypes.c_int64)]


class QuantizedMatmulArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p)] + \
               [(n, ctypes.c_int64) for n in ("m", "n", "k", "row_bytes", "batches", "b2", "a2", "ratio2",
                                              "ratio3")] + [("out_f32", ctypes.c_bool)]


class MulMatIdArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("ids", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p)] + \
               [(n, ctypes.c_int64) for n in ("t", "n_used", "x_slots", "e", "n", "k", "row_bytes")]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The emulated kernels, compiled once per session (test_cuda_emulation_attention.py shares them)."""
    if "library" not in _COMPILED:
        _COMPILED["library"] = compiled_kernels(tmp_path_factory.mktemp("cuda_emulation"))
    return _COMPILED["library"]


_COMPILED = {}  # the session's one compiled library


def compiled_kernels(out):
    sources = sorted((ROOT / "kernels/cuda").glob("*.cu")) + [ROOT / "tests/cuda_emulation/emulated_launch.cpp"]

    def compile_unit(source):
        obj = out / (source.name + ".o")
        subprocess.run([CXX, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", *EMU_FLAGS, "-include",
                        str(ROOT / "tests/cuda_emulation/cuda_emu.h"), f"-I{ROOT}", f"-I{CUDA_INCLUDE}", "-x", "c++",
                        "-c", str(source), "-o", str(obj)], check=True)
        return str(obj)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # one g++ per file: the cores in parallel
        objects = list(pool.map(compile_unit, sources))
    lib = out / "kernels.so"
    # -Bsymbolic: the kernels' calls to the emulated runtime (cudaDeviceGetAttribute, ...) bind to this library's
    # own definitions. Without it, a process that already holds the real CUDA runtime's symbols globally (a GPU
    # machine's, once MLX's CUDA backend is loaded) interposes them: the plans then saw the real GPU's shared
    # memory limit, not the emulated one, and test_decode_shared_x_beyond_the_block_shared_memory failed there.
    subprocess.run([CXX, "-shared", "-Wl,-Bsymbolic", *EMU_FLAGS, *objects, "-o", str(lib)], check=True)
    kernels = ctypes.CDLL(str(lib))
    kernels.emulated_selftest.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # pointers as addresses
    # A call with an argument too few would read garbage for it: ctypes counts them where argtypes are declared.
    kernels.emulated_quantized_matmul.argtypes = [QuantizedMatmulArgs] + [ctypes.c_int] * 4
    kernels.emulated_quantized_matmul_takes_int8_tiles.argtypes = [QuantizedMatmulArgs] + [ctypes.c_int] * 4
    return kernels


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def stored(x: np.ndarray, ftype: int) -> np.ndarray:
    """x (float) in the storage of `ftype` (bfloat16 as its bits)."""
    return to_bf16_bits(x) if ftype == BF16 else np.asarray(x, NP_TYPES[ftype])


def loaded(a: np.ndarray, ftype: int) -> np.ndarray:
    """float64 values of an array stored as `ftype`."""
    if ftype == BF16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


TOL = {F32: 2e-6, F16: 1e-3, BF16: 8e-3}  # harness.TOLERANCES for rms_norm and rope


# ----------------------------------------------------------------------------- the emulator itself

def test_emulator_exposes_a_missing_barrier(kernels):
    """A block's threads run as fibers in turn: a load from shared memory without the barrier after the other
    threads' stores reads a stale value, as it may on a GPU; with the barrier, the reversed input."""
    x = np.arange(64, dtype=np.float32)
    for variant, shift in [(1, 0.0), (0, 100.0)]:
        shifted, y = x + shift, np.zeros(64, np.float32)
        assert kernels.emulated_selftest(ptr(shifted), ptr(y), variant) == 0
        assert np.array_equal(y, shifted[::-1]) == (variant == 1), (variant, y)


def test_emulator_reports_a_barrier_not_every_thread_reaches(kernels):
    """__syncthreads in code that only the first warp runs: an error (4), not a hang."""
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    assert kernels.emulated_selftest(ptr(x), ptr(y), 2) == 4


# ----------------------------------------------------------------------------- dequantize

@pytest.mark.parametrize("rows", [5, 37], ids=lambda r: f"{r}rows")
@pytest.mark.parametrize("t", list(GGMLType), ids=lambda t: t.name)
def test_dequantize_bit_exact(kernels, t, rows):
    """Every bit of gguf's float32; 37 rows give the block kernel whole warps of chunks (stored through shared
    memory) and a last partial one."""
    rng = np.random.default_rng(int(t) + rows)
    k = max(t.block_size, 16) * 3 + (5 if t.is_float else 0)  # float types: a tail past the 4-wide vectors
    data = rng.integers(0, 256, (rows, t.row_bytes(k)), dtype=np.uint8)
    with np.errstate(all="ignore"):  # gguf's numpy math on NaN/inf scales
        expected = np.asarray(quants.dequantize(data, gguf.GGMLQuantizationType(int(t))), np.float32).reshape(-1)
    nan = np.isnan(expected)
    for out_type in (F32, F16, BF16):
        y = np.zeros(expected.size, NP_TYPES[out_type])
        args = DequantizeArgs(ptr(data), ptr(y), data.nbytes // t.type_size)
        assert kernels.emulated_dequantize(args, int(t), out_type) == 0
        if out_type == F32:
            np.testing.assert_array_equal(np.isnan(y), nan)
            np.testing.assert_array_equal(y.view(np.uint32)[~nan], expected.view(np.uint32)[~nan])
        else:
            with np.errstate(over="ignore"):
                rounded = stored(np.where(nan, 0, expected), out_type)
            got = y.view(np.uint16)
            np.testing.assert_array_equal(got[~nan], rounded.view(np.uint16)[~nan])


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_dequantize_float_types_unaligned(kernels, t):
    """Float storage that does not start on a 4-element boundary takes the scalar path."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(70).astype(np.float32)
    raw = np.asarray(quants.quantize(x, gguf.GGMLQuantizationType(int(t)))).view(np.uint8)
    buf = np.zeros(raw.nbytes + 64, np.uint8)
    base = (-buf.ctypes.data) % 16 + t.type_size  # one element past a 16-byte boundary
    buf[base:base + raw.nbytes] = raw
    y = np.zeros(70, np.float32)
    assert kernels.emulated_dequantize(DequantizeArgs(buf.ctypes.data + base, ptr(y), 70), int(t), F32) == 0
    np.testing.assert_array_equal(y, quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))))


# ----------------------------------------------------------------------------- rms_norm

@pytest.mark.parametrize("ftype", [F32, F16, BF16])
def test_rms_norm(kernels, ftype):
    rng = np.random.default_rng(10 + ftype)
    # 3/17/100: scalar path; 16/64/4096/9000: vectors in registers; 9000 (f32)/20000: past the registers
    for dim in [3, 16, 17, 64, 100, 4096, 9000, 20000]:
        for groups in (0, 1, 3):
            rows = 6
            x = stored(rng.standard_normal((rows, dim)), ftype)
            w = stored(rng.standard_normal((max(groups, 1), dim)), ftype)
            y = np.zeros_like(x)
            args = RmsNormArgs(ptr(x), ptr(w) if groups else None, ptr(y), rows, dim, rows // max(groups, 1), 1e-5)
            assert kernels.emulated_rms_norm(args, ftype) == 0
            weight = np.repeat(loaded(w, ftype), rows // max(groups, 1), axis=0) if groups else None
            expected = reference.rms_norm(loaded(x, ftype), weight, 1e-5)
            err = np.max(np.abs(loaded(y, ftype) - expected))
            assert err <= TOL[ftype] * np.max(np.abs(expected)), (dim, groups, err)


# ----------------------------------------------------------------------------- glu

GLU_KINDS = ["swiglu", "geglu", "geglu_erf", "swiglu_oai"]

@pytest.mark.parametrize("ftype", [F32, F16, BF16])
@pytest.mark.parametrize("kind", [0, 1, 2, 3], ids=GLU_KINDS)
@pytest.mark.parametrize("fused", [False, True], ids=["two_arrays", "fused"])
def test_glu(kernels, ftype, kind, fused):
    """act(gate) * up against test_glu.py's float64 formulas, both layouts (the fused one's rows hold gate then
    up), odd lengths; swiglu_oai with values past its limits (+-7) on both inputs."""
    from test_glu import OAI_ALPHA, OAI_LIMIT, expected_glu
    rng = np.random.default_rng(30 + ftype + 3 * kind)
    rows, cols = 5, 37
    x = stored(rng.standard_normal((rows, 2 * cols)) * (6 if kind == 3 else 3), ftype)
    y = np.zeros((rows, cols), x.dtype)
    if fused:
        args = GluArgs(ptr(x), ptr(x) + cols * x.itemsize, ptr(y), rows, cols, 2 * cols, OAI_ALPHA, OAI_LIMIT)
        gate, up = loaded(x, ftype)[:, :cols], loaded(x, ftype)[:, cols:]
    else:
        g, u = np.ascontiguousarray(x[:, :cols]), np.ascontiguousarray(x[:, cols:])
        args = GluArgs(ptr(g), ptr(u), ptr(y), 1, rows * cols, rows * cols, OAI_ALPHA, OAI_LIMIT)
        gate, up = loaded(g, ftype), loaded(u, ftype)
    assert kernels.emulated_glu(args, ftype, kind) == 0
    expected = expected_glu(GLU_KINDS[kind], gate, up)
    err = np.max(np.abs(loaded(y, ftype) - expected))
    assert err <= TOL[ftype] * 2 * np.max(np.abs(expected)), err


# ----------------------------------------------------------------------------- quantized matmul

def matmul_case(kernels, t, x_type, m, transpose, batch=(1, 1), w_batch=(1, 1), n=40, out_f32=False, k=None,
                float_x=False):
    """Runs the kernel on random data; returns (got, expected float64). float_x: ops' precise_x (float32 x stays
    float32 on the tiles)."""
    rng = np.random.default_rng(int(t) * 100 + m)
    k = k or 2 * max(t.block_size, 32) + (3 if t.is_float else 0)
    (b3, b2), (a3, a2) = batch, w_batch
    w = np.stack([reference.random_blocks(rng, t.name, n, k) for _ in range(a3 * a2)])  # (A, N, row_bytes)
    w_values = np.stack([reference.dequantize(wi, t.name, (n, k)) for wi in w])        # float64 (A, N, K)
    reduce, outs = (n, k) if transpose else (k, n)
    x = stored(rng.standard_normal((b3 * b2, m, reduce)), x_type)
    y = np.zeros((b3 * b2, m, outs), np.float32 if out_f32 or x_type == F32 else NP_TYPES[x_type])
    args = QuantizedMatmulArgs(ptr(x), ptr(w), ptr(y), None, m, n, k, w.shape[-1], b3 * b2, b2, a2, b2 // a2, b3 // a3,
                               out_f32)
    assert kernels.emulated_quantized_matmul(args, int(t), x_type, int(transpose), int(float_x)) == 0
    xs = loaded(x, x_type)
    expected = np.empty(y.shape)
    for z in range(b3 * b2):
        wz = w_values[(z // b2 // (b3 // a3)) * a2 + (z % b2) // (b2 // a2)]
        expected[z] = xs[z] @ (wz if transpose else wz.T)
    got = y.astype(np.float64) if y.dtype != np.uint16 else loaded(y, BF16)
    return got, expected


@pytest.mark.parametrize("t", list(GGMLType), ids=lambda t: t.name)
@pytest.mark.parametrize("m, transpose", [(9, False), (70, False), (1, True), (70, True)], ids=str)
def test_quantized_matmul_float32(kernels, t, m, transpose):
    """float32 x kept float32 (precise_x): FMA tiles; against float64 on gguf-independent decoded weights. (Decode,
    m <= 8: below.)"""
    got, expected = matmul_case(kernels, t, F32, m, transpose, float_x=True)
    assert nmse(got, expected) < 1e-10


@pytest.mark.parametrize("t", list(GGMLType), ids=lambda t: t.name)
@pytest.mark.parametrize("m, x_type", [(1, F32), (8, F16)], ids=str)
def test_precise_x_decode(kernels, t, m, x_type):
    """precise_x on m <= 8 rows (a model's output head): the float decode kernel, each weight row's 16-element
    chunks decoded to float32 and multiplied with x's floats (no rounding of the inputs; float16 x: its output's)."""
    got, expected = matmul_case(kernels, t, x_type, m, False, float_x=True)
    assert nmse(got, expected) < (1e-10 if x_type == F32 else HALF_BOUND[F16])


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.MXFP4, GGMLType.IQ2_XXS,
                               GGMLType.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("m, k", [(9, None), (70, 263 * 32)], ids=str)
def test_quantized_matmul_float32_on_tensor_cores(kernels, t, m, k):
    """float32 x on quantized weights, forward, without precise_x: the bfloat16 tensor-core tiles (x and the weight
    rounded to bfloat16 as they are staged, float32 sums and output; MXFP4's reference decoder, an IQ grid's, Q4_0's
    2-byte aligned rows at k = 8416, not a whole number of 64-element steps), or where the format has fragments and
    its rows start on 4-byte boundaries (Q4_0 at k = 64, Q4_K, Q6_K) the int8 tiles, which meet the same bound. Float
    weights keep the FMA tiles (their rounding only)."""
    if t.block_size == 256 and k:
        k = 33 * 256
    got, expected = matmul_case(kernels, t, F32, m, False, k=k)
    assert nmse(got, expected) < (1e-10 if t.is_float else HALF_BOUND[BF16])
    if not t.is_float:  # rounded, not exact: the FMA tiles would be below 1e-10
        assert nmse(got, expected) > 1e-9


HALF_BOUND = {F16: 2e-6, BF16: 1e-4}  # one rounding of weight and output: (2^-11)^2 or (2^-8)^2 scale


# The decoded types (IQ grids, ternary) take the same reference-decoder tiles for both half types: float16 only.
HALF_CASES = [(t, x) for t in GGMLType for x in (F16, BF16) if x == F16 or t.name not in reference.GGUF_DECODED]


@pytest.mark.parametrize("t, x_type", HALF_CASES, ids=param_id)
@pytest.mark.parametrize("m, transpose, out_f32", [(70, False, False), (70, True, True)], ids=str)
def test_quantized_matmul_half_inputs(kernels, t, x_type, m, transpose, out_f32):
    """float16/bfloat16 x with precise_x (else the forward product of the formats with fragments takes the int8
    tiles: test_cuda_emulation_int8_tiles.py): the tensor-core tiles (the weight rounded to x's type), float32 sums;
    quantized rows on 4-byte boundaries decoded from aligned words (all but MXFP4's 34-byte rows here). (Decode:
    below.)"""
    got, expected = matmul_case(kernels, t, x_type, m, transpose, out_f32=out_f32, float_x=True)
    assert nmse(got, expected) < HALF_BOUND[x_type]


@pytest.mark.parametrize("t, k", [(GGMLType.Q4_0, 96), (GGMLType.Q8_0, 96), (GGMLType.Q4_1, 96),
                                  (GGMLType.Q4_K, 768), (GGMLType.F16, 67)], ids=param_id)
@pytest.mark.parametrize("m, transpose", [(9, False), (130, False), (3, True), (65, True)], ids=str)
def test_quantized_matmul_half_tiles_edges(kernels, t, k, m, transpose):
    """The tensor-core tiles at their edges: a last reduction step half full (k = 96, 67; 768 = 12 steps of 64),
    rows of x past a 64-row tile, outputs past 128 (n = 130 transposed) and rows only 2-byte aligned (Q4_0 and
    Q8_0 with 3 blocks: the reference decoders; Q4_1, Q4_K: aligned words). precise_x, so that Q4_1 and Q4_K stay
    on these tiles."""
    got, expected = matmul_case(kernels, t, F16, m, transpose, n=130 if transpose else 40, k=k, float_x=True)
    assert nmse(got, expected) < HALF_BOUND[F16]


@pytest.mark.parametrize("t", [GGMLType.Q5_1, GGMLType.Q3_K, GGMLType.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("m, transpose", [(70, False), (5, True)], ids=str)
def test_quantized_matmul_broadcasting(kernels, t, m, transpose):
    """ggml's broadcasting: x batches (2, 4) over weight batches (1, 2)."""
    got, expected = matmul_case(kernels, t, F32, m, transpose, batch=(2, 4), w_batch=(1, 2), float_x=True)
    assert nmse(got, expected) < 1e-10


# ----------------------------------------------------------------------------- quantized matmul: decode (m <= 8)
# Quantized weights: x quantized to int8 per 32 elements, integer dot products (kernels/cuda/matmul_decode_plans.cuh).
# Held to the rule of the GPU suite (tests/test_matmul.py): NMSE against exact math at most 1.1 times that of
# ggml's own CPU scheme (emulated below) and at most 2e-4. Float weights keep the float kernel (rounding only).

# Every quantized type, the decoded ones (IQ grids, ternary: reference.GGUF_DECODED, kernels/cuda/decode_formats_iq.cuh)
# included; those take __dp4a at every m <= 8 (no tensor-core fragments), so their cases are fewer.
QUANT_TYPES = [t for t in GGMLType if not t.is_float]
DECODE_CASES = [(t, x, m) for t in QUANT_TYPES for x in (F32, F16, BF16) for m in (1, 3, 8)
                if t.name not in reference.GGUF_DECODED or (x, m) in ((F32, 1), (F16, 8), (BF16, 3))]
FLOAT_WEIGHTS = [t for t in GGMLType if t.is_float]


def ggml_scheme(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """x (float64, last axis K) as ggml's CPU quantizes it for its integer dot products: Q8_K (float scale
    -128/max per 256) for the K-quants and IQ4_XS, else Q8_0 (amax/127 per 32, round half away from zero,
    the scale stored as float16)."""
    rows = x.reshape(-1, 256 if t.block_size == 256 else 32)
    if t.block_size == 256:
        vmax = rows[np.arange(rows.shape[0]), np.argmax(np.abs(rows), axis=1)]
        iscale = np.where(vmax != 0, -128.0 / np.where(vmax != 0, vmax, 1), 0.0).astype(np.float32)
        q = np.minimum(127, np.round(iscale[:, None] * rows))
        d = np.where(iscale != 0, 1.0 / np.where(iscale != 0, iscale, 1), 0.0)
    else:
        d32 = np.abs(rows).max(axis=1) / 127.0
        v = rows * np.where(d32 != 0, 1.0 / np.where(d32 != 0, d32, 1), 0.0)[:, None]
        q = np.sign(v) * np.floor(np.abs(v) + 0.5)
        d = d32.astype(np.float16).astype(np.float64)
    return (q * d[:, None]).reshape(x.shape)


def decode_case(kernels, t, x_type, m, k, n=40, batch=(1, 1), w_batch=(1, 1), out_f32=False, seed=0):
    """The decode kernels on random blocks and x with a few outliers: (got, exact, ggml's scheme's result),
    the last rounded to the output's type as ggml would store it."""
    rng = np.random.default_rng(int(t) * 1000 + m * 10 + k + seed)
    (b3, b2), (a3, a2) = batch, w_batch
    w = np.stack([reference.random_blocks(rng, t.name, n, k) for _ in range(a3 * a2)])
    w_values = np.stack([reference.dequantize(wi, t.name, (n, k)) for wi in w])
    xf = rng.standard_normal((b3 * b2, m, k))
    xf[..., ::97] *= 8.0  # a few outliers, as real activations have
    x = stored(xf, x_type)
    out_type = F32 if out_f32 or x_type == F32 else x_type
    y = np.zeros((b3 * b2, m, n), NP_TYPES[out_type])
    args = QuantizedMatmulArgs(ptr(x), ptr(w), ptr(y), None, m, n, k, w.shape[-1], b3 * b2, b2, a2, b2 // a2,
                               b3 // a3, out_f32)
    assert kernels.emulated_quantized_matmul(args, int(t), x_type, 0, 0) == 0
    xs = loaded(x, x_type)
    exact, theirs = np.empty(y.shape), np.empty(y.shape)
    for z in range(b3 * b2):
        wz = w_values[(z // b2 // (b3 // a3)) * a2 + (z % b2) // (b2 // a2)]
        exact[z] = xs[z] @ wz.T
        theirs[z] = ggml_scheme(xs[z], t) @ wz.T
    theirs = loaded(stored(theirs, out_type), out_type)
    return loaded(y, out_type), exact, theirs


def assert_no_less_accurate_than_ggml(got, exact, theirs, what, k=512):
    """At most 1.1x ggml's scheme; and, for rows of 256 or more elements, within ggml's own MUL_MAT tolerance
    5e-4 (this x has outliers, where ggml's scheme reaches 1.5e-3 for Q5_K; the GPU suite's 2e-4 on plain normal
    x is checked by tests/test_matmul.py; rows of one or two blocks carry too few terms for either bound)."""
    ours, ggml = nmse(got, exact), nmse(theirs, exact)
    assert ours <= 1.1 * ggml and (k < 256 or ours <= 5e-4), f"{what}: ours {ours:.3e}, ggml's scheme {ggml:.3e}"


def decode_ks(t: GGMLType):
    """K: a multiple of 256 inside one 4096-element segment and across two; for 32-element blocks also tiny
    rows, an odd block count (rows only 2-byte aligned) and 11008 (not a multiple of 256, three segments)."""
    ks = [512, 4352]
    if t.block_size == 32:
        ks += [32, 64, 288, 11008]
    return ks


@pytest.mark.parametrize("t, x_type, m", DECODE_CASES,
                         ids=[f"{t.name}-{['f32', 'f16', 'bf16'][x]}-{m}" for t, x, m in DECODE_CASES])
def test_decode_no_less_accurate_than_ggml(kernels, t, x_type, m):
    """The ratio to ggml's scheme on float32 outputs (a float16/bfloat16 output's own rounding would decide
    ties between two equally good results); x's own type as the output: within the GPU suite's 2e-4."""
    for k in decode_ks(t):
        n = 40 if k <= 4352 else 12
        got, exact, theirs = decode_case(kernels, t, x_type, m, k, n=n, out_f32=True)
        assert_no_less_accurate_than_ggml(got, exact, theirs, f"K={k}", k)
    if x_type != F32:
        got, exact, _ = decode_case(kernels, t, x_type, m, 512)
        assert nmse(got, exact) <= 5e-4  # as above: x with outliers


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.Q3_K, GGMLType.Q6_K, GGMLType.Q4_K],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("m", [2, 5])
def test_decode_broadcasting(kernels, t, m):
    """ggml's broadcasting: x batches (2, 4) over weight batches (1, 2); float32 output of float16 x (Q4_0, Q5_1,
    Q4_K at m=5: the staged tensor-core kernel, decode_staged_fragment_kernel)."""
    got, exact, theirs = decode_case(kernels, t, F16, m, 512, n=20, batch=(2, 4), w_batch=(1, 2), out_f32=True)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "broadcast")


@pytest.mark.parametrize("t, k", [(GGMLType.Q6_K, 2048), (GGMLType.Q3_K, 2048), (GGMLType.Q2_K, 1024),
                                  (GGMLType.Q2_K, 3072)], ids=param_id)
@pytest.mark.parametrize("m", [4, 8])
def test_decode_per_half_staged(kernels, t, k, m):
    """The formats with a scale per 16 elements on the staged tensor-core kernel (rows on 16-byte boundaries at
    these K): two m16n8k16 products per x-block, and chunks of one block (210, 110, 84 bytes) that start inside a
    16-byte word, so each chunk is read at its own offset into the stage."""
    got, exact, theirs = decode_case(kernels, t, F16, m, k, n=24, out_f32=True)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "per-16 staged", k)


@pytest.mark.parametrize("t, offset", [(GGMLType.Q4_0, 2), (GGMLType.Q8_0, 2), (GGMLType.MXFP4, 1),
                                       (GGMLType.Q4_K, 4), (GGMLType.Q5_K, 4), (GGMLType.Q5_K, 2)], ids=param_id)
def test_decode_unaligned_rows(kernels, t, offset):
    """Weight rows starting off 16-byte boundaries (an odd offset for MXFP4's 17-byte blocks): narrower staging
    loads (offsets 1, 2), or the direct reads' word path instead of 16-byte loads (4: Q4_K, Q5_K), never a
    misread."""
    rng = np.random.default_rng(31)
    n, k, m = 24, 4352, 3
    w = reference.random_blocks(rng, t.name, n, k)
    buf = np.zeros(w.nbytes + 64, np.uint8)
    base = (-buf.ctypes.data) % 16 + offset
    buf[base:base + w.nbytes] = w.reshape(-1)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = np.zeros((m, n), np.float32)
    args = QuantizedMatmulArgs(ptr(x), buf.ctypes.data + base, ptr(y), None, m, n, k, w.shape[-1], 1, 1, 1, 1, 1,
                               False)
    assert kernels.emulated_quantized_matmul(args, int(t), F32, 0, 0) == 0
    dense = reference.dequantize(w, t.name, (n, k))
    exact = x.astype(np.float64) @ dense.T
    assert_no_less_accurate_than_ggml(y, exact, ggml_scheme(x.astype(np.float64), t) @ dense.T, "unaligned")


@pytest.mark.parametrize("t, m", [(GGMLType.Q4_0, 1), (GGMLType.Q4_K, 1), (GGMLType.Q2_K, 1), (GGMLType.Q4_0, 8),
                                  (GGMLType.Q5_K, 8), (GGMLType.Q8_0, 8), (GGMLType.Q4_0, 4), (GGMLType.Q5_K, 2),
                                  (GGMLType.Q4_K, 2), (GGMLType.Q8_0, 2), (GGMLType.Q4_0, 3), (GGMLType.Q2_K, 4),
                                  (GGMLType.Q4_0, 2), (GGMLType.IQ4_XS, 1), (GGMLType.Q5_1, 1), (GGMLType.Q4_1, 1),
                                  (GGMLType.Q5_0, 1)],
                         ids=param_id)
def test_decode_many_rows(kernels, t, m):
    """A weight of more rows than kFewRows (8192): up to fused_max_m rows of x the fused kernel (x quantized in
    each block's shared memory, rows of x one after another; the emulation reports 2 multiprocessors, so each warp
    loops over many rows; Q2_K: the code sums of both halves; Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_XS at m=1: each warp
    takes pairs of weight rows, the last pair of these 8195 rows half past the end; Q4_1 and Q5_0 quantize x one
    x-block per thread at a time); above, the staged tensor-core kernel with
    8 warps per 16 rows (Q4_0: 4) instead of 16."""
    got, exact, theirs = decode_case(kernels, t, F16, m, 256, n=8195, out_f32=True)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "many rows", 256)


@pytest.mark.parametrize("t, m, batches", [(GGMLType.Q4_0, 2, 1), (GGMLType.Q4_0, 6, 1), (GGMLType.Q4_0, 8, 1),
                                           (GGMLType.Q4_K, 3, 1), (GGMLType.Q6_K, 5, 1), (GGMLType.IQ4_XS, 3, 1),
                                           (GGMLType.IQ4_XS, 8, 1), (GGMLType.Q8_0, 4, 1), (GGMLType.Q4_1, 3, 1),
                                           (GGMLType.Q5_0, 5, 1), (GGMLType.Q5_1, 4, 1), (GGMLType.Q5_K, 2, 1),
                                           (GGMLType.Q5_K, 6, 1), (GGMLType.Q2_K, 4, 1), (GGMLType.Q6_K, 2, 2),
                                           (GGMLType.Q8_0, 3, 2)],
                         ids=param_id)
def test_decode_many_rows_shared_x(kernels, t, m, batches):
    """Rows of 2048 elements on a weight of many rows: several chunks per warp and 16-row group. Where
    shared_x_route allows, the staged kernel quantizes x in its own shared memory (8 warps per 16 rows: Q4_0 m=6,
    Q4_K m=3, Q4_1 m=3, Q5_K m=2; else 16) and each of its blocks (a few per multiprocessor; the emulation reports 2)
    takes many groups of 16 rows, its copies running on from one group into the next (Q6_K: chunks not on 16-byte
    boundaries; IQ4_XS: 16 x-blocks per chunk); else both steps (Q4_0 m=2 fused, IQ4_XS m=3, Q2_K). Two batches
    of weights and x (grid.y) for Q6_K and Q8_0."""
    got, exact, theirs = decode_case(kernels, t, F16, m, 2048, n=8200, batch=(1, batches), w_batch=(1, batches),
                                     out_f32=True)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "many rows, shared x", 2048)


@pytest.mark.parametrize("t, m", [(GGMLType.Q4_0, 1), (GGMLType.Q5_K, 1), (GGMLType.Q4_K, 1), (GGMLType.Q6_K, 1),
                                  (GGMLType.Q4_0, 2), (GGMLType.Q8_0, 2), (GGMLType.Q5_K, 2), (GGMLType.Q4_1, 2)],
                         ids=param_id)
def test_decode_few_rows_one_kernel(kernels, t, m):
    """A weight of few rows (1000, not a multiple of 16) where the routes measured one kernel to pay there: the
    fused kernel at m=1 (every format that has one) and the 16-warp staged kernel with x inside at m=2 (Q4_0, Q8_0,
    Q5_K); Q4_1 keeps both steps at m=2."""
    got, exact, theirs = decode_case(kernels, t, F16, m, 1024, n=1000, out_f32=True)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "few rows, one kernel", 1024)


def test_decode_shared_x_beyond_the_block_shared_memory(kernels):
    """A GPU that gives a block less shared memory than the staged kernel with x inside needs (here sm_86's 99 KB
    against Q8_0's 16 warps of stages plus x, about 160 KB; the emulated launch fails a block asking for more, as
    a GPU's does): the plan falls back to both steps instead of failing."""
    kernels.emulated_set_block_shared_limit(99 * 1024)
    try:
        got, exact, theirs = decode_case(kernels, GGMLType.Q8_0, F16, 8, 2048, n=8200, out_f32=True)
    finally:
        kernels.emulated_set_block_shared_limit(232448)
    assert_no_less_accurate_than_ggml(got, exact, theirs, "shared x beyond the limit", 2048)


@pytest.mark.parametrize("n", [256, 8200])
def test_decode_x_codes_round_to_nearest_even(kernels, n):
    """x's codes as tests/test_matmul.py checks them on a GPU (ties and their neighbours through a one-hot Q8_0
    weight): 256 rows, the quantize step (m=1) and the few-rows staged kernel with x inside (m=2); 8200 rows, the
    fused kernel (m=1) and the staged kernel with x inside (m=2)."""
    rng = np.random.default_rng(n)
    k = 256
    x, codes, w = ties_and_one_hot_q8_0(rng, n, k)
    for m in (1, 2):
        xm = np.ascontiguousarray(x[:m])
        y = np.zeros((m, n), np.float32)
        args = QuantizedMatmulArgs(ptr(xm), ptr(w), ptr(y), None, m, n, k, w.shape[-1], 1, 1, 1, 1, 1, False)
        assert kernels.emulated_quantized_matmul(args, int(GGMLType.Q8_0), F32, 0, 0) == 0
        np.testing.assert_array_equal(y, codes[:m, np.arange(n) % k], err_msg=f"m={m}")


def test_decode_non_finite_x(kernels):
    """A NaN in a row of x makes that row's outputs NaN; an infinity makes them non-finite; others stay finite."""
    rng = np.random.default_rng(5)
    t, n, k = GGMLType.Q4_0, 8, 64
    w = reference.random_blocks(rng, t.name, n, k)
    x = np.ones((3, k), np.float32)
    x[1, 5] = np.nan
    x[2, 40] = np.inf
    y = np.zeros((3, n), np.float32)
    args = QuantizedMatmulArgs(ptr(x), ptr(w), ptr(y), None, 3, n, k, w.shape[-1], 1, 1, 1, 1, 1, False)
    assert kernels.emulated_quantized_matmul(args, int(t), F32, 0, 0) == 0
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and not np.isfinite(y[2]).any()
    # One row at a time on a weight of many rows: the fused kernel (x quantized in shared memory) does the same.
    n = 8195
    w = reference.random_blocks(rng, t.name, n, k)
    rows = [np.zeros((1, n), np.float32) for _ in range(3)]
    for i, yi in enumerate(rows):
        xi = np.ascontiguousarray(x[i:i + 1])
        args = QuantizedMatmulArgs(ptr(xi), ptr(w), ptr(yi), None, 1, n, k, w.shape[-1], 1, 1, 1, 1, 1, False)
        assert kernels.emulated_quantized_matmul(args, int(t), F32, 0, 0) == 0
    assert np.isfinite(rows[0]).all() and np.isnan(rows[1]).all() and not np.isfinite(rows[2]).any()


@pytest.mark.parametrize("x_type", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("t", FLOAT_WEIGHTS, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_decode_float_weights(kernels, t, x_type, m):
    """Float weights keep the float kernel: rounding of the output only."""
    got, expected = matmul_case(kernels, t, x_type, m, False)
    bound = {F32: 1e-10, F16: 2e-6, BF16: 1e-4}[x_type]
    assert nmse(got, expected) < bound
    got, expected = matmul_case(kernels, t, F32, m, False, batch=(2, 4), w_batch=(1, 2))
    assert nmse(got, expected) < 1e-10


# ----------------------------------------------------------------------------- mul_mat_id
# Forward: the (token, slot) pairs grouped by expert on the device (kernels/cuda/mul_mat_id_groups.cuh), then each
# expert's rows decoded once per chunk of up to 8 of its pairs: quantized weights take the decode route's integer dots
# (x quantized to int8 per 32: test_decode's rule against ggml's own scheme; rows not on 4-byte boundaries staged
# through shared memory first), float weights the float chunk decoders (float32 sums). The transposed product (x's
# gradient) is grouped too, each decoded chunk of an expert's rows used for up to 4 of its pairs.

def int_dot_route(t: GGMLType, k: int) -> bool:
    """Whether the forward product takes the integer dots: a quantized type (the IQ grid and ternary ones too),
    whatever its rows' alignment (MXFP4's 17-byte blocks, Q6_K's 210-byte ones at an odd count)."""
    return not t.is_float and k % 32 == 0


def gguf_values(blocks: np.ndarray, t: GGMLType, n: int, k: int) -> np.ndarray:
    """float64 (n, k) of one expert's rows, decoded by the gguf package."""
    return np.asarray(quants.dequantize(blocks, gguf.GGMLQuantizationType(int(t))), np.float64).reshape(n, k)


def mul_mat_id_case(kernels, t, x_type, ids, E, n, k, slots, transpose, seed):
    """Runs the op on random experts and x (a few outliers, as real activations have); checks that the pairs of bad
    ids got NaN rows; returns, for the others, (got, exact, ggml's scheme's result rounded to the output type)."""
    rng = np.random.default_rng(seed)
    T, used = ids.shape
    w = np.stack([reference.random_blocks(rng, t.name, n, k) for _ in range(E)])  # (E, N, row_bytes)
    w_values = np.stack([gguf_values(wi, t, n, k) for wi in w])                     # float64 (E, N, K)
    xf = rng.standard_normal((T, slots, n if transpose else k))
    xf[..., ::97] *= 8.0
    x = stored(xf, x_type)
    y = stored(np.full((T, used, k if transpose else n), 3.0), x_type)  # not NaN: every row must be written
    args = MulMatIdArgs(ptr(x), ptr(w), ptr(ids), ptr(y), None, T, used, slots, E, n, k, w.shape[-1])
    assert kernels.emulated_mul_mat_id(args, int(t), x_type, int(transpose)) == 0
    xs, got = loaded(x, x_type), loaded(y, x_type)
    valid = (ids >= 0) & (ids < E)
    assert np.isnan(got[~valid]).all()
    tk, sl = np.nonzero(valid)
    xv = xs[tk, sl if slots > 1 else 0]                      # (pairs, reduce)
    we = w_values[ids[tk, sl]]                               # (pairs, N, K)
    if transpose:
        return got[valid], np.einsum("pn,pnk->pk", xv, we), None
    theirs = np.einsum("pnk,pk->pn", we, ggml_scheme(xv, t) if not t.is_float else xv)
    return got[valid], np.einsum("pnk,pk->pn", we, xv), loaded(stored(theirs, x_type), x_type)


def assert_mul_mat_id(got, exact, theirs, t, x_type, k, transpose, what):
    """The integer dots: test_decode's rule (float32 x: at most 1.1x ggml's scheme; float16/bfloat16 output, whose
    own rounding decides between equally good results: 5e-4). The float kernels: float32 rounding only (bfloat16
    x: one rounding of the output)."""
    if not transpose and int_dot_route(t, k):
        if x_type == F32:
            assert_no_less_accurate_than_ggml(got, exact, theirs, what, k)
        else:
            assert nmse(got, exact) <= 5e-4, what
        return
    assert nmse(got, exact) < (1e-10 if x_type == F32 else 1e-4), what


MMID_TYPES = [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.IQ4_XS, GGMLType.MXFP4,
              GGMLType.IQ2_XXS, GGMLType.F16, GGMLType.F32]


@pytest.mark.parametrize("t", MMID_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("x_type", [F32, BF16])
@pytest.mark.parametrize("transpose, x_slots", [(False, "per_slot"), (False, "broadcast"), (True, "per_slot")],
                         ids=["forward", "broadcast_x", "transposed"])
def test_mul_mat_id(kernels, t, x_type, transpose, x_slots):
    """Each (token, slot) pair through its expert, ids read by the kernels, against float64 on gguf's decoded
    experts; a bad id (here E and -1) gives its pair a row of NaN and leaves the others right. Float rows of K = 259
    end inside a 16-element chunk (the tail reads no x past the row); MXFP4's 34-byte rows are staged."""
    rng = np.random.default_rng(int(t) * 10 + x_type + 3 * transpose)
    E, n, T, used = 5, 33, 4, 3
    k = 259 if t.is_float else 2 * max(t.block_size, 32)
    ids = np.stack([rng.permutation(E)[:used] for _ in range(T)]).astype(np.int32)
    ids[3, 1], ids[2, 0] = E, -1
    slots = 1 if x_slots == "broadcast" else used
    got, exact, theirs = mul_mat_id_case(kernels, t, x_type, ids, E, n, k, slots, transpose, seed=int(t))
    assert_mul_mat_id(got, exact, theirs, t, x_type, k, transpose, x_slots)


def skewed_ids(case: str):
    """(ids, E): routings that exercise the grouping: one expert for every pair (21 pairs: three chunks of 8, the
    last partial), 300 pairs (past the grouping kernel's chunk of 256) of which most go to expert 0, a few experts
    never chosen, ids repeated within a token and bad ones; two pairs (chunks of 2: two tokens) on one expert; 600
    experts (the grouping's scan of more buckets than threads), most unused; one token (chunks of one pair) naming
    an expert three times."""
    rng = np.random.default_rng(7)
    if case == "one_expert":
        ids = np.full((7, 3), 2, np.int32)
        ids[4, 2] = 9
        return ids, 6
    if case == "300_pairs":
        ids = np.where(rng.random((100, 3)) < 0.8, 0, rng.integers(3, 6, (100, 3))).astype(np.int32)
        ids[[5, 50, 99], [0, 1, 2]] = [-2, 6, -1]
        return ids, 6
    if case == "600_experts":
        ids = rng.integers(0, 600, (5, 4)).astype(np.int32)
        ids[0, 0], ids[4, 3] = 599, 600
        return ids, 600
    if case == "one_token":
        return np.array([[3, 0, 3, 5, -1, 1, 3, 4]], np.int32), 6
    return np.full((2, 1), 5, np.int32), 6


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.IQ4_XS,
                               GGMLType.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("case", ["one_expert", "300_pairs", "two_pairs", "600_experts", "one_token"])
def test_mul_mat_id_skewed_routing(kernels, t, case):
    """Skewed routing through the grouped kernels, float32 x, and for 300 pairs also bfloat16 x read by every slot
    (broadcast): every valid pair's row right (none left unwritten), every bad id's row NaN."""
    n = 8 if case == "600_experts" else 20
    k = 67 if t.is_float else 2 * max(t.block_size, 32)
    ids, E = skewed_ids(case)
    for x_type, slots in [(F32, ids.shape[1])] + ([(BF16, 1)] if case == "300_pairs" else []):
        got, exact, theirs = mul_mat_id_case(kernels, t, x_type, ids, E, n, k, slots, False, seed=int(t) + x_type)
        assert_mul_mat_id(got, exact, theirs, t, x_type, k, False, f"{case} x_type={x_type}")


@pytest.mark.parametrize("t, k", [(GGMLType.Q4_K, 768), (GGMLType.Q4_0, 768), (GGMLType.Q4_K, 2048),
                                  (GGMLType.Q8_0, 256)], ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("tokens, slots", [(1, 1), (8, 1), (8, 8)])
def test_mul_mat_id_half_warps_at_expert_widths(kernels, t, k, tokens, slots):
    """Rows of qwen3-30b-a3b's widths: Q4_K at K = 768 has 12 pairs of sub-blocks, too few for 32 lanes, so each
    half-warp takes its own rows (SubWarp, 16 lanes); Q4_0 at 768 and Q4_K at 2048 keep 32 lanes; Q8_0 at 256 has 8
    x-blocks. One token (the one-launch kernel) and 8 (grouping, then the dot kernel), x per token or per slot; 42
    rows, so the last warp's second half-warp reads past the expert's rows and must store nothing."""
    rng = np.random.default_rng(int(t) + k + tokens)
    E, n, used = 16, 42, 8
    ids = np.stack([rng.permutation(E)[:used] for _ in range(tokens)]).astype(np.int32)
    got, exact, theirs = mul_mat_id_case(kernels, t, F32, ids, E, n, k, slots, False, seed=int(t) + k)
    assert_mul_mat_id(got, exact, theirs, t, F32, k, False, f"k={k} tokens={tokens} slots={slots}")


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("case", ["4100_experts", "wide_x", "transposed_one_expert"])
def test_mul_mat_id_launch_shapes(kernels, t, case):
    """The plans the cases above do not reach: 68 pairs (more than the one-launch kernel groups in a block: the
    grouping launch, then the dot kernel) over 4100 experts (bucket counts in the workspace rather than shared
    memory), two tokens naming the same experts, so fewer experts have pairs than the grid has rows of blocks;
    8 tokens of K = 5120 (a chunk's 8 rows of x past the one-launch kernel's shared memory: two launches); the
    transposed product with 20 pairs on one expert (5 passes of 4 over 2 blocks along z, a bad id)."""
    rng = np.random.default_rng(11)
    if case == "transposed_one_expert":
        ids, E = skewed_ids("one_expert")
        n, k = 20, 67 if t.is_float else 256
        got, exact, _ = mul_mat_id_case(kernels, t, F32, ids, E, n, k, ids.shape[1], True, seed=int(t))
        assert_mul_mat_id(got, exact, None, t, F32, k, True, case)
        return
    if case == "4100_experts":
        E, n, k = 4100, 8, 67 if t.is_float else 256
        ids = rng.integers(0, E, (17, 4)).astype(np.int32)
        ids[1] = ids[0]
        ids[5, 1], ids[9, 2] = E, -3
    else:
        E, n, k = 4, 8, 5120
        ids = np.stack([rng.permutation(E)[:2] for _ in range(8)]).astype(np.int32)
        ids[3, 1] = -1
    got, exact, theirs = mul_mat_id_case(kernels, t, F32, ids, E, n, k, ids.shape[1], False, seed=int(t))
    assert_mul_mat_id(got, exact, theirs, t, F32, k, False, case)
