"""dequantize / quantize against the gguf package (bit- and byte-exact), the SPEC's float64 reference and a
simple SPEC-layout K-quantizer, on every CPU kernel variant."""

import platform
import warnings

import mlx.core as mx
import numpy as np
import pytest

import mlx_ggml_ext
from mlx_ggml_ext import GGMLTensor, GGMLType, ops, reference

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

ALL_TYPES = list(GGMLType)
QUANT_TYPES = [t for t in GGMLType if not t.is_float]
# gguf.quants.quantize is byte-exact with ggml for these; so must ours be.
EXACT_QUANTIZE = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                  GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.MXFP4]
K_QUANTIZE = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
# Scale searches of this package (more tests in test_quantizers_k.py).
SEARCHED = K_QUANTIZE + [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS]
# The rest, the grid and ternary types among them (ggml quantizes the grid ones with an importance matrix and
# long searches).
NOT_QUANTIZABLE = [t for t in QUANT_TYPES if t not in EXACT_QUANTIZE + SEARCHED]
# Byte offsets of each block's float16 scale fields (from the SPEC's field order); IQ1_M's d is split into the
# top nibbles of four words (with_scales writes it there).
HALF_FIELDS = {GGMLType[name]: offsets for name, offsets in reference.SCALE_FIELDS.items()}
HALF_FIELDS[GGMLType.IQ1_M] = [reference.IQ1M_SCALE_OFFSET]
# NaN payloads follow x86's (first operand) propagation in numpy and in the CPU kernels; elsewhere numpy may
# differ, and a GPU's arithmetic returns its one canonical NaN (NaN positions are compared everywhere).
X86 = platform.machine().lower() in ("x86_64", "amd64")
NAN_PAYLOADS_MATCH = X86 and mx.default_device() == mx.cpu


@pytest.fixture(autouse=True)
def _quiet_numpy():
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # gguf's numpy math on NaN/inf scales
        yield


def gtype(t: GGMLType):
    return gguf.GGMLQuantizationType(int(t))


def row_elements(t: GGMLType, blocks: int = 3) -> int:
    return max(t.block_size, 16) * blocks


def random_bytes(rng, t: GGMLType, rows: int, k: int) -> np.ndarray:
    return rng.integers(0, 256, (rows, t.row_bytes(k)), dtype=np.uint8)


def with_scales(blocks: np.ndarray, t: GGMLType, halves) -> np.ndarray:
    """Rows of blocks with every float16 scale field set from `halves` (cycled)."""
    out = blocks.copy().reshape(-1, t.type_size)
    bits = np.asarray(halves, np.float16).view(np.uint16)
    if t == GGMLType.IQ1_M:
        reference.set_iq1m_scales(out, bits[np.arange(out.shape[0]) % bits.size].view(np.float16))
        return out.reshape(blocks.shape)
    for i in range(out.shape[0]):
        for j, off in enumerate(HALF_FIELDS[t]):
            out[i, off:off + 2] = np.array([bits[(i + j) % bits.size]], np.uint16).view(np.uint8)
    return out.reshape(blocks.shape)


def assert_bits_equal(got: np.ndarray, expected: np.ndarray):
    got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    assert got.shape == expected.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    mismatch = got.view(np.uint32)[~nan] != expected.view(np.uint32)[~nan]
    assert not mismatch.any(), f"{mismatch.sum()} values differ, e.g. {got[~nan][mismatch][:4]} vs " \
                               f"{expected[~nan][mismatch][:4]}"
    if NAN_PAYLOADS_MATCH:
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def deq(data: np.ndarray, t: GGMLType, shape, dtype=mx.float32) -> mx.array:
    return ops.dequantize(mx.array(data), t, shape, dtype)


def quantize(w: mx.array, t) -> mx.array:
    """ggml's quantizers run on the CPU only: weights are quantized once, offline (on a GPU device the op
    raises, see test_quantize_on_the_default_device)."""
    return ops.quantize(w, t, stream=mx.cpu)


# ----------------------------------------------------------------------------- dequantize

