"""The Metal kernels (kernels/metal/*.metal), verified without Apple hardware.

1. The Metal-language check: every .metal file compiles as C++ against the project's Metal shim
   (tests/metal_emu/metal_stdlib) with warnings as errors; the strict check compiles it with clang and
   address spaces as distinct types; g++'s call graph shows no recursion, function pointer or allocation.
2. The emulator: the kernels run on the CPU with Metal's execution model (tests/metal_emu/runtime.cpp:
   concurrent lanes per threadgroup, real barriers and simdgroup collectives, byte-exact bounds checks,
   shuffled lane order), dispatched with the grid and arguments csrc/backend/metal uses, and compared with
   independent references (gguf, float64 numpy) under the tolerances of the other backends.
3. Memory-traffic figures per kernel launch (tests/metal_emu/traffic.h), one JSON line each with -s.

Needs g++ (and clang for the strict check). Nothing here ran on a Mac: Apple's compiler and GPU may still
disagree (see docs/metal.md).
"""

import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from harness import TOLERANCES
from mlx_ggml_ext import reference
from metal_emu import emulator as emu
from metal_emu.emulator import DTYPES

pytestmark = [
    pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the Metal emulator is for Linux CI (ucontext fibers, guard pages); on a Mac run "
                              "the kernels themselves: MLX_GGML_EXT_DEVICE=gpu pytest -q tests"),
]

# The other backends' tolerances (tests/harness.py), relative to the largest reference magnitude.
MX_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
TOL = {op: {name: TOLERANCES[op][d] for name, d in MX_DTYPES.items()} for op in ("rms_norm", "rope")}


@pytest.fixture(scope="session")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu"))


def assert_close(got, expected, tol, what=""):
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.1e} * {scale:.3e}"


