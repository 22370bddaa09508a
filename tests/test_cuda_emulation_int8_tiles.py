"""kernels/cuda/matmul_int8_tiles.cu run on the host (tests/cuda_emulation, as test_cuda_emulation.py): the forward
product of m > 8 rows of x on the formats with tensor-core fragments, x quantized to int8 per 32 elements (step 0)
and multiplied on emulated m16n8k32 / m16n8k16 products, against float64 math on gguf's dequantized weights.

The rule is the decode route's (test_cuda_emulation.py): NMSE at most 1.1x that of ggml's own CPU scheme for x and
within 5e-4 on rows of 256 or more elements (x with outliers); and the route taken is checked through the plan."""
import numpy as np
import pytest

from harness import nmse
from test_cuda_emulation import (BF16, F16, F32, NP_TYPES, QuantizedMatmulArgs, assert_no_less_accurate_than_ggml,
                                 ggml_scheme, kernels, loaded, matmul_case, ptr,  # noqa: F401 (kernels: the fixture)
                                 stored)
from mlx_ggml_ext import GGMLType, reference

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402


def gguf_values(blocks, t, n, k):
    """float64 (n, k) of the weight rows, decoded by the gguf package."""
    return np.asarray(quants.dequantize(blocks, gguf.GGMLQuantizationType(int(t))), np.float64).reshape(n, k)


def int8_case(kernels, t, x_type, m, n, k, batch=1, out_f32=True, offset=0, float_x=False):
    """Random blocks (rows starting `offset` bytes past a 16-byte boundary) and x with a few outliers; returns
    (got, exact, ggml's scheme, whether the plan took the int8 tiles)."""
    rng = np.random.default_rng(int(t) * 1000 + m + k + n + 7 * x_type + offset)
    w = np.stack([reference.random_blocks(rng, t.name, n, k) for _ in range(batch)])  # (batch, n, row_bytes)
    buf = np.zeros(w.nbytes + 64, np.uint8)
    base = (-buf.ctypes.data) % 16 + offset
    buf[base:base + w.nbytes] = w.reshape(-1)
    values = np.stack([gguf_values(wi, t, n, k) for wi in w])
    xf = rng.standard_normal((batch, m, k))
    xf[..., ::97] *= 8.0  # a few outliers, as real activations have
    x = stored(xf, x_type)
    out_type = F32 if out_f32 or x_type == F32 else x_type
    y = np.zeros((batch, m, n), NP_TYPES[out_type])
    args = QuantizedMatmulArgs(ptr(x), buf.ctypes.data + base, ptr(y), None, m, n, k, w.shape[-1], batch, batch,
                               batch, 1, 1, out_f32)
    route = kernels.emulated_quantized_matmul_takes_int8_tiles(args, int(t), x_type, 0, int(float_x))
    assert kernels.emulated_quantized_matmul(args, int(t), x_type, 0, int(float_x)) == 0
    xs = loaded(x, x_type)
    exact = np.einsum("bmk,bnk->bmn", xs, values)
    theirs = np.einsum("bmk,bnk->bmn", ggml_scheme(xs, t), values)
    return loaded(y, out_type), exact, theirs, route


# Each format with fragments once, the x types and tile edges spread over them: m = 9 (one n8 tile and a bit), 70
# (past a 64-row tile); n = 136 (past a 128-row tile); one stage of 8 x-blocks, several, a last partial one
# (32-element formats); rows on 16-byte boundaries (16-byte copies) or only on 4-byte ones (4-byte copies).
CASES = [(GGMLType.Q4_0, F32, 70, 40, 320),     # 180-byte rows: 4-byte copies, a partial second stage
         (GGMLType.Q4_1, F16, 9, 136, 64),      # one partial stage
         (GGMLType.Q5_0, BF16, 70, 40, 576),
         (GGMLType.Q5_1, F32, 9, 136, 320),     # 240-byte rows: 16-byte copies
         (GGMLType.Q8_0, F16, 70, 40, 64),
         (GGMLType.IQ4_NL, BF16, 9, 40, 576),
         (GGMLType.MXFP4, F32, 70, 136, 512),   # 272-byte rows of 17-byte blocks
         (GGMLType.Q2_K, F16, 9, 40, 1024),
         (GGMLType.Q3_K, BF16, 70, 40, 512),    # 220-byte rows: 4-byte copies, 110-byte blocks
         (GGMLType.Q4_K, F32, 9, 136, 512),
         (GGMLType.Q5_K, F16, 70, 40, 256),
         (GGMLType.Q6_K, BF16, 70, 40, 2048),   # 210-byte blocks: stages starting inside a 16-byte word
         (GGMLType.IQ4_XS, F32, 9, 40, 512)]