@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_bit_exact_on_random_bytes(cpu_isa, t):
    """Every byte pattern, NaN/inf/subnormal scales included, decodes exactly as gguf does."""
    rng = np.random.default_rng(int(t))
    k = row_elements(t)
    data = random_bytes(rng, t, 5, k)
    out = deq(data, t, (5, k))
    assert out.shape == (5, k) and out.dtype == mx.float32
    assert_bits_equal(np.array(out), quants.dequantize(data, gtype(t)))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_spec_reference(t):
    """The SPEC's float64 decoder (reference.py) agrees within float32 rounding: the layouts are the SPEC's."""
    rng = np.random.default_rng(100 + int(t))
    k = row_elements(t)
    data = random_bytes(rng, t, 4, k)
    if t == GGMLType.MXFP4:
        data.reshape(-1, t.type_size)[:, 0] = rng.integers(100, 150, data.size // t.type_size)
    elif not t.is_float:
        data = with_scales(data, t, rng.uniform(-2, 2, 64).astype(np.float16))
    else:  # finite floats
        data = np.asarray(quants.quantize(rng.standard_normal((4, k)).astype(np.float32), gtype(t)))
        data = data.view(np.uint8).reshape(4, -1)
    got = np.array(deq(data, t, (4, k))).astype(np.float64)
    expected = reference.dequantize(data, t.name, (4, k))
    scale = np.max(np.abs(expected.reshape(-1, t.block_size)), axis=1, keepdims=True)
    err = np.abs(got - expected).reshape(-1, t.block_size)
    assert np.all(err <= 4e-7 * scale + 1e-30), np.max(err / np.maximum(scale, 1e-30))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_half_outputs_are_float32_rounded_once(cpu_isa, t, dtype):
    rng = np.random.default_rng(200 + int(t))
    k = row_elements(t)
    data = random_bytes(rng, t, 3, k)
    f32 = deq(data, t, (3, k))
    got = np.array(deq(data, t, (3, k), dtype).view(mx.uint16))
    expected = f32.astype(dtype)
    nan = np.isnan(np.array(expected.astype(mx.float32)))
    np.testing.assert_array_equal(np.isnan(np.array(deq(data, t, (3, k), dtype).astype(mx.float32))), nan)
    np.testing.assert_array_equal(got[~nan], np.array(expected.view(mx.uint16))[~nan])


SCALE_CASES = {
    "normal": [1.0, -0.5, 0.125, 3.0],
    "zeros": [0.0, -0.0],
    "huge": [65504.0, -60000.0, 30000.0],
    "tiny": [6.1035e-05, -1e-4, 2e-3],           # smallest normal float16 and neighbours
    "subnormal": [6e-8, -5.96e-08, 3e-6, 1e-5],  # float16 subnormals
    "inf_nan": [np.inf, -np.inf, np.nan, 1.0],
}


@pytest.mark.parametrize("case", sorted(SCALE_CASES))
@pytest.mark.parametrize("t", sorted(HALF_FIELDS), ids=lambda t: t.name)
def test_dequantize_round_trip_scale_ranges(case, t):
    """Blocks with chosen float16 scale fields (zeros, huge, tiny, subnormal, inf/NaN) against gguf
    (MXFP4's E8M0 scale: test_mxfp4_every_exponent)."""
    rng = np.random.default_rng(300 + int(t))
    k = row_elements(t, 4)
    data = with_scales(random_bytes(rng, t, 3, k), t, SCALE_CASES[case])
    assert_bits_equal(np.array(deq(data, t, (3, k))), quants.dequantize(data, gtype(t)))


def test_mxfp4_every_exponent(cpu_isa):
    e = np.arange(256, dtype=np.uint8)
    rng = np.random.default_rng(4)
    data = np.concatenate([e[:, None], rng.integers(0, 256, (256, 16), dtype=np.uint8)], axis=1).reshape(8, -1)
    assert_bits_equal(np.array(deq(data, GGMLType.MXFP4, (8, 32 * 32))),
                      quants.dequantize(data, gtype(GGMLType.MXFP4)))


def test_float16_every_bit_pattern(cpu_isa):
    data = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(4, -1)
    assert_bits_equal(np.array(deq(data, GGMLType.F16, (4, 16384))), quants.dequantize(data, gtype(GGMLType.F16)))


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q6_K, GGMLType.IQ4_XS], ids=lambda t: t.name)
def test_large_multithreaded_input(t):
    rng = np.random.default_rng(5)
    k = 4096
    data = with_scales(random_bytes(rng, t, 96, k), t, rng.standard_normal(256).astype(np.float16))
    assert_bits_equal(np.array(deq(data, t, (96, k))), quants.dequantize(data, gtype(t)))