# ---------------------------------------------------------------------------------------------------
# 1. Metal-language check
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("metal_file", emu.metal_sources(), ids=lambda p: p.name)
def test_metal_source_compiles(metal_file, tmp_path):
    result = emu.compile_check(metal_file, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("source", sorted(emu.METAL_DIR.glob("*")), ids=lambda p: p.name)
def test_metal_source_follows_msl_rules(source):
    """What the shim's erased address spaces hide from g++: every pointer and reference names its address
    space; no double, standard library, exceptions or `kernel` keyword."""
    assert emu.msl_rule_violations(source) == []


def test_msl_rules_check_finds_violations(tmp_path):
    bad = tmp_path / "bad.metal"
    bad.write_text("inline float f(float* p) { return *(const float*)p; }\ninline double g() { return 0; }\n")
    assert len(emu.msl_rule_violations(bad)) == 3


def test_compile_check_rejects_a_type_error(tmp_path):
    """The check can fail: a kernel storing a pointer into a float is an error."""
    bad = tmp_path / "bad.metal"
    bad.write_text('#include "kernels/metal/common.h"\n'
                   "[[kernel]] void bad(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
                   "  y[i] = y;\n}\n")
    assert emu.compile_check(bad, tmp_path).returncode != 0


strict = pytest.mark.skipif(emu.CLANG is None, reason="the strict address-space check needs clang "
                            "(Debian: apt-get install clang)")


@strict
@pytest.mark.parametrize("metal_file", emu.metal_sources(), ids=lambda p: p.name)
def test_metal_source_passes_the_strict_check(metal_file, tmp_path):
    """clang with every address space a distinct type, as in Apple's compiler."""
    result = emu.strict_check(metal_file, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]


@strict
def test_strict_check_rejects_a_device_pointer_where_threadgroup_is_expected(tmp_path):
    source = ('#include "kernels/metal/common.h"\n'
              "inline void fill(threadgroup float* t, uint i) { t[i] = 0.0f; }\n"
              "[[kernel]] void bad(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
              "  fill(%s, i);\n}\n")
    good, bad = tmp_path / "good.metal", tmp_path / "bad.metal"
    good.write_text(source.replace("device float* y [[buffer(0)]]", "threadgroup float* y [[threadgroup(0)]]") % "y")
    bad.write_text(source % "y")
    assert emu.strict_check(good, tmp_path).returncode == 0
    result = emu.strict_check(bad, tmp_path)
    assert result.returncode != 0 and "address space" in result.stderr, result.stderr


def test_kernels_have_no_recursion_function_pointers_or_allocation(metal):
    """MSL has none of them; g++'s call graph of the compiled kernels (-fcallgraph-info) shows them."""
    graphs = sorted(metal.work_dir.glob("*_launchers.ci"))
    assert len(graphs) == len(emu.metal_sources())
    for ci in graphs:
        assert emu.call_graph_violations(ci) == [], ci.name


def test_call_graph_check_finds_violations(tmp_path):
    (tmp_path / "kernels").mkdir()
    bad = tmp_path / "kernels" / "bad.cpp"
    bad.write_text("int f(int);\nint g(int x) { return x ? f(x - 1) : 0; }\nint f(int x) { return g(x); }\n"
                   "int h(int (*p)(int)) { return p(3); }\nint* k() { return new int[3]; }\n")
    subprocess.run([emu.CXX, "-O1", *emu.INSTRUMENT_FLAGS, "-c", str(bad), "-o", str(tmp_path / "bad.o")], check=True)
    found = emu.call_graph_violations(tmp_path / "bad.ci")
    assert [v.split(" ")[0] for v in found] == ["indirect", "dynamic", "recursion:"], found


def test_metal_glue_compiles_against_mlx_metal_headers(tmp_path):
    """csrc/backend/metal/*.cpp (eval_gpu) against the installed MLX's own Metal headers, with
    tests/metal_glue standing in for Apple's metal-cpp: MLX's encoder API as the glue calls it."""
    import importlib.util

    mlx_include = Path(importlib.util.find_spec("mlx").submodule_search_locations[0]) / "include"
    if not (mlx_include / "mlx/backend/metal/device.h").exists():
        pytest.skip("this MLX wheel ships no Metal headers")
    for source in sorted((emu.ROOT / "csrc/backend/metal").glob("*.cpp")):
        cmd = [emu.CXX, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-isystem{mlx_include}",
               f"-isystem{emu.ROOT / 'tests/metal_glue'}", f"-I{emu.ROOT}", str(source)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name}:\n{result.stderr[-4000:]}"


def test_every_kernel_the_glue_asks_for_exists(metal):
    """The host names csrc/backend/metal/primitives.cpp builds, for every type and dtype."""
    wanted = set()
    for sfx in DTYPES:
        wanted |= {f"rms_norm_{sfx}", f"rope_{sfx}"} | {f"glu_{k}_{sfx}" for k in GLU_KINDS}
        for t in QUANT_TYPES + FLOAT_TYPES:
            wanted |= {f"{k}_{t.lower()}_{sfx}" for k in ("dequantize", "qmv_x1", "qmv_x4", "qmv_x8", "qmm", "qmm_t",
                                                                "mul_mat_id_x1", "mul_mat_id_x8",
                                                                "mul_mat_id_t")}
    wanted |= {"mul_mat_id_group", "rows_copy_u16", "rows_copy_u32"}
    assert wanted <= metal.kernels, sorted(wanted - metal.kernels)


# ---------------------------------------------------------------------------------------------------
# 2. The emulator finds what it must find (tests/metal_emu/selftest.metal)
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu_selftest"), [emu.HERE / "selftest.metal"])


def test_emulator_exposes_a_missing_barrier(selftest):
    x = np.arange(128, dtype=np.float32)
    expected = x.reshape(2, 64)[:, ::-1].reshape(-1)

    def run(with_barrier, seed):
        out = selftest.dispatch("reverse_through_threadgroup", (2,), (64,), threadgroup={0: 256}, seed=seed,
                                buffers={0: x, 1: np.zeros(128, np.float32), 2: np.uint32(with_barrier)})
        return out[1].view(np.float32)

    assert all(np.array_equal(run(1, seed), expected) for seed in range(3))
    assert not np.array_equal(run(0, 0), expected)


def test_emulator_reports_out_of_bounds_and_early_return(selftest):
    x = np.ones(64, np.float32)
    args = {0: x, 1: np.zeros(64, np.float32)}
    selftest.dispatch("copy_with_overrun", (2,), (32,), buffers={**args, 2: np.uint32(0)})
    message = selftest.dispatch("copy_with_overrun", (2,), (32,), buffers={**args, 2: np.uint32(1)},
                                expect_failure=True)
    assert "out-of-bounds access to buffer(0) (size 256) at byte offset 256" in message
    message = selftest.dispatch("return_before_barrier", (1,), (8,), buffers={0: np.zeros(8, np.float32)},
                                expect_failure=True)
    assert "returned before" in message


def test_emulator_simd_collectives(selftest):
    x = np.random.default_rng(0).standard_normal(96).astype(np.float32)
    out = selftest.dispatch("simd_collectives", (1,), (96,), buffers={0: x, 1: np.zeros(480, np.float32)})
    y = out[1].view(np.float32).reshape(3, 32, 5)
    lane = np.arange(32)
    for g, v in enumerate(x.reshape(3, 32)):
        np.testing.assert_allclose(y[g, :, 0], np.sum(v.astype(np.float64)), rtol=1e-6)
        assert np.all(y[g, :, 1] == v.max())
        assert np.array_equal(y[g, :, 2], v[lane ^ 1])
        assert np.array_equal(y[g, :, 3], v[np.where(lane + 3 < 32, lane + 3, lane)])
        assert np.all(y[g, :, 4] == v[5])


# ---------------------------------------------------------------------------------------------------
# rms_norm
# ---------------------------------------------------------------------------------------------------
def rms_norm_reference(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dim,rows,weighted", [(1, 3, True), (33, 4, False), (200, 3, True), (1100, 2, True)])
def test_rms_norm(metal, dtype, dim, rows, weighted):
    check_rms_norm(metal, dtype, dim, rows, weighted)


def test_rms_norm_in_place(metal):
    """eval_gpu donates x's buffer to the output when MLX allows: y aliases x."""
    check_rms_norm(metal, "f32", 1100, 3, True, in_place=True)


def check_rms_norm(metal, dtype, dim, rows, weighted, in_place=False):
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng = np.random.default_rng(dim)
    x = to_storage(rng.standard_normal((rows, dim)) * 3)
    w = to_storage(rng.standard_normal(dim))
    eps = 1e-5
    plan = metal.plan("rms_norm", dtype=dtype, rows=rows, dim=dim, rows_per_weight=rows, weighted=int(weighted),
                      eps=eps)
    buffers = {0: x, 1: w if weighted else x, 4: x, 5: x}  # 4, 5: add_rms_norm's, bound to x as the glue does
    if not in_place:
        buffers[2] = np.full(x.shape, 0xFF, storage)
    out = metal.dispatch_plan(plan, buffers, args_index=3, seed=dim, aliases={2: 0} if in_place else None)
    got = to_f32(out[0 if in_place else 2]).reshape(rows, dim)
    expected = rms_norm_reference(to_f32(x), to_f32(w) if weighted else None, eps)
    assert_close(got, expected, TOL["rms_norm"][dtype], f"rms_norm {dtype}")


# ---------------------------------------------------------------------------------------------------
# glu (test_glu.py's float64 references and tolerances)
# ---------------------------------------------------------------------------------------------------
GLU_KINDS = ["swiglu", "geglu", "geglu_erf", "swiglu_oai"]


@pytest.mark.parametrize("kind,dtype,fused,cols", [("swiglu", "f32", True, 300), ("geglu", "bf16", False, 37),
                                                   ("geglu_erf", "f32", True, 37), ("swiglu_oai", "f16", True, 37),
                                                   ("swiglu_oai", "f32", False, 300)])
def test_glu(metal, kind, dtype, fused, cols):
    """Both layouts (fused rows hold gate then up), a partial threadgroup; swiglu_oai past its limits (+-limit)."""
    from test_glu import TOL as GLU_TOL, activation, swiglu_oai
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng, rows, alpha, limit = np.random.default_rng(cols), 3, 1.5, 5.0
    x = to_storage(rng.standard_normal((rows, 2 * cols)) * 4)
    g, u = to_f32(x)[:, :cols], to_f32(x)[:, cols:]
    fields = dict(kind=kind, dtype=dtype, alpha=alpha, limit=limit)
    if fused:
        plan = metal.plan("glu", rows=rows, cols=cols, in_stride=2 * cols, up_offset=cols, **fields)
        buffers = {0: x, 1: x}
    else:  # two arrays: one long row
        plan = metal.plan("glu", rows=1, cols=rows * cols, in_stride=rows * cols, up_offset=0, **fields)
        buffers = {0: to_storage(g), 1: to_storage(u)}
    buffers[2] = np.full((rows, cols), 0xFF, storage)
    got = to_f32(metal.dispatch_plan(plan, buffers, args_index=3, seed=cols)[2]).reshape(rows, cols)
    expected = swiglu_oai(g, u, alpha, limit) if kind == "swiglu_oai" else activation(kind, g) * u
    assert_close(got, expected, GLU_TOL[MX_DTYPES[dtype]], f"glu {kind} {dtype}")


# ---------------------------------------------------------------------------------------------------
# dequantize
# ---------------------------------------------------------------------------------------------------
QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
               "IQ4_XS", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]
FLOAT_TYPES = ["F32", "F16", "BF16"]


def same_bits_or_both_nan(got: np.ndarray, expected: np.ndarray) -> bool:
    nan = np.isnan(expected)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan], expected[~nan])
                and np.array_equal(np.signbit(got[~nan]), np.signbit(expected[~nan])))


