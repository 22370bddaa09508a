"""Q4_K rows packed for the CPU (ops.pack_rows, "Q4_K_R8"): the packing is lossless, the product on it agrees with
float64 math on gguf's decoding of the blocks and with the plain Q4_K kernel on every CPU kernel variant, its
gradient is the plain one, bad input raises, the GPU refuses it, and models.load's packing changes no logit."""

import mlx.core as mx
import numpy as np
import pytest

import model_reference as ref
from harness import DTYPES, nmse, to_numpy
from mlx_ggml_ext import GGMLTensor, GGMLType, _ext, models, ops, reference
from mlx_ggml_ext.nn import GGMLLinear

gguf = pytest.importorskip("gguf")

QUANT_NMSE = 2e-4  # as test_matmul.py: int8 activations per 32 elements
# The packed and plain kernels add the same terms in another order: float32 rounding apart.
PLAIN_AGREEMENT = 2e-5


def q4k(rng, n, k):
    data = reference.random_blocks(rng, "Q4_K", n, k)
    dense = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q4_K).astype(np.float64).reshape(n, k)
    return mx.array(data), dense


def rel_max(got, expected) -> float:
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))


@pytest.fixture
def on_cpu(device):
    if device != mx.cpu:
        pytest.skip("the packed layout is a CPU layout (test_gpu_refuses_the_packed_layout covers the GPU)")