def test_logical_shapes_flat_data_and_ggml_tensor():
    rng = np.random.default_rng(6)
    t = GGMLType.Q4_K
    data = random_bytes(rng, t, 6, 512)
    expected = quants.dequantize(data, gtype(t)).reshape(2, 3, 512)
    assert_bits_equal(np.array(deq(data, t, (2, 3, 512))), expected)
    assert_bits_equal(np.array(deq(data.reshape(-1), t, (2, 3, 512))), expected)           # flat bytes
    assert_bits_equal(np.array(deq(data.reshape(2, 3, -1), t, (2, 3, 512))), expected)     # leading axes
    assert_bits_equal(np.array(GGMLTensor(mx.array(data), "q4_k", (2, 3, 512)).dequantize()), expected)
    assert_bits_equal(np.array(deq(data.reshape(-1), t, (6 * 512,))), expected.reshape(-1))  # a vector
    bf = GGMLTensor(mx.array(data), t, (6, 512)).dequantize(mx.bfloat16)
    assert bf.dtype == mx.bfloat16 and bf.shape == (6, 512)


def test_non_contiguous_data():
    rng = np.random.default_rng(7)
    t = GGMLType.Q8_0
    data = random_bytes(rng, t, 8, 64)
    big = mx.array(np.ascontiguousarray(np.concatenate([data, data], axis=1)))
    sliced = big[::2, : t.row_bytes(64)]  # strided rows
    out = ops.dequantize(sliced, t, (4, 64))
    assert_bits_equal(np.array(out), quants.dequantize(data[::2], gtype(t)))


def test_empty_tensors():
    assert ops.dequantize(mx.zeros((0, 18), dtype=mx.uint8), "q4_0", (0, 32)).shape == (0, 32)
    assert ops.dequantize(mx.zeros((3, 0), dtype=mx.uint8), "q4_k", (3, 0)).shape == (3, 0)
    assert quantize(mx.zeros((0, 64)), "q8_0").shape == (0, 68)


def test_dequantize_vmap_over_a_batch_of_tensors():
    rng = np.random.default_rng(8)
    t = GGMLType.Q5_K
    batch = random_bytes(rng, t, 4 * 3, 512).reshape(4, 3, -1)
    expected = np.stack([quants.dequantize(b, gtype(t)) for b in batch])
    f = lambda d: ops.dequantize(d, t, (3, 512))
    assert_bits_equal(np.array(mx.vmap(f)(mx.array(batch))), expected)
    # the batch along the rows axis and along the bytes axis
    assert_bits_equal(np.array(mx.vmap(f, in_axes=1)(mx.array(np.ascontiguousarray(batch.transpose(1, 0, 2))))),
                      expected)
    assert_bits_equal(np.array(mx.vmap(f, in_axes=2)(mx.array(np.ascontiguousarray(batch.transpose(1, 2, 0))))),
                      expected)
    # nested vmap and the float16 output
    nested = mx.vmap(mx.vmap(lambda d: ops.dequantize(d, t, (512,), mx.float16)))(mx.array(batch))
    np.testing.assert_array_equal(np.array(nested.astype(mx.float32)),
                                  np.array(mx.array(expected).astype(mx.float16).astype(mx.float32)))


def test_compile():
    rng = np.random.default_rng(9)
    data = random_bytes(rng, GGMLType.Q4_0, 4, 64)
    f = mx.compile(lambda d: ops.dequantize(d, "q4_0", (4, 64)) * 2.0)
    np.testing.assert_array_equal(np.array(f(mx.array(data))), quants.dequantize(data, gtype(GGMLType.Q4_0)) * 2)


