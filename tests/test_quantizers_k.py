"""Q2_K, Q3_K, IQ4_NL and IQ4_XS quantizers (and the importance matrix of every searched type): blocks that
gguf decodes, with a reconstruction error no worse than ggml's reference quantizer written in numpy
(tests/ggml_reference_quantizers.py), without and with an importance matrix."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import GGMLType, _ext, ops

import ggml_reference_quantizers as ggml_ref

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

NEW_TYPES = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS]
SEARCHED = NEW_TYPES + [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
ROWS, K = 32, 1024


def distributions(rng):
    normal = rng.standard_normal((ROWS, K))
    heavy = rng.standard_t(3, (ROWS, K))
    heavy[rng.random((ROWS, K)) < 0.005] *= 20  # and rare outliers
    return {
        "normal": normal,
        "heavy_tailed": heavy,
        "positive": rng.uniform(0, 1, (ROWS, K)),
        "row_scales": normal * np.logspace(-3, 3, ROWS)[:, None],  # float16 scales from subnormal to large
        "zeros": np.zeros((ROWS, K)),
    }


DATA = {name: x.astype(np.float32) for name, x in distributions(np.random.default_rng(34)).items()}
# Importance of each column, as the mean squared activations of a model's inputs spread: a few dominate.
IMATRIX = np.exp(1.5 * np.random.default_rng(35).standard_normal(K)).astype(np.float32)


def quantize(x, t, imatrix=None):
    return ops.quantize(mx.array(x), t, imatrix=None if imatrix is None else mx.array(imatrix), stream=mx.cpu)


def decoded(x, t, imatrix=None):
    """Our blocks decoded by gguf (the independent decoder), after checking ours decodes them bit for bit."""
    blocks = np.array(quantize(x, t, imatrix))
    assert blocks.dtype == np.uint8 and blocks.shape == (x.shape[0], t.row_bytes(x.shape[1]))
    y = quants.dequantize(blocks, gguf.GGMLQuantizationType(int(t)))
    ours = np.array(ops.dequantize(mx.array(blocks), t, x.shape, stream=mx.cpu))
    np.testing.assert_array_equal(ours.view(np.uint32), y.view(np.uint32))
    return y


def weighted_sq_error(y, x, w=None) -> float:
    """Per row sum(w * (y - x)^2) / sum(w * x^2) (w per column, 1 without an importance matrix), summed over
    the rows: each row counts by its relative error whatever its scale (rows with no energy by their error)."""
    y, x = np.asarray(y, np.float64), np.asarray(x, np.float64)
    w = np.ones(x.shape[-1]) if w is None else np.asarray(w, np.float64)
    energy = np.sum(w * x * x, axis=-1)
    return float(np.sum(np.sum(w * (y - x) ** 2, axis=-1) / np.where(energy > 0, energy, 1.0)))


@pytest.mark.parametrize("data", sorted(DATA))
@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_error_no_worse_than_ggml_reference(t, data):
    x = DATA[data]
    ours = weighted_sq_error(decoded(x, t), x)
    ref = weighted_sq_error(ggml_ref.QUANTIZERS[t.name](x), x)
    if data == "zeros":
        assert ours == 0.0 and ref == 0.0
        return
    assert ours <= ref, f"{t.name} {data}: mean NMSE per row, ours {ours / ROWS:.6f} vs ggml's {ref / ROWS:.6f}"


@pytest.mark.parametrize("data", ["normal", "heavy_tailed", "row_scales"])
@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_imatrix_lowers_the_weighted_error(t, data):
    """With an importance matrix the error weighted by it is no worse than without one, and no worse than
    ggml's reference quantizer given the same matrix."""
    x = DATA[data]
    with_im = weighted_sq_error(decoded(x, t, IMATRIX), x, IMATRIX)
    without = weighted_sq_error(decoded(x, t), x, IMATRIX)
    ref = weighted_sq_error(ggml_ref.QUANTIZERS[t.name](x, IMATRIX), x, IMATRIX)
    assert with_im <= without and with_im <= ref, (with_im, without, ref)


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_imatrix_for_the_older_k_quants(t):
    x = DATA["heavy_tailed"]
    with_im = weighted_sq_error(decoded(x, t, IMATRIX), x, IMATRIX)
    without = weighted_sq_error(decoded(x, t), x, IMATRIX)
    assert with_im < without, (with_im, without)


@pytest.mark.parametrize("t", SEARCHED, ids=lambda t: t.name)
def test_imatrix_edge_values(t):
    """Zero columns (a whole sub-block's included: then the plain error there), uniform weights (the same
    bytes as none: the weights are scaled to mean 1), and a leading batch axis (one weight per column)."""
    x = DATA["normal"][:4]
    im = IMATRIX.copy()
    im[:64] = 0.0
    im[100:103] = 0.0
    y = decoded(x, t, im)
    assert np.all(np.isfinite(y))
    assert weighted_sq_error(y, x) < 0.2 * x.shape[0]
    np.testing.assert_array_equal(np.array(quantize(x, t, np.full(K, 3.0, np.float32))), np.array(quantize(x, t)))
    batched = np.array(quantize(x.reshape(2, 2, K), t, im))
    np.testing.assert_array_equal(batched, np.array(quantize(x, t, im)))


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_values_already_on_the_grid_stay_close(t):
    """Quantizing decoded values again nearly reproduces them (the scale search finds the grid)."""
    x = DATA["normal"][:8]
    y = decoded(x, t)
    y2 = decoded(y, t)
    assert weighted_sq_error(y2, y) < 0.1 * weighted_sq_error(y, x)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: ops.quantize(mx.zeros((2, 100)), "q3_k"), ValueError, r"Q3_K rows must hold a multiple of 256"),
    (lambda: ops.quantize(mx.zeros((2, 48)), "iq4_nl"), ValueError, r"IQ4_NL rows must hold a multiple of 32"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "q2_k", imatrix=mx.ones((128,))), ValueError,
     r"imatrix must have shape \(256,\).*\(2, 256\); got \(128,\)"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "q2_k", imatrix=mx.ones((2, 256))), ValueError,
     r"imatrix must have shape \(256,\)"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "iq4_xs", imatrix=mx.ones((256,), dtype=mx.float16)), TypeError,
     r"imatrix must be float32, got float16"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "iq4_xs", imatrix=np.ones(256, np.float32)), TypeError,
     r"imatrix must be an mlx.core.array, got ndarray"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "q3_k", imatrix=mx.array([-1.0] + [1.0] * 255)), ValueError,
     r"imatrix must be finite and >= 0"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "q3_k", imatrix=mx.array([float("nan")] * 256)), ValueError,
     r"imatrix must be finite and >= 0"),
    (lambda: ops.quantize(mx.zeros((2, 256)), "q8_0", imatrix=mx.ones((256,))), ValueError,
     r"Q8_0 is quantized exactly as gguf does and takes no imatrix"),
])
def test_bad_input_raises_clearly(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_imatrix_under_vmap():
    x = DATA["normal"][:6].reshape(3, 2, K)
    im = mx.array(IMATRIX)
    f = lambda v: ops.quantize(v, "iq4_xs", imatrix=im, stream=mx.cpu)
    expected = np.stack([np.array(f(mx.array(v))) for v in x])
    np.testing.assert_array_equal(np.array(mx.vmap(f)(mx.array(x))), expected)
    with pytest.raises(ValueError, match=r"vmap over the imatrix is not supported"):
        mx.vmap(lambda v, w: _ext.quantize(v, int(GGMLType.IQ4_XS), imatrix=w, stream=mx.cpu))(
            mx.array(x), mx.array(np.stack([IMATRIX] * 3)))