@pytest.mark.parametrize("n, k", [(8, 256), (64, 1024), (24, 2816)])
def test_packing_round_trips_bit_for_bit(n, k):
    rng = np.random.default_rng(n + k)
    blocks, dense = q4k(rng, n, k)
    packed = ops.pack_rows(blocks, "Q4_K")
    assert packed.dtype == mx.uint8 and packed.shape == (n, k // 256 * 148)
    back = ops.unpack_rows(packed)
    assert np.array_equal(np.array(back), np.array(blocks))
    # the layout itself: row r of group g, bytes 8u..8u+7 of chunk j at qs[j][u][r] (kernels/cpu/packed_rows.h)
    raw = np.array(blocks).reshape(n // 8, 8, k // 256, 144)
    block = np.array(packed).reshape(n // 8, k // 256, 1184)
    qs = block[..., 160:].reshape(n // 8, k // 256, 4, 4, 8, 8)
    expected = raw[..., 16:].reshape(n // 8, 8, k // 256, 4, 4, 8).transpose(0, 2, 3, 4, 1, 5)
    assert np.array_equal(qs, expected)
    d = block[..., :16].reshape(n // 8, k // 256, 8, 2)  # the rows' d, then their dmin
    assert np.array_equal(d, raw[..., 0:2].transpose(0, 2, 1, 3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 33])
def test_product_matches_float64_and_the_plain_kernel(on_cpu, cpu_isa, dtype, m):
    rng = np.random.default_rng(100 + m)
    n, k = 40, 768
    blocks, dense = q4k(rng, n, k)
    packed = ops.pack_rows(blocks, "Q4_K")
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    y = ops.quantized_matmul(x, packed, "Q4_K_R8")
    assert y.dtype == dtype and y.shape == (m, n)
    assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE
    plain = ops.quantized_matmul(x, blocks, "Q4_K")
    bound = PLAIN_AGREEMENT if dtype == mx.float32 else 2 ** -7  # half outputs: a rounding of either apart
    assert rel_max(to_numpy(y), to_numpy(plain)) <= bound, cpu_isa


def test_long_rows_and_many_rows_across_threads(on_cpu):
    rng = np.random.default_rng(7)
    n, k = 2048, 4096
    blocks, dense = q4k(rng, n, k)
    packed = ops.pack_rows(blocks, "Q4_K")
    for m in (1, 6, 70):
        x = mx.array(rng.standard_normal((2, m, k)).astype(np.float32))  # leading axes are rows too
        y = ops.quantized_matmul(x, packed, "Q4_K_R8")
        assert y.shape == (2, m, n)
        assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE


def test_precise_x_on_packed_rows(on_cpu, cpu_isa):
    rng = np.random.default_rng(5)
    n, k = 16, 512
    blocks, dense = q4k(rng, n, k)
    packed = ops.pack_rows(blocks, "Q4_K")
    for m in (1, 3, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::37] *= 20.0
        exact = x.astype(np.float64) @ dense.T
        one_pass = nmse(to_numpy(ops.quantized_matmul(mx.array(x), packed, "Q4_K_R8")), exact)
        y = ops.quantized_matmul(mx.array(x), packed, "Q4_K_R8", precise_x=True)
        assert nmse(to_numpy(y), exact) <= max(one_pass / 1000, 1e-12), (cpu_isa, m)
        plain = ops.quantized_matmul(mx.array(x), blocks, "Q4_K", precise_x=True)
        assert rel_max(to_numpy(y), to_numpy(plain)) <= PLAIN_AGREEMENT


def test_gradient_jvp_vmap_and_compile(on_cpu):
    rng = np.random.default_rng(9)
    n, k = 32, 512
    blocks, dense = q4k(rng, n, k)
    packed = ops.pack_rows(blocks, "Q4_K")
    x = mx.array(rng.standard_normal((3, k)).astype(np.float32))
    ct = mx.array(rng.standard_normal((3, n)).astype(np.float32))
    _, (g_packed,) = mx.vjp(lambda v: ops.quantized_matmul(v, packed, "Q4_K_R8"), [x], [ct])
    _, (g_plain,) = mx.vjp(lambda v: ops.quantized_matmul(v, blocks, "Q4_K"), [x], [ct])
    assert np.array_equal(np.array(g_packed), np.array(g_plain))  # the same decoded values, the same sums
    assert nmse(to_numpy(g_packed), to_numpy(ct) @ dense) <= 1e-10
    _, (t_out,) = mx.jvp(lambda v: ops.quantized_matmul(v, packed, "Q4_K_R8"), [x], [x])
    assert np.array_equal(np.array(t_out), np.array(ops.quantized_matmul(x, packed, "Q4_K_R8")))
    xs = mx.array(rng.standard_normal((4, 2, k)).astype(np.float32))
    mapped = mx.vmap(lambda v: ops.quantized_matmul(v, packed, "Q4_K_R8"))(xs)
    assert np.array_equal(np.array(mapped), np.array(ops.quantized_matmul(xs, packed, "Q4_K_R8")))
    f = mx.compile(lambda v: ops.quantized_matmul(v, packed, "Q4_K_R8"), shapeless=True)
    for m in (1, 5):
        v = mx.array(rng.standard_normal((m, k)).astype(np.float32))
        assert np.array_equal(np.array(f(v)), np.array(ops.quantized_matmul(v, packed, "Q4_K_R8")))
    with pytest.raises(ValueError, match="elements per row"):
        f(mx.zeros((2, 256)))


def test_the_layer_packs_itself(on_cpu):
    rng = np.random.default_rng(11)
    n, k = 24, 512
    blocks, _ = q4k(rng, n, k)
    bias = mx.array(rng.standard_normal(n).astype(np.float32))
    layer = GGMLLinear(GGMLTensor(blocks, GGMLType.Q4_K, (n, k)), bias)
    x = mx.array(rng.standard_normal((2, k)).astype(np.float32))
    plain = layer(x)
    assert layer.pack_rows() and layer.packed and not layer.pack_rows()  # once
    assert "packed_rows=True" in repr(layer)
    assert rel_max(to_numpy(layer(x)), to_numpy(plain)) <= PLAIN_AGREEMENT
    assert np.array_equal(np.array(layer.tensor.data), np.array(blocks))  # the blocks back, for stacking or LoRA
    assert "weight" not in layer.trainable_parameters()
    q6 = GGMLLinear(GGMLTensor(mx.array(reference.random_blocks(rng, "Q6_K", n, k)), GGMLType.Q6_K, (n, k)))
    odd = GGMLLinear(GGMLTensor(q4k(rng, 12, k)[0], GGMLType.Q4_K, (12, k)))
    assert not q6.pack_rows() and not odd.pack_rows() and not q6.packed and not odd.packed


@pytest.mark.parametrize("call, exc, match", [
    (lambda b, p: ops.pack_rows(b, "Q6_K"), ValueError, "packs Q4_K rows only"),
    (lambda b, p: ops.pack_rows(p, "Q4_K_R8"), ValueError, "already packed"),
    (lambda b, p: ops.pack_rows(b[:12], "Q4_K"), ValueError, "multiple of 8"),
    (lambda b, p: ops.pack_rows(b[:, :100], "Q4_K"), ValueError, "144-byte blocks"),
    (lambda b, p: ops.pack_rows(b.astype(mx.float32), "Q4_K"), TypeError, "uint8"),
    (lambda b, p: ops.pack_rows(b, None), TypeError, "ggml_type"),
    (lambda b, p: ops.unpack_rows(b[:, :148 * 2]), ValueError, "148-byte blocks"),
    (lambda b, p: ops.quantized_matmul(mx.zeros((1, 512)), p[:12], "Q4_K_R8"), ValueError, "multiple of 8 rows"),
    (lambda b, p: ops.quantized_matmul(mx.zeros((1, 256)), p, "Q4_K_R8"), ValueError, "needs blocks of shape"),
    # the other ops would read the packed bytes as rows: they refuse the type (the C++ check, under ops' own)
    (lambda b, p: _ext.mul_mat(p, ops.Q4_K_R8, [16, 512], mx.zeros((1, 512))), ValueError, "mul_mat.*Q4_K_R8"),
    (lambda b, p: _ext.dequantize(p, ops.Q4_K_R8, [16, 512]), ValueError, "dequantize.*Q4_K_R8"),
    (lambda b, p: _ext.mul_mat_id(p.reshape(2, 8, 296), ops.Q4_K_R8, [2, 8, 512], mx.zeros((1, 1, 512)),
                                  mx.zeros((1, 1), mx.int32)), ValueError, "mul_mat_id.*Q4_K_R8"),
    (lambda b, p: ops.dequantize(p, "Q4_K_R8", (16, 512)), ValueError, "Q4_K_R8"),
])
def test_bad_input_raises_clearly(call, exc, match):
    rng = np.random.default_rng(3)
    blocks, _ = q4k(rng, 16, 512)
    packed = ops.pack_rows(blocks, "Q4_K")
    with pytest.raises(exc, match=match):
        mx.eval(call(blocks, packed))


def test_gpu_refuses_the_packed_layout(device):
    rng = np.random.default_rng(4)
    blocks, _ = q4k(rng, 16, 512)
    packed = ops.pack_rows(blocks, "Q4_K")
    if device == mx.cpu:
        assert mx.default_device() == mx.cpu
        return
    with pytest.raises(NotImplementedError, match="CPU layout"):
        mx.eval(ops.quantized_matmul(mx.zeros((1, 512)), packed, "Q4_K_R8", stream=mx.gpu))
    assert not models.packs_rows_by_default()  # a GPU default device: load keeps the blocks


def test_models_load_packs_q4k_matrices_and_changes_no_logit(on_cpu, tmp_path):
    m = ref.TINY_MODELS["llama"]
    path = str(tmp_path / "llama.gguf")
    ref.write_model(path, m)
    packed_model, _ = models.load(path, tokenizer=False, pack_rows=True)
    plain_model, _ = models.load(path, tokenizer=False, pack_rows=False)
    layers = [mod for mod in packed_model.modules() if isinstance(mod, GGMLLinear)]
    assert any(layer.packed for layer in layers)
    assert all(layer.packed == (layer.ggml_type == GGMLType.Q4_K and layer.output_dims % 8 == 0) for layer in layers)
    assert not any(mod.packed for mod in plain_model.modules() if isinstance(mod, GGMLLinear))
    tokens = mx.array(np.random.default_rng(1).integers(0, 320, 12))[None]
    got, expected = np.array(packed_model(tokens)), np.array(plain_model(tokens))
    assert rel_max(got, expected) <= 1e-4


def test_load_default_follows_the_environment(monkeypatch):
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "1")
    assert models.packs_rows_by_default()
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "0")
    assert not models.packs_rows_by_default()
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "yes")
    with pytest.raises(ValueError, match="MLX_GGML_EXT_PACK_ROWS"):
        models.packs_rows_by_default()