def test_raw_bytes_have_no_gradient():
    data = mx.array(np.zeros((1, 18), np.uint8))
    with pytest.raises(ValueError, match=r"\[dequantize\].*no gradient"):
        mx.vjp(lambda d: ops.dequantize(d, "q4_0", (1, 32)), [data], [mx.ones((1, 32))])
    with pytest.raises(ValueError, match=r"\[dequantize\].*no tangent"):
        mx.jvp(lambda d: ops.dequantize(d, "q4_0", (1, 32)), [data], [mx.zeros((1, 18), dtype=mx.uint8)])
    with pytest.raises(ValueError, match=r"\[quantize\].*no gradient"):
        mx.grad(lambda w: quantize(w, "q8_0").astype(mx.float32).sum())(mx.ones((1, 32)))
    with pytest.raises(ValueError, match=r"\[quantize\].*no tangent"):
        mx.jvp(lambda w: quantize(w, "q8_0"), [mx.ones((1, 32))], [mx.ones((1, 32))])


# ----------------------------------------------------------------------------- quantize, byte-exact

def data_cases(rng, k):
    """Rows of several blocks: normal data at several magnitudes, zeros, ties, constants, tiny and huge."""
    base = rng.standard_normal((6, k)).astype(np.float32)
    ties = (rng.integers(-254, 255, (2, k)) / 2).astype(np.float32)  # halves: rounding ties in Q8_0/Q4_x
    ties[:, ::32] = 127.0  # Q8_0: d = 1 exactly
    const = np.full((2, k), 0.75, np.float32)
    const[1] = -3.0
    cases = {
        "normal": base,
        "zeros": np.zeros((2, k), np.float32),
        "ties": ties,
        "constant": const,
        "small": base * np.float32(1e-6),
        "subnormal_f16_scale": base * np.float32(3e-7),
        "tiny": base * np.float32(1e-30),
        "large": base * np.float32(1e4),
        "huge": base * np.float32(1e30),
        "mixed_rows": base * np.logspace(-8, 8, 6, dtype=np.float32)[:, None],
    }
    return cases


def test_quantize_on_the_default_device():
    """On the CPU the default stream quantizes; a GPU device has no quantizer and says so when evaluated."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    q = ops.quantize(mx.array(x), "q8_0")
    if mx.default_device() == mx.cpu:
        np.testing.assert_array_equal(np.array(q), quants.quantize(x, gtype(GGMLType.Q8_0)))
    else:
        with pytest.raises(RuntimeError, match=r"Quantize has no GPU kernel in this build.*stream=mx.cpu"):
            mx.eval(q)


@pytest.mark.parametrize("t", EXACT_QUANTIZE, ids=lambda t: t.name)
def test_quantize_byte_exact(cpu_isa, t):
    rng = np.random.default_rng(400 + int(t))
    k = row_elements(t, 4)
    for name, x in data_cases(rng, k).items():
        got = np.array(quantize(mx.array(x), t))
        expected = np.asarray(quants.quantize(x, gtype(t))).view(np.uint8).reshape(x.shape[0], -1)
        assert got.dtype == np.uint8 and got.shape == expected.shape, (name, got.shape)
        np.testing.assert_array_equal(got, expected, err_msg=f"{t.name} {name}")
        # and the round trip decodes as gguf decodes gguf's own bytes
        assert_bits_equal(np.array(deq(got, t, x.shape)), quants.dequantize(expected, gtype(t)))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_quantize_half_inputs(cpu_isa, t, dtype):
    rng = np.random.default_rng(5)
    w = mx.array(rng.standard_normal((3, 96)).astype(np.float32)).astype(dtype)
    x = np.array(w.astype(mx.float32))
    np.testing.assert_array_equal(np.array(quantize(w, t)),
                                  np.asarray(quants.quantize(x, gtype(t))).view(np.uint8).reshape(3, -1))


def test_mxfp4_exponent_at_powers_of_two():
    """e = floor(log2(max|x|)) - 2 + 127 with float32's log2: the floats just below each power of two round
    up to it in float32, and gguf's bytes say so."""
    rng = np.random.default_rng(10)
    amax = []
    for k in range(-124, 127, 3):
        p = np.float32(2.0) ** k
        below = p
        for _ in range(48):
            below = np.nextafter(below, np.float32(0))
            amax.append(below)
        amax.append(p)
    amax = np.array(amax, np.float32)
    x = (rng.uniform(-1, 1, (amax.size, 32)) * amax[:, None]).astype(np.float32)
    x[:, 7] = amax
    got = np.array(quantize(mx.array(x.reshape(1, -1)), "mxfp4"))
    np.testing.assert_array_equal(got, quants.quantize(x.reshape(1, -1), gtype(GGMLType.MXFP4)))