def rounded_to(expected_f32: np.ndarray, dtype: str) -> np.ndarray:
    _, to_storage, to_f32 = DTYPES[dtype]
    return to_f32(to_storage(expected_f32))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("type_name", QUANT_TYPES + FLOAT_TYPES)
def test_dequantize_every_byte_pattern(metal, type_name, dtype):
    """Random bytes (NaN/inf/subnormal scales included) decode to gguf's float32 bits, rounded once for
    float16/bfloat16."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 7 if block_size > 1 else 300
    rng = np.random.default_rng(int(qtype) * 3 + len(dtype))
    data = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf scales are part of the test
        expected = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(-1)
    plan = metal.plan("dequantize", type=type_name.lower(), block_size=block_size, dtype=dtype, n_blocks=n_blocks)
    out = metal.dispatch_plan(plan, {0: data, 1: np.full(expected.size, 0xFF, DTYPES[dtype][0])}, args_index=2,
                              seed=int(qtype))
    got = DTYPES[dtype][2](out[1])
    assert same_bits_or_both_nan(got, rounded_to(expected, dtype)), type_name


# ---------------------------------------------------------------------------------------------------
# rope
# ---------------------------------------------------------------------------------------------------
def rope_host_constants(n_dims, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig,
                        inverse):
    """What csrc/rope.cpp's rope_angles/rope_ramp give the kernels: theta_scale, mscale, sin_sign, and the
    YaRN mix per pair (None without YaRN), in float32 as the SPEC states them."""
    f32 = np.float32
    theta_scale = f32(np.float64(f32(freq_base)) ** np.float64(f32(-2.0) / f32(n_dims)))
    mscale, ramp = f32(attn_factor), None
    if ext_factor != 0.0:
        def corr_dim(beta):
            return (f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(beta) * f32(2.0) * f32(np.pi)))
                    / (f32(2.0) * np.log(f32(freq_base))))
        low = max(f32(0.0), np.floor(corr_dim(beta_fast)))
        high = min(f32(n_dims - 1), np.ceil(corr_dim(beta_slow)))
        y = (np.arange(n_dims // 2, dtype=f32) - f32(low)) / max(f32(0.001), f32(high - low))
        ramp = ((f32(1.0) - np.clip(y, f32(0.0), f32(1.0))) * f32(ext_factor)).astype(f32)
        mscale = f32(mscale * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / f32(freq_scale))))
    return theta_scale, mscale, f32(-1.0 if inverse else 1.0), ramp


ROPE_CASES = {
    "normal": dict(shape=(2, 3, 2, 16), n_dims=16, mode="normal"),
    "neox-partial": dict(shape=(1, 4, 3, 20), n_dims=12, mode="neox"),
    "yarn-factors-long": dict(shape=(2, 2, 2, 32), n_dims=32, mode="neox", freq_scale=0.25, ext_factor=1.0,
                              n_ctx_orig=4096, factors=True, max_position=100000),
    "inverse-per-batch-positions": dict(shape=(3, 2, 2, 8), n_dims=8, mode="normal", inverse=True,
                                        positions_per_batch=True),
    # 4-element vectors (RopeArgs::vec4) for "normal", "yarn-factors-long", "inverse-per-batch-positions" and
    # this partial NORMAL rotation with its 8 copied dims; element by element for "neox-partial" (n_dims 12
    # is not a multiple of 8) and, forced, "normal-partial-scalar".
    "normal-partial": dict(shape=(1, 3, 3, 20), n_dims=12, mode="normal"),
    "normal-partial-scalar": dict(shape=(1, 3, 3, 20), n_dims=12, mode="normal", vec4=0),
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope(metal, case, dtype):
    check_rope(metal, case, dtype)


def test_rope_in_place(metal):
    """eval_gpu donates x's buffer to the output when MLX allows: y aliases x."""
    check_rope(metal, "neox-partial", "f16", in_place=True)