@pytest.mark.parametrize("t, x_type, m, n, k", CASES,
                         ids=[f"{t.name}-{['f32', 'f16', 'bf16'][x]}-m{m}-n{n}-k{k}" for t, x, m, n, k in CASES])
def test_int8_tiles(kernels, t, x_type, m, n, k):
    """Every format with fragments on the int8 tiles, held to the decode route's accuracy rule."""
    got, exact, theirs, route = int8_case(kernels, t, x_type, m, n, k)
    assert route
    assert_no_less_accurate_than_ggml(got, exact, theirs, f"{t.name} m={m} n={n} k={k}", k)


@pytest.mark.parametrize("t, offset", [(GGMLType.Q8_0, 4), (GGMLType.Q6_K, 4), (GGMLType.Q4_0, 2)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_int8_tiles_row_alignment(kernels, t, offset):
    """Rows on 4-byte but not 16-byte boundaries take 4-byte copies (Q8_0: 34-byte blocks, k = 640, rows of 680
    bytes; Q6_K with the base 4 bytes off); rows on 2-byte boundaries only (Q4_0, odd block count) the WMMA tiles."""
    k = 640 if t != GGMLType.Q4_0 else 96
    if t == GGMLType.Q6_K:
        k = 512
    got, exact, theirs, route = int8_case(kernels, t, F16, 12, 24, k, offset=offset)
    assert route == (offset % 4 == 0 and t.row_bytes(k) % 4 == 0)
    if route:
        assert_no_less_accurate_than_ggml(got, exact, theirs, f"{t.name} offset {offset}", k)
    else:
        assert nmse(got, exact) < 2e-6  # float16 x, WMMA: rounding only


def test_int8_tiles_batches_and_half_output(kernels):
    """Three batches of weights and x (grid.z), bfloat16 output: within 5e-4 of exact (the output's own rounding
    decides between equally good results)."""
    got, exact, _, route = int8_case(kernels, GGMLType.Q4_K, BF16, 20, 24, 256, batch=3, out_f32=False)
    assert route
    assert nmse(got, exact) <= 5e-4


def test_int8_tiles_not_for_exact_x(kernels):
    """precise_x (float_x) keeps x as floats: the WMMA tiles in x's own type, float16 rounding only."""
    got, exact, _, route = int8_case(kernels, GGMLType.Q4_0, F16, 9, 40, 256, float_x=True)
    assert not route
    assert nmse(got, exact) < 2e-6


def test_int8_tiles_non_finite_x(kernels):
    """A NaN in a row of x makes that row's outputs NaN, an infinity non-finite; the other rows stay finite."""
    rng = np.random.default_rng(5)
    t, m, n, k = GGMLType.Q4_K, 10, 16, 256
    w = reference.random_blocks(rng, t.name, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[1, 5], x[9, 40] = np.nan, np.inf
    y = np.zeros((m, n), np.float32)
    args = QuantizedMatmulArgs(ptr(x), ptr(w), ptr(y), None, m, n, k, w.shape[-1], 1, 1, 1, 1, 1, False)
    assert kernels.emulated_quantized_matmul_takes_int8_tiles(args, int(t), F32, 0, 0)
    assert kernels.emulated_quantized_matmul(args, int(t), F32, 0, 0) == 0
    assert np.isnan(y[1]).all() and not np.isfinite(y[9]).any()
    assert np.isfinite(np.delete(y, [1, 9], axis=0)).all()


def test_int8_tiles_broadcasting(kernels):
    """ggml's broadcasting: x batches (2, 4) over weight batches (1, 2), against the package's float64 reference
    decoder (test_cuda_emulation.matmul_case); within the GPU suite's 2e-4 and above float16's rounding alone (x is
    quantized to int8 here, not left in float16 as the WMMA tiles would)."""
    got, expected = matmul_case(kernels, GGMLType.Q4_K, F16, 9, False, batch=(2, 4), w_batch=(1, 2), out_f32=True)
    assert 1e-6 < nmse(got, expected) <= 2e-4