def test_blocks_below_2_pow_minus_125_follow_the_documented_rule():
    """Where 1/d overflows, gguf casts inf/NaN to uint8 (undefined: x86 wraps, ARM saturates). Ours: the
    scale bytes as gguf (float16 zero), quants at the zero point, MXFP4's exponent clamped at 0."""
    x = np.zeros((1, 32), np.float32)
    x[0, :8] = np.float32(2.0 ** -130) * np.arange(1, 9, dtype=np.float32)
    x[0, 9] = -np.float32(2.0 ** -127)
    w = mx.array(x)
    q40 = np.array(quantize(w, "q4_0"))[0]
    assert q40[:2].tolist() == [0, 0x80] and (q40[2:] == 0x88).all()  # d = -0.0, q = 8 (zero)
    q41 = np.array(quantize(w, "q4_1"))[0]
    assert q41[:4].tolist() == [0, 0, 0, 0x80] and (q41[4:] == 0).all()  # d = 0, m = -0.0 (min), q = 0
    q80 = np.array(quantize(w, "q8_0"))[0]
    assert q80[:2].tolist() == [0, 0] and (q80[2:] == 0).all()
    mx4 = np.array(quantize(w, "mxfp4"))[0]
    assert mx4[0] == 0  # 2^-128 scale: the closest the format gets
    d = np.float32(2.0 ** -128)
    codes = np.argmin(np.abs(d * reference.KVALUES_MXFP4.astype(np.float32)[None, :] - x[0][:, None]), axis=1)
    np.testing.assert_array_equal(mx4[1:], (codes[:16] | (codes[16:] << 4)).astype(np.uint8))
    for t in ("q4_0", "q4_1", "q8_0", "mxfp4"):
        assert np.isfinite(np.array(ops.dequantize(quantize(w, t), t, (1, 32)))).all()


@pytest.mark.parametrize("t", EXACT_QUANTIZE + SEARCHED, ids=lambda t: t.name)
def test_non_finite_blocks(t):
    """A block with NaN or +-inf decodes to NaN in every element (MXFP4: +inf); other blocks are unaffected.
    F32/F16/BF16 keep the values (float16 overflows to inf; gguf's BF16 bytes exactly)."""
    rng = np.random.default_rng(11)
    k = max(t.block_size, 32)
    x = rng.standard_normal((3, 2 * k)).astype(np.float32)
    x[0, 3], x[1, k + 1], x[2, 5] = np.nan, np.inf, -np.inf
    got = np.array(ops.dequantize(quantize(mx.array(x), t), t, x.shape))
    if t.is_float:
        expected = quants.dequantize(np.asarray(quants.quantize(x, gtype(t))).view(np.uint8).reshape(3, -1), gtype(t))
        np.testing.assert_array_equal(got, expected)  # NaN == NaN positions, infinities kept
        assert np.isnan(got[0, 3]) and got[1, k + 1] == np.inf and got[2, 5] == -np.inf
        return
    bad = np.zeros_like(x, bool)
    bad[0, :k] = bad[1, k:] = bad[2, :k] = True
    if t == GGMLType.MXFP4:
        assert (got[bad] == np.inf).all()
    else:
        assert np.isnan(got[bad]).all()
    clean = ops.dequantize(quantize(mx.array(np.where(bad, 0, x)), t), t, x.shape)
    np.testing.assert_array_equal(got[~bad], np.array(clean)[~bad])


# ----------------------------------------------------------------------------- K-quants

def rmse(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)))