def check_rope(metal, case, dtype, in_place=False):
    import mlx_ggml_ext.reference as reference

    c = ROPE_CASES[case]
    batches, tokens, heads, dim = c["shape"]
    n_dims, neox = c["n_dims"], c["mode"] == "neox"
    params = dict(freq_base=10000.0, freq_scale=c.get("freq_scale", 1.0), ext_factor=c.get("ext_factor", 0.0),
                  attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=c.get("n_ctx_orig", 0))
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng = np.random.default_rng(len(case))
    x = to_storage(rng.standard_normal(c["shape"]))
    position_rows = batches if c.get("positions_per_batch") else 1
    positions = rng.integers(0, c.get("max_position", 64), (position_rows, tokens)).astype(np.int32)
    factors = rng.uniform(1.0, 4.0, n_dims // 2).astype(np.float32) if c.get("factors") else None
    theta_scale, mscale, sin_sign, ramp = rope_host_constants(n_dims, inverse=c.get("inverse", False), **params)
    plan = metal.plan("rope", dtype=dtype, batches=batches, tokens=tokens, heads=heads, dim=dim, n_dims=n_dims,
                      batches_per_positions_row=batches // position_rows, batches_per_factors_row=batches,
                      neox=int(neox), has_factors=int(factors is not None), has_ramp=int(ramp is not None),
                      theta_scale=float(theta_scale), freq_scale=float(params["freq_scale"]), mscale=float(mscale),
                      sin_sign=float(sin_sign), **({"vec4": c["vec4"]} if "vec4" in c else {}))
    buffers = {0: x, 2: positions, 3: factors if factors is not None else x,  # as csrc/backend/metal binds
               4: ramp if ramp is not None else x, 6: x, 7: x}
    if not in_place:
        buffers[1] = np.full(x.shape, 0xFF, storage)
    out = metal.dispatch_plan(plan, buffers, args_index=5, seed=len(case), aliases={1: 0} if in_place else None)
    got = to_f32(out[0 if in_place else 1]).reshape(x.shape)
    xf = to_f32(x).reshape(x.shape)
    for b in range(batches):
        expected = reference.rope(xf[b], positions[b // (batches // position_rows)], n_dims, c["mode"],
                                  freq_factors=factors, inverse=c.get("inverse", False), **params)
        assert_close(got[b], expected, TOL["rope"][dtype], f"rope {case} {dtype} batch {b}")


# ---------------------------------------------------------------------------------------------------
# quantized_matmul (the QuantizedMatmul primitive: forward decode, forward prefill, transposed)
# ---------------------------------------------------------------------------------------------------
# Byte offsets of the float16 scale fields per type (SPEC block table), set to sane values in random blocks
# so the products are finite; MXFP4's E8M0 exponent is byte 0.
SCALE_FIELDS = reference.SCALE_FIELDS  # float16 scale fields by byte offset (IQ1_M's d is split: set apart)
OUT_TYPES = {"f32": 0, "f16": 1, "bf16": 2}


def random_weight(rng, type_name, n, k):
    """(N, row_bytes) uint8 weight rows of `type_name` with finite values, and their float64 values (gguf)."""
    import gguf

    if type_name in FLOAT_TYPES:
        dtype = {"F32": "f32", "F16": "f16", "BF16": "bf16"}[type_name]
        stored = DTYPES[dtype][1](rng.standard_normal((n, k)))
        return stored.view(np.uint8).reshape(n, -1), DTYPES[dtype][2](stored).astype(np.float64)
    qtype = gguf.GGMLQuantizationType[type_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, k // block_size, type_size), dtype=np.uint8)
    if type_name == "MXFP4":
        blocks[:, :, 0] = rng.integers(120, 130, blocks.shape[:2])
    for offset in SCALE_FIELDS.get(type_name, []):
        scales = rng.uniform(0.002, 0.05, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if type_name == "IQ1_M":
        reference.set_iq1m_scales(blocks.reshape(-1, type_size), rng.uniform(0.002, 0.05, n * (k // block_size)))
    w = blocks.reshape(n, -1)
    return w, gguf.quants.dequantize(w, qtype).astype(np.float64).reshape(n, k)


def run_matmul(metal, kernel, type_name, x_dtype, out_dtype, M, N, K, B2=2, A2=1, transposed=False, seed=0,
               **alignments):
    """Dispatches csrc/backend/metal's plan for the product, checks that it picked `kernel`, and returns
    (got, expected) in float64."""
    rng = np.random.default_rng(seed)
    w, w64 = random_weight(rng, type_name, A2 * N, K)
    kx = N if transposed else K
    x = DTYPES[x_dtype][1](rng.standard_normal((B2, M, kx)))
    out_cols = K if transposed else N
    plan = metal.plan("matmul", type=type_name.lower(), x_dtype=x_dtype, transposed=int(transposed), batches=B2,
                      M=M, N=N, K=K, row_bytes=w.shape[1], B2=B2, A2=A2, r2=B2 // A2, r3=1,
                      out_type=OUT_TYPES[out_dtype], **alignments)
    assert plan["kernel"].startswith(kernel + "_"), plan["kernel"]
    out = metal.dispatch_plan(plan, {0: x, 1: w, 2: np.full((B2, M, out_cols), 0xFF, DTYPES[out_dtype][0])},
                              args_index=3, seed=seed)
    got = DTYPES[out_dtype][2](out[2]).reshape(B2, M, out_cols)
    x64 = DTYPES[x_dtype][2](x).astype(np.float64).reshape(B2, M, kx)
    w64 = w64.reshape(A2, N, K)
    expected = np.stack([x64[z] @ (w64[z // (B2 // A2)] if transposed else w64[z // (B2 // A2)].T)
                         for z in range(B2)])
    return got, expected


# Relative to the largest output: float32 sums over K <= 512 exact weights (a few 1e-7), then one rounding of
# the output (float16/bfloat16 as rms_norm's). Far inside ggml's own MUL_MAT bound (NMSE 5e-4).
MATMUL_TOL = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}


def matmul_k(type_name):
    import gguf

    if type_name in FLOAT_TYPES:
        return 40  # not a whole number of 16-element runs: the float decoders' tail
    return 2 * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]


# The decoded types (IQ grids, ternary) reach the kernels through the same decoder template as the others: float32
# x only (the tightest bound), to keep the suite's time.
MATMUL_CASES = [(t, d) for t in QUANT_TYPES + FLOAT_TYPES for d in DTYPES
                if d == "f32" or t not in reference.GGUF_DECODED]


@pytest.mark.parametrize("type_name, x_dtype", MATMUL_CASES)
def test_quantized_matmul_every_type(metal, type_name, x_dtype):
    """Decode (M=3), prefill (M=37: two row tiles, edge tiles) and the transposed product, weight batch
    broadcast over two x batches, output in x's dtype, against gguf's dequantization in float64."""
    K = matmul_k(type_name)
    for kernel, M, transposed in [("qmv", 3, False), ("qmm", 37, False), ("qmm_t", 5, True)]:
        got, expected = run_matmul(metal, kernel, type_name, x_dtype, x_dtype, M=M, N=9 if kernel == "qmv" else 40,
                                   K=K, transposed=transposed, seed=len(type_name) + M)
        assert_close(got, expected, MATMUL_TOL[x_dtype], f"{kernel} {type_name} {x_dtype} T={transposed}")


# Decode: the three x-row specializations (1, 2-4, 5-8), a full 512-element step plus a tail of whole
# blocks (float types: a tail that is not a whole run), and addresses aligned only to 2 or 4 bytes (the
# narrower-word staging paths; the emulator's buffers are 16-byte aligned, the plan says otherwise).
@pytest.mark.parametrize("type_name,K", [("Q4_0", 576), ("Q5_0", 544), ("Q8_0", 544), ("Q2_K", 768), ("Q3_K", 768),
                                         ("Q6_K", 768), ("IQ4_NL", 544), ("IQ4_XS", 768), ("MXFP4", 544),
                                         ("F32", 530), ("BF16", 521)])
@pytest.mark.parametrize("M,x_dtype", [(1, "f32"), (4, "f16"), (7, "bf16")])
def test_decode_rows_steps_and_tails(metal, type_name, K, M, x_dtype):
    alignments = {"w_line": 2, "x_line": 4} if M == 4 else {}  # address modulo 128: 2- and 4-byte aligned
    got, expected = run_matmul(metal, "qmv_x" + ("1" if M == 1 else "4" if M <= 4 else "8"), type_name, x_dtype,
                               "f32", M=M, N=21, K=K, B2=1, seed=K + M, **alignments)
    assert_close(got, expected, MATMUL_TOL["f32"], f"{type_name} M={M} {x_dtype}")


@pytest.mark.parametrize("kernel,transposed", [("qmv", False), ("qmm", False), ("qmm_t", True)])
def test_quantized_matmul_float32_output_and_grouped_batches(metal, kernel, transposed):
    """mul_mat's form: float16 x, float32 output, 4 x batches over 2 weight batches (GQA broadcasting)."""
    M = 11 if kernel == "qmm" else 6  # qmm: past the decode kernel's 8 rows
    got, expected = run_matmul(metal, kernel, "Q4_K", "f16", "f32", M=M, N=17, K=256, B2=4, A2=2,
                               transposed=transposed, seed=5)
    assert_close(got, expected, MATMUL_TOL["f32"], f"{kernel} T={transposed}")


# Prefill on 64 x 32 tiles (qmm, qmm_t): M not a multiple of 64 (9, 100), N not of 32 (40), K of one or
# two raw stages (Q4_K 512: two 256-element stages; 288: 9 blocks of 32, a partial stage), x rows of
# 4-element vectors in each dtype and, for the float type's K = 37, element by element; a second weight
# matrix that starts off a 16-byte boundary (MXFP4's 153-byte rows): its first row's first word is copied
# byte by byte.
PREFILL_CASES = [("Q4_0", 9, 32, 256, "f32"), ("Q4_0", 100, 40, 288, "bf16"), ("Q4_K", 64, 40, 512, "f16"),
                 ("Q4_K", 100, 32, 256, "f32"), ("Q8_0", 64, 32, 288, "f32"), ("Q8_0", 100, 40, 256, "f16"),
                 ("F16", 9, 40, 37, "f32"), ("F16", 100, 32, 288, "bf16")]


@pytest.mark.parametrize("type_name,M,N,K,x_dtype", PREFILL_CASES)
def test_prefill_tiles_edges(metal, type_name, M, N, K, x_dtype):
    for kernel, transposed in [("qmm", False), ("qmm_t", True)]:
        got, expected = run_matmul(metal, kernel, type_name, x_dtype, "f32", M=M, N=N, K=K, B2=1,
                                   transposed=transposed, seed=M + N + K)
        assert_close(got, expected, MATMUL_TOL["f32"], f"{kernel} {type_name} M={M} N={N} K={K} {x_dtype}")


def test_prefill_weight_matrix_off_16_byte_boundary(metal):
    got, expected = run_matmul(metal, "qmm", "MXFP4", "f32", "f32", M=9, N=9, K=544, B2=2, A2=2, seed=3)
    assert_close(got, expected, MATMUL_TOL["f32"], "qmm MXFP4, second matrix at byte 9 * 289")


# qmm_t stages from the start of a share's first 128-byte line: a second matrix that starts mid-line (and off a
# 16-byte boundary) has words before its first byte (skipped) and a first word copied byte by byte. K = 544:
# each row's shares under the tiles (3 tiles, the last of 32 columns); K = 256: whole rows, one range per step.
@pytest.mark.parametrize("K", [544, 256])
def test_transposed_weight_matrix_off_16_byte_boundary(metal, K):
    got, expected = run_matmul(metal, "qmm_t", "MXFP4", "f32", "f32", M=9, N=9, K=K, B2=2, A2=2, transposed=True,
                               seed=K)
    assert_close(got, expected, MATMUL_TOL["f32"], f"qmm_t MXFP4 K={K}, second matrix at byte 9 * {K // 32 * 17}")


# ---------------------------------------------------------------------------------------------------
# mul_mat_id (mul_mat_id.metal): each (token, slot) pair through the expert its id chooses
# ---------------------------------------------------------------------------------------------------
def mul_mat_id_ids(rng, E, T, used, bad):
    """ids (T, used) int32: distinct experts per token (a top-k router's), with E and -1 among them when `bad`."""
    ids = np.stack([rng.permutation(E)[:used] for _ in range(T)]).astype(np.int32)
    if bad:
        ids[T - 1, used - 1], ids[0, 1] = E, -1
    return ids


def dispatch_mul_mat_id(metal, plan, x, w, ids, out, seed, traffic=False):
    """The plan's dispatches as eval_gpu encodes them: the forward product's grouping into a scratch buffer
    (filled with garbage: the grouping writes what the product reads), then the product. Returns out's bytes
    and the scratch as the grouping left it (None without grouping); metal.traffic is the product's."""
    if plan["group"] is None:
        return metal.dispatch_plan(plan, {0: x, 1: w, 2: ids, 3: out}, args_index=4, seed=seed, traffic=traffic)[3], None
    scratch = np.full(plan["scratch_bytes"], 0xA5, np.uint8)
    scratch = metal.dispatch_plan(plan["group"], {2: ids, 5: scratch}, args_index=4, seed=seed)[5]
    out = metal.dispatch_plan(plan, {0: x, 1: w, 3: out, 5: scratch}, args_index=4, seed=seed, traffic=traffic)[3]
    return out, scratch.view(np.int32)


def run_mul_mat_id(metal, type_name, dtype, transposed, broadcast_x, seed, E=4, N=9, T=3, used=3, bad=True, K=None,
                   traffic=False, lines=None):
    """Dispatches csrc/backend/metal's plan for MulMatId on E random experts (ids with, when `bad`, E and -1
    among them) and returns (got, expected float64 with NaN rows for the bad ids, x, experts, ids, plan)."""
    rng = np.random.default_rng(seed)
    K = K or matmul_k(type_name)  # float types: 40, a last run of 8 elements
    w, w64 = random_weight(rng, type_name, E * N, K)
    w, w64 = w.reshape(E, N, -1), w64.reshape(E, N, K)
    ids = mul_mat_id_ids(rng, E, T, used, bad)
    slots = 1 if broadcast_x else used
    x = DTYPES[dtype][1](rng.standard_normal((T, slots, N if transposed else K)))
    out_cols = K if transposed else N
    plan = metal.plan("mul_mat_id", type=type_name.lower(), dtype=dtype, transposed=int(transposed), tokens=T,
                      n_used=used, x_slots=slots, experts=E, N=N, K=K, row_bytes=w.shape[-1], **(lines or {}))
    x_rows = 1 if T == 1 else 8  # chunks of an expert's pairs, by the token count
    kernel = f"mul_mat_id_t_{type_name.lower()}_{dtype}" if transposed else \
        f"mul_mat_id_x{x_rows}_{type_name.lower()}_{dtype}"
    assert plan["kernel"] == kernel, plan["kernel"]
    # Zeros, not NaN bytes, beforehand: a NaN row must be the kernel's own.
    out, _ = dispatch_mul_mat_id(metal, plan, x, w, ids, np.zeros((T, used, out_cols), DTYPES[dtype][0]), seed,
                                 traffic)
    got = DTYPES[dtype][2](out).reshape(T, used, out_cols)
    x64 = DTYPES[dtype][2](x).astype(np.float64).reshape(x.shape)
    expected = np.full(got.shape, np.nan)
    for t in range(T):
        for s in range(used):
            if 0 <= ids[t, s] < E:
                xv = x64[t, 0 if broadcast_x else s]
                expected[t, s] = xv @ w64[ids[t, s]] if transposed else w64[ids[t, s]] @ xv
    return got, expected, x, w, ids, plan


def check_mul_mat_id(metal, type_name, dtype, transposed, broadcast_x, seed, **shape):
    got, expected, *_ = run_mul_mat_id(metal, type_name, dtype, transposed, broadcast_x, seed, **shape)
    bad = np.isnan(expected[:, :, 0])
    assert bad.sum() == 2 and np.isnan(got[bad]).all(), f"{type_name}: the bad ids' rows are not NaN"
    assert not np.isnan(got[~bad]).any(), f"{type_name}: NaN outside the bad ids' rows"
    assert_close(got[~bad], expected[~bad], MATMUL_TOL[dtype],
                 f"mul_mat_id {type_name} {dtype} T={transposed} broadcast={broadcast_x}")


@pytest.mark.parametrize("type_name", QUANT_TYPES + FLOAT_TYPES)
def test_mul_mat_id_every_type(metal, type_name):
    """4 experts, 3 tokens of 3 slots (ids E and -1 among them: NaN rows, and the emulator's bounds checks
    show that nothing outside the experts is read), float32 x: the forward product and the transposed one
    (x's gradient), against gguf's dequantization in float64."""
    for transposed in (False, True):
        check_mul_mat_id(metal, type_name, "f32", transposed, False, seed=len(type_name) + transposed)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "F16"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mul_mat_id_half_x_and_broadcast_x(metal, type_name, dtype):
    """x of one row per token that every slot reads (ggml's broadcast, x_slots = 1), and the transposed
    product, in float16 / bfloat16 (output in x's dtype)."""
    check_mul_mat_id(metal, type_name, dtype, False, True, seed=7)
    check_mul_mat_id(metal, type_name, dtype, True, False, seed=8)


def test_mul_mat_id_matches_the_cpu_op(metal):
    """A second reference: the package's CPU kernel (ops.mul_mat_id) on the same blocks and ids, Q4_K, 5
    experts chosen 2 per token over 4 tokens, x per slot and broadcast. The CPU meets the blocks with x
    quantized to int8 (ggml's scheme), so the bound is test_mul_mat_id.py's NMSE, not the float one."""
    from harness import nmse
    from mlx_ggml_ext import GGMLTensor, GGMLType, ops

    for broadcast_x in (False, True):
        got, _, x, w, ids, _ = run_mul_mat_id(metal, "Q4_K", "f32", False, broadcast_x, seed=11, E=5, N=7, T=4,
                                              used=2, bad=False)
        tensor = GGMLTensor(mx.array(w.reshape(-1)), GGMLType.Q4_K, (5, 7, 512))
        cpu = ops.mul_mat_id(tensor, mx.array(x), mx.array(ids), stream=mx.cpu)
        assert nmse(got, np.array(cpu)) <= 2e-4, f"broadcast={broadcast_x}"


def test_mul_mat_id_chunks_of_eight_pairs(metal):
    """T = 20 tokens over 3 experts: each expert's pairs go through the product in chunks of 8 (x8), the last
    partial; a weight and x said to be 2- and 4-byte aligned (the emulator's buffers are 128-byte aligned, the
    plan's w_line / x_line say otherwise): the staging's narrower words."""
    check_mul_mat_id(metal, "Q4_0", "f32", False, False, seed=20, E=3, N=5, T=20, used=2,
                     lines={"w_line": 2, "x_line": 4})


def test_mul_mat_id_grouping_is_a_stable_sort_by_expert(metal):
    """The grouping dispatch alone, against numpy: 300 pairs (two chunks of 256) mostly on one expert, bad
    ids (E and -1) in the last bucket, experts nobody chose (empty buckets), 601 buckets (3 per thread in the
    scan of the offsets)."""
    rng = np.random.default_rng(3)
    T, used, E = 100, 3, 600
    ids = np.where(rng.random((T, used)) < 0.7, 7, rng.integers(0, E, (T, used))).astype(np.int32)
    ids[0, 0], ids[5, 2], ids[99, 1] = -1, E, E + 7
    plan = metal.plan("mul_mat_id", type="q4_0", dtype="f32", transposed=0, tokens=T, n_used=used, x_slots=1,
                      experts=E, N=4, K=32, row_bytes=18)
    scratch = np.full(plan["scratch_bytes"], 0xA5, np.uint8)
    got = metal.dispatch_plan(plan["group"], {2: ids, 5: scratch}, args_index=4, seed=3)[5].view(np.int32)
    buckets = np.where((ids >= 0) & (ids < E), ids, E).reshape(-1)
    round4 = lambda n: (n + 3) // 4 * 4  # noqa: E731
    offsets = np.concatenate([[0], np.cumsum(np.bincount(buckets, minlength=E + 1))])
    sorted_part = round4(E + 2) + round4(E + 1)
    assert offsets[E + 1] - offsets[E] == 3 and (got[:E + 2] == offsets).all(), got[:E + 2]
    assert (got[sorted_part:sorted_part + T * used] == np.argsort(buckets, kind="stable")).all()


# ---------------------------------------------------------------------------------------------------
# Memory-traffic figures (tests/metal_emu/traffic.h): one JSON line per kernel and case (pytest -s).
# Proxies of what an Apple GPU's memory system would see (bytes requested per weight byte in 128-byte
# lines, share of coalesced simdgroup loads), not speeds: nothing here ran on a GPU.
# ---------------------------------------------------------------------------------------------------
def test_traffic_model_tells_adjacent_from_scattered(selftest):
    x = np.arange(128, dtype=np.float32)
    shares = {}
    for scattered in (0, 1):
        selftest.dispatch("loads_adjacent_or_scattered", (1,), (32,), traffic=True,
                          buffers={0: x, 1: np.zeros(32, np.float32), 2: np.uint32(scattered)})
        shares[scattered] = emu.traffic_figures("loads_adjacent_or_scattered", f"scattered={scattered}",
                                                selftest.traffic, 0, x.nbytes, ignore=(1, 2))
    assert shares[0]["coalesced_share"] == 1.0 and shares[0]["bytes_per_weight_byte"] == 1.0  # 4 lines, once
    assert shares[1]["coalesced_share"] == 0.0 and shares[1]["bytes_per_weight_byte"] == 1.0  # 32 of 128 floats


def test_bounds_are_checked_to_the_byte(selftest):
    """A buffer of 250 bytes: a 4-byte read at offset 248 reaches 2 bytes past its end (inside the page)."""
    message = selftest.dispatch("copy_with_overrun", (1,), (1,), expect_failure=True,
                                buffers={0: np.zeros(250, np.uint8), 1: np.zeros(4, np.float32), 2: np.uint32(62)})
    assert "out-of-bounds access to buffer(0) (size 250) at byte offset 248 (a 4-byte read)" in message


def matmul_traffic(metal, kernel, type_name, M, N, K, transposed=False):
    rng = np.random.default_rng(M)
    w, _ = random_weight(rng, type_name, N, K)
    x = rng.standard_normal((1, M, N if transposed else K)).astype(np.float32)
    plan = metal.plan("matmul", type=type_name.lower(), x_dtype="f32", transposed=int(transposed), batches=1, M=M,
                      N=N, K=K, row_bytes=w.shape[1], B2=1, A2=1, r2=1, r3=1, out_type=0)
    assert plan["kernel"].startswith(kernel + "_"), plan["kernel"]
    metal.dispatch_plan(plan, {0: x, 1: w, 2: np.zeros((M, K if transposed else N), np.float32)}, args_index=3,
                        traffic=True)
    return emu.traffic_figures(plan["kernel"], f"M={M} N={N} K={K}", metal.traffic, 1, w.nbytes, ignore=(3,),
                               threadgroup_bytes=plan["threadgroup_bytes"])


# One type per family: 32-element legacy, 256-element K-quants, lookup (IQ4/MXFP4).
TRAFFIC_TYPES = ["Q4_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]


@pytest.mark.parametrize("type_name", TRAFFIC_TYPES)
@pytest.mark.parametrize("M", [1, 3, 8])
def test_decode_traffic(metal, type_name, M):
    """Each weight byte requested about once (128-byte lines; rows share lines at their ends), and every
    device load a coalesced one (K = 4096, a row of a 4096-wide model: 8 full steps, no tail)."""
    f = matmul_traffic(metal, "qmv", type_name, M, N=32, K=4096)
    # A row that is not a whole number of lines (Q2_K, Q3_K, Q6_K here) shares its first and last line
    # with its neighbours, each requesting it: Q3_K's 1760-byte rows (13.75 lines) reach 1.11.
    assert f["bytes_per_weight_byte"] <= (1.12 if type_name == "Q3_K" else 1.1), f
    assert f["coalesced_share"] >= 0.95, f
    assert f["misaligned_loads"] == 0, f


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K", "Q6_K"])
def test_prefill_traffic(metal, type_name):
    """The prefill stages weight rows as aligned 16-byte words (one row tile of x: each row requested once,
    in whole lines: 144-byte rows touch 2 lines, 1.78); x by 4-element vectors."""
    f = matmul_traffic(metal, "qmm", type_name, 64, N=64, K=256)
    assert f["misaligned_loads"] == 0 and f["narrow_loads"] == 0, f
    assert f["bytes_per_weight_byte"] <= 1.8 and f["coalesced_share"] >= 0.88, f


def lines_once_figure(ranges, total):
    """Bytes per weight byte if each byte range (offset, length) is requested once, in whole 128-byte lines."""
    lines = sum((b + n + 127) // 128 - b // 128 for b, n in ranges)
    return lines * 128 / total


# x's gradient (qmm_t): 256 output columns per threadgroup, so each weight byte is staged once per row tile
# of x (a 32-column tile staged a 256-element block 8 times: Q4_0 8.0, Q8_0 4.7, Q4_K 14.2, Q6_K 12.8,
# F16 2.0 bytes per weight byte). K = 256: the tile covers whole rows and a step's rows are one range of
# lines (1.0; Q2_K 1.048 and Q6_K 1.029: steps of 16 rows that end mid-line). K = 1024: each row's share
# under a tile is staged on its own, requested once in whole lines: a share and its neighbour in the next
# tile both request the line they share (no cache in the model): Q4_0's 144-byte shares 1.78, Q2_K's 84 2.48.
TRANSPOSED_TRAFFIC_CASES = (
    [(t, 64, 256) for t in ["Q4_0", "Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ4_XS", "MXFP4", "F16", "F32"]]
    + [(t, 256, 1024) for t in ["Q4_0", "Q8_0", "Q2_K", "Q6_K", "F16"]])


@pytest.mark.parametrize("type_name,N,K", TRANSPOSED_TRAFFIC_CASES)
def test_prefill_traffic_transposed(metal, type_name, N, K):
    f = matmul_traffic(metal, "qmm_t", type_name, 64, N=N, K=K, transposed=True)
    assert f["misaligned_loads"] == 0 and f["narrow_loads"] == 0, f
    assert f["coalesced_share"] == 1.0 and f["threadgroup_bytes"] <= 32 * 1024, f
    if K == 256:
        assert f["bytes_per_weight_byte"] <= 1.05, f
    else:
        w, _ = random_weight(np.random.default_rng(0), type_name, 1, K)
        row_bytes, share = w.shape[1], w.shape[1] * 256 // K
        shares = [(n * row_bytes + t * share, share) for n in range(N) for t in range(K // 256)]
        assert f["bytes_per_weight_byte"] <= lines_once_figure(shares, N * row_bytes) + 1e-3, f


def test_prefill_traffic_long_rows(metal):
    """K = 4096: a stage stages up to its row's next line boundary and carries the rest over, so every
    line of a 2304-byte Q4_K row is requested once."""
    f = matmul_traffic(metal, "qmm", "Q4_K", 64, N=32, K=4096)
    assert f["bytes_per_weight_byte"] == 1.0 and f["coalesced_share"] == 1.0, f


# mul_mat_id grouped by expert (issue 34): each chosen expert's rows read once per call for T <= 8, whatever
# the number of pairs that chose it, by the decode product's coalesced whole-line loads. The denominator is the
# chosen experts' bytes only (the others are never read). K = 4096 as for decode: rows of whole lines but
# Q6_K's 3360 bytes (26.25 lines: its neighbours request its first and last line again, 1.05).
@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "MXFP4"])
@pytest.mark.parametrize("T,used", [(1, 4), (8, 2)])
def test_mul_mat_id_traffic(metal, type_name, T, used):
    E, N, K = 6, 16, 4096
    got, expected, x, w, ids, plan = run_mul_mat_id(metal, type_name, "f32", False, True, seed=T, E=E, N=N, T=T,
                                                    used=used, bad=False, K=K, traffic=True)
    chosen = len(np.unique(ids))
    assert chosen >= 3, ids
    f = emu.traffic_figures(plan["kernel"], f"T={T} used={used} E={E} chosen={chosen} N={N} K={K}", metal.traffic, 1,
                            chosen * w[0].nbytes, ignore=(4,), threadgroup_bytes=plan["threadgroup_bytes"])
    assert_close(got, expected, MATMUL_TOL["f32"], f"mul_mat_id {type_name} T={T}")
    assert f["bytes_per_weight_byte"] <= 1.1 and f["coalesced_share"] >= 0.95, f
    assert f["misaligned_loads"] == 0, f


def test_rms_norm_traffic(metal):
    x = np.random.default_rng(0).standard_normal((4, 1024)).astype(np.float32)
    plan = metal.plan("rms_norm", dtype="f32", rows=4, dim=1024, rows_per_weight=4, weighted=1, eps=1e-5)
    metal.dispatch_plan(plan, {0: x, 1: x[0], 2: np.zeros_like(x), 4: x, 5: x}, args_index=3, traffic=True)
    emu.traffic_figures(plan["kernel"], "rows=4 dim=1024", metal.traffic, None, x.nbytes, ignore=(3,),
                        threadgroup_bytes=plan["threadgroup_bytes"])


@pytest.mark.parametrize("neox", [1, 0])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_rope_traffic(metal, neox, dtype):
    """4-element vectors: each line of x requested once, by adjacent aligned words (NORMAL's element-wise
    loads of 2i and 2i+1 each spanned twice the lines their bytes need)."""
    storage, to_storage, _ = DTYPES[dtype]
    x = to_storage(np.random.default_rng(1).standard_normal((1, 4, 8, 128)))
    plan = metal.plan("rope", dtype=dtype, batches=1, tokens=4, heads=8, dim=128, n_dims=128,
                      batches_per_positions_row=1, batches_per_factors_row=1, neox=neox, has_factors=0, has_ramp=0,
                      theta_scale=0.9, freq_scale=1.0, mscale=1.0, sin_sign=1.0)
    metal.dispatch_plan(plan, {0: x, 1: np.zeros_like(x), 2: np.arange(4, dtype=np.int32), 3: x, 4: x, 6: x, 7: x},
                        args_index=5, traffic=True)
    f = emu.traffic_figures(plan["kernel"], f"tokens=4 heads=8 dim=128 {'neox' if neox else 'normal'}",
                            metal.traffic, None, x.nbytes, ignore=(5,), threadgroup_bytes=plan["threadgroup_bytes"])
    assert f["bytes_per_weight_byte"] == 1.0 and f["coalesced_share"] == 1.0, f