K_DATA = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "student_t3": lambda rng, n: rng.standard_t(3, n),
    "positive": lambda rng, n: rng.uniform(0, 1, n),
    "block_scales": lambda rng, n: rng.standard_normal(n) * np.repeat(np.exp(2 * rng.standard_normal(n // 32)), 32),
}


@pytest.mark.parametrize("data", sorted(K_DATA))
@pytest.mark.parametrize("t", K_QUANTIZE, ids=lambda t: t.name)
def test_k_quantize_beats_the_simple_spec_quantizer(cpu_isa, t, data):
    rng = np.random.default_rng(500 + int(t))
    x = K_DATA[data](rng, 16 * 1024).astype(np.float32).reshape(16, 1024)
    blocks = np.array(quantize(mx.array(x), t))
    assert blocks.shape == (16, t.row_bytes(1024)) and blocks.dtype == np.uint8
    y = quants.dequantize(blocks, gtype(t))  # gguf decodes our bytes, so the layout is ggml's
    assert_bits_equal(np.array(deq(blocks, t, x.shape)), y)
    simple = quants.dequantize(reference.quantize_k_minmax(x, t.name), gtype(t))
    ours, base = rmse(y, x), rmse(simple, x)
    assert ours <= base, (ours, base)
    assert ours < 0.12 * np.std(x) * (2 if t == GGMLType.Q4_K else 1)  # a sanity bound on the level


def test_quantize_is_the_same_on_every_cpu_variant():
    """Fixed-width vectors and a fixed summation order: the same bytes whatever the ISA."""
    rng = np.random.default_rng(14)
    w = mx.array(rng.standard_t(3, (8, 1024)).astype(np.float32))
    previous = mlx_ggml_ext.cpu_isa()
    try:
        for t in EXACT_QUANTIZE + SEARCHED:
            outs = []
            for isa in mlx_ggml_ext.cpu_isas():
                mlx_ggml_ext.set_cpu_isa(isa)
                outs.append(np.array(quantize(w, t)))
            for other in outs[1:]:
                np.testing.assert_array_equal(other, outs[0], err_msg=t.name)
    finally:
        mlx_ggml_ext.set_cpu_isa(previous)


@pytest.mark.parametrize("t", SEARCHED, ids=lambda t: t.name)
def test_k_quantize_bytes_are_valid_and_stable(t):
    rng = np.random.default_rng(600 + int(t))
    # scales from 0.1 up: smaller ones make the float16 super-block scales subnormal, with few bits
    x = rng.standard_normal((8, 512)).astype(np.float32) * np.logspace(-1, 3, 8, dtype=np.float32)[:, None]
    blocks = np.array(quantize(mx.array(x), t)).reshape(-1, t.type_size)
    halves = [blocks[:, o:o + 2].copy().view(np.float16).astype(np.float32)[:, 0] for o in HALF_FIELDS[t]]
    for h in halves:
        assert np.isfinite(h).all()
        if len(HALF_FIELDS[t]) == 2:
            assert (h >= 0).all()  # d and dmin are non-negative: scales and mins are unsigned
    y = quants.dequantize(blocks.reshape(8, -1), gtype(t))
    # Quantizing values that are already on the grid keeps them there (nearly: the super-block scale may move).
    y2 = quants.dequantize(np.array(quantize(mx.array(y), t)), gtype(t))
    per_row = [rmse(y2[i], y[i]) / rmse(y[i], x[i]) for i in range(8)]
    assert max(per_row) < 0.25, per_row


@pytest.mark.parametrize("t", SEARCHED, ids=lambda t: t.name)
def test_k_quantize_special_blocks(t):
    x = np.zeros((4, 256), np.float32)
    x[1] = -2.5                       # constant negative: all in the min
    x[2] = np.linspace(0, 1, 256)      # non-negative ramp
    x[3, :16] = 7.0                    # one busy sub-block, the rest zero
    y = np.array(ops.dequantize(quantize(mx.array(x), t), t, x.shape))
    np.testing.assert_array_equal(y[0], 0.0)
    np.testing.assert_array_equal(y[3, 32:], 0.0)
    assert rmse(y[1], x[1]) < 2e-2 and rmse(y[2], x[2]) < 0.03 and rmse(y[3], x[3]) < 0.05


def test_quantize_vmap():
    rng = np.random.default_rng(12)
    w = rng.standard_normal((3, 4, 64)).astype(np.float32)
    expected = np.stack([np.asarray(quants.quantize(v, gtype(GGMLType.Q5_1))).view(np.uint8).reshape(4, -1)
                         for v in w])
    np.testing.assert_array_equal(np.array(mx.vmap(lambda v: quantize(v, "q5_1"))(mx.array(w))), expected)
    wt = mx.array(np.ascontiguousarray(w.transpose(1, 2, 0)))  # batch along the quantized axis
    np.testing.assert_array_equal(np.array(mx.vmap(lambda v: quantize(v, "q5_1"), in_axes=2)(wt)), expected)


def test_quantize_shapes():
    rng = np.random.default_rng(13)
    w = rng.standard_normal((2, 3, 64)).astype(np.float32)
    q = quantize(mx.array(w), "q8_0")
    assert q.shape == (6, 68)
    assert quantize(mx.array(w[0, 0]), "q8_0").shape == (1, 68)
    wt = rng.standard_normal((64, 5)).astype(np.float32)  # transposed: made row-contiguous
    np.testing.assert_array_equal(np.array(quantize(mx.array(wt).T, "q8_0")),
                                  np.asarray(quants.quantize(np.ascontiguousarray(wt.T), gtype(GGMLType.Q8_0))))
    np.testing.assert_array_equal(  # numpy integers in the shape
        np.array(ops.dequantize(q, "q8_0", np.array(w.shape))), np.array(ops.dequantize(q, "q8_0", w.shape)))
    t = GGMLTensor(q, "q8_0", w.shape)
    np.testing.assert_array_equal(np.array(t.dequantize()), quants.dequantize(np.array(q), gtype(GGMLType.Q8_0))
                                  .reshape(w.shape))


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, exc, match", [
    (lambda: ops.dequantize(mx.zeros((3, 35), dtype=mx.uint8), "q4_0", (3, 64)), ValueError,
     r"Q4_0 tensor of shape \(3, 64\) needs 3 x 36 bytes.*\(3, 35\)"),
    (lambda: ops.dequantize(mx.zeros((2, 54), dtype=mx.uint8), "q4_0", (3, 64)), ValueError, r"needs 3 x 36"),
    (lambda: ops.dequantize(mx.zeros((1, 144), dtype=mx.uint8), "q4_k", (1, 300)), ValueError,
     r"Q4_K rows must hold a multiple of 256 elements, got a last axis of 300"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.int8), "q4_0", (3, 64)), TypeError,
     r"data must be uint8.*int8"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), "q9_0", (3, 64)), ValueError,
     r"unknown ggml type 'q9_0'"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), 4, (3, 64)), ValueError,
     r"unsupported ggml type id 4"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), "q4_0", (3, 64), mx.int32), TypeError,
     r"dtype must be float32, float16 or bfloat16, got int32"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), "q4_0", ()), ValueError, r"at least one axis"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), "q4_0", (-3, 64)), ValueError, r"non-negative"),
    (lambda: ops.dequantize(mx.zeros((3, 36), dtype=mx.uint8), "q4_0", (3, 64.0)), TypeError, r"sequence of ints"),
    (lambda: ops.dequantize(np.zeros((3, 36), np.uint8), "q4_0", (3, 64)), TypeError,
     r"data must be an mlx.core.array, got ndarray"),
    (lambda: ops.quantize(mx.zeros((3, 63)), "q4_0"), ValueError, r"Q4_0 rows must hold a multiple of 32"),
    (lambda: ops.quantize(mx.zeros((3, 64), dtype=mx.int32), "q4_0"), TypeError, r"w must be float32.*int32"),
    (lambda: ops.quantize(mx.zeros((3, 64), dtype=mx.float64, stream=mx.cpu), "q8_0"), TypeError, r"float64"),
    (lambda: ops.quantize(mx.array(1.0), "q8_0"), ValueError, r"at least one dimension.*0-d"),
    (lambda: ops.quantize(mx.zeros((1, 32)), "nope"), ValueError, r"unknown ggml type 'nope'"),
    (lambda: ops.quantize([1.0] * 32, "q8_0"), TypeError, r"w must be an mlx.core.array, got list"),
], ids=lambda v: getattr(v, "__name__", None) if not callable(v) else None)
def test_bad_input_raises_clearly(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("t", NOT_QUANTIZABLE, ids=lambda t: t.name)
def test_types_without_a_quantizer(t):
    with pytest.raises(NotImplementedError, match=t.name):
        ops.quantize(mx.zeros((1, 256)), t)
