"""Q4_K, Q6_K, Q4_0, IQ4_NL, Q5_0 and Q8_0 rows packed for the CPU (ops.pack_rows, "Q4_K_R8" etc.): lossless, the
product on it agrees with float64 math on gguf's decoding of the blocks and with the plain kernel on every CPU
kernel variant, its gradient is the plain one, bad input raises, the GPU refuses it, and models.load's packing
(the tied head's table included) changes no logit."""

import os

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


PACKED = {t: t + "_R8" for t in ("Q4_K", "Q6_K", "Q4_0", "IQ4_NL", "Q5_0", "Q8_0")}
ROW_BYTES = {"Q4_K": 148, "Q6_K": 210, "Q4_0": 144, "IQ4_NL": 144, "Q5_0": 176, "Q8_0": 272}  # per 256 elements
BLOCK_SIZE = {"Q4_K": 256, "Q6_K": 256, "Q4_0": 32, "IQ4_NL": 32, "Q5_0": 32, "Q8_0": 32}


def test_the_packed_types_are_the_tables():
    assert set(PACKED) == {t.name for t in ops.PACKABLE_TYPES}
    assert {name: ops._type_id(name) for name in PACKED.values()} == {
        name: packed for name, (packed, _, _) in _ext.PACKED_TYPES.items()}
    # the bytes per block models.load counts before packing (pack_rows_bytes)
    assert {t.name: ops._PACKED_BLOCK_BYTES[t] * 256 // t.block_size for t in ops.PACKABLE_TYPES} == ROW_BYTES


def blocks_of(rng, t, n, k):
    data = reference.random_blocks(rng, t, n, k)
    dense = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[t]).astype(np.float64).reshape(n, k)
    return mx.array(data), dense


def q4k(rng, n, k):
    return blocks_of(rng, "Q4_K", n, k)


def packed_case(t, n, k, seed):
    """(rng, plain blocks, their float64 matrix, the packed rows) of a random (n, k) matrix of type t."""
    rng = np.random.default_rng(seed)
    blocks, dense = blocks_of(rng, t, n, k)
    return rng, blocks, dense, ops.pack_rows(blocks, t)


def rel_max(got, expected) -> float:
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))


@pytest.fixture
def on_cpu(device):
    if device != mx.cpu:
        pytest.skip("the packed layout is a CPU layout (test_gpu_refuses_the_packed_layout covers the GPU)")


@pytest.mark.parametrize("t", list(PACKED))
@pytest.mark.parametrize("n, k", [(8, 256), (64, 1024), (24, 2816)])
def test_either_type_round_trips_bit_for_bit(t, n, k):
    rng = np.random.default_rng(n + k)
    blocks, dense = blocks_of(rng, t, n, k)
    packed = ops.pack_rows(blocks, t)
    assert packed.dtype == mx.uint8 and packed.shape == (n, k // 256 * ROW_BYTES[t])
    assert np.array_equal(np.array(ops.unpack_rows(packed, PACKED[t])), np.array(blocks))


def plain_and_packed_blocks(t, n, k, seed):
    """(groups of 8 rows, blocks per row, the plain blocks as (group, row, block, bytes), the packed ones as
    (group, block, bytes))."""
    blocks, _ = blocks_of(np.random.default_rng(seed), t, n, k)
    qk = BLOCK_SIZE[t]
    plain_bytes = np.array(blocks).shape[1] // (k // qk)
    g, nb = n // 8, k // qk
    packed = np.array(ops.pack_rows(blocks, t)).reshape(g, nb, -1)
    return g, nb, np.array(blocks).reshape(g, 8, nb, plain_bytes), packed


def test_q6k_layout():
    """d at d[r], the 16 scales at scales[s][r], then per half n and unit u: row r's ql bytes 64 n + 8 u .. + 8,
    its ql bytes 64 n + 32 + 8 u .. + 8 and its qh bytes 32 n + 8 u .. + 8, 8 rows each (kernels/cpu/packed_rows.h)."""
    g, nb, raw, block = plain_and_packed_blocks("Q6_K", 16, 512, 8)
    assert np.array_equal(block[..., :16].reshape(g, nb, 8, 2), raw[..., 208:210].transpose(0, 2, 1, 3))
    assert np.array_equal(block[..., 16:144].reshape(g, nb, 16, 8), raw[..., 192:208].transpose(0, 2, 3, 1))
    units = block[..., 144:].reshape(g, nb, 2, 4, 3, 8, 8)  # [half][unit][ql_a, ql_b, qh][row][byte]
    ql = raw[..., :128].reshape(g, 8, nb, 2, 2, 4, 8).transpose(0, 2, 3, 5, 4, 1, 6)  # [half][unit][a/b][row][byte]
    qh = raw[..., 128:192].reshape(g, 8, nb, 2, 4, 8).transpose(0, 2, 3, 4, 1, 5)
    assert np.array_equal(units[..., :2, :, :], ql)
    assert np.array_equal(units[..., 2, :, :], qh)


def test_q8_0_layout():
    """d at d[r], then row r's bytes 8 u .. 8 u + 7 at qs[u][r] (kernels/cpu/packed_rows.h)."""
    g, nb, raw, block = plain_and_packed_blocks("Q8_0", 16, 96, 9)
    assert np.array_equal(block[..., :16].reshape(g, nb, 8, 2), raw[..., :2].transpose(0, 2, 1, 3))
    qs = block[..., 16:].reshape(g, nb, 4, 8, 8)
    assert np.array_equal(qs, raw[..., 2:].reshape(g, 8, nb, 4, 8).transpose(0, 2, 3, 1, 4))


def test_q5_0_layout():
    """d at d[r], row r's qh byte u at qh[u][r], then row r's nibble bytes 8 h .. 8 h + 7 at qs[h][r]
    (kernels/cpu/packed_rows.h); K = 640 as in Gemma 3 270M's Q5_0 matrices (not a multiple of 256)."""
    g, nb, raw, block = plain_and_packed_blocks("Q5_0", 16, 640, 10)
    assert np.array_equal(block[..., :16].reshape(g, nb, 8, 2), raw[..., :2].transpose(0, 2, 1, 3))
    assert np.array_equal(block[..., 16:48].reshape(g, nb, 4, 8), raw[..., 2:6].transpose(0, 2, 3, 1))
    qs = block[..., 48:].reshape(g, nb, 2, 8, 8)
    assert np.array_equal(qs, raw[..., 6:].reshape(g, 8, nb, 2, 8).transpose(0, 2, 3, 1, 4))


@pytest.mark.parametrize("t", ["Q4_0", "IQ4_NL"])
def test_nibble_layouts(t):
    """Q4_0 and IQ4_NL: d at d[r], then row r's nibble bytes 8 h .. 8 h + 7 at qs[h][r] (kernels/cpu/packed_rows.h)."""
    g, nb, raw, block = plain_and_packed_blocks(t, 16, 640, 11)
    assert np.array_equal(block[..., :16].reshape(g, nb, 8, 2), raw[..., :2].transpose(0, 2, 1, 3))
    assert np.array_equal(block[..., 16:].reshape(g, nb, 2, 8, 8), raw[..., 2:].reshape(g, 8, nb, 2, 8).transpose(0, 2, 3, 1, 4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 4, 7])
def test_q5_0_product_at_gemmas_width(on_cpu, cpu_isa, dtype, m):
    """K = 640 (20 blocks: the activations' 64-element records end in a half record) against float64."""
    rng, blocks, dense, packed = packed_case("Q5_0", 48, 640, 30 + m)
    x = mx.array(rng.standard_normal((m, 640)).astype(np.float32)).astype(dtype)
    y = ops.quantized_matmul(x, packed, "Q5_0_R8")
    assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE, cpu_isa
    bound = PLAIN_AGREEMENT if dtype == mx.float32 else 2 ** -7
    assert rel_max(to_numpy(y), to_numpy(ops.quantized_matmul(x, blocks, "Q5_0"))) <= bound, cpu_isa


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


@pytest.mark.parametrize("t", list(PACKED))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 33])
def test_product_matches_float64_and_the_plain_kernel(on_cpu, cpu_isa, dtype, m, t):
    n, k = 40, 768
    rng, blocks, dense, packed = packed_case(t, n, k, 100 + m)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    y = ops.quantized_matmul(x, packed, PACKED[t])
    assert y.dtype == dtype and y.shape == (m, n)
    assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE
    plain = ops.quantized_matmul(x, blocks, t)
    bound = PLAIN_AGREEMENT if dtype == mx.float32 else 2 ** -7  # half outputs: a rounding of either apart
    assert rel_max(to_numpy(y), to_numpy(plain)) <= bound, cpu_isa


@pytest.mark.parametrize("t", list(PACKED))
def test_long_rows_and_many_rows_across_threads(on_cpu, t):
    n, k = 2048, 4096
    rng, blocks, dense, packed = packed_case(t, n, k, 7)
    for m in (1, 6, 70):
        x = mx.array(rng.standard_normal((2, m, k)).astype(np.float32))  # leading axes are rows too
        y = ops.quantized_matmul(x, packed, PACKED[t])
        assert y.shape == (2, m, n)
        assert nmse(to_numpy(y), to_numpy(x) @ dense.T) <= QUANT_NMSE


@pytest.mark.parametrize("t", list(PACKED))
def test_precise_x_on_packed_rows(on_cpu, cpu_isa, t):
    n, k = 16, 512
    rng, blocks, dense, packed = packed_case(t, n, k, 5)
    for m in (1, 3, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::37] *= 20.0
        exact = x.astype(np.float64) @ dense.T
        one_pass = nmse(to_numpy(ops.quantized_matmul(mx.array(x), packed, PACKED[t])), exact)
        y = ops.quantized_matmul(mx.array(x), packed, PACKED[t], precise_x=True)
        assert nmse(to_numpy(y), exact) <= max(one_pass / 1000, 1e-12), (cpu_isa, m)
        plain = ops.quantized_matmul(mx.array(x), blocks, t, precise_x=True)
        assert rel_max(to_numpy(y), to_numpy(plain)) <= PLAIN_AGREEMENT


@pytest.mark.parametrize("t", list(PACKED))
def test_gradient_jvp_vmap_and_compile(on_cpu, t):
    n, k = 32, 512
    rng, blocks, dense, packed = packed_case(t, n, k, 9)
    x = mx.array(rng.standard_normal((3, k)).astype(np.float32))
    ct = mx.array(rng.standard_normal((3, n)).astype(np.float32))
    _, (g_packed,) = mx.vjp(lambda v: ops.quantized_matmul(v, packed, PACKED[t]), [x], [ct])
    _, (g_plain,) = mx.vjp(lambda v: ops.quantized_matmul(v, blocks, t), [x], [ct])
    assert np.array_equal(np.array(g_packed), np.array(g_plain))  # the same decoded values, the same sums
    assert nmse(to_numpy(g_packed), to_numpy(ct) @ dense) <= 1e-10
    _, (t_out,) = mx.jvp(lambda v: ops.quantized_matmul(v, packed, PACKED[t]), [x], [x])
    assert np.array_equal(np.array(t_out), np.array(ops.quantized_matmul(x, packed, PACKED[t])))
    xs = mx.array(rng.standard_normal((4, 2, k)).astype(np.float32))
    mapped = mx.vmap(lambda v: ops.quantized_matmul(v, packed, PACKED[t]))(xs)
    assert np.array_equal(np.array(mapped), np.array(ops.quantized_matmul(xs, packed, PACKED[t])))
    f = mx.compile(lambda v: ops.quantized_matmul(v, packed, PACKED[t]), shapeless=True)
    for m in (1, 5):
        v = mx.array(rng.standard_normal((m, k)).astype(np.float32))
        assert np.array_equal(np.array(f(v)), np.array(ops.quantized_matmul(v, packed, PACKED[t])))
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
    q4_1 = GGMLLinear(GGMLTensor(mx.array(reference.random_blocks(rng, "Q4_1", n, k)), GGMLType.Q4_1, (n, k)))
    odd = GGMLLinear(GGMLTensor(q4k(rng, 12, k)[0], GGMLType.Q4_K, (12, k)))
    assert not q4_1.pack_rows() and not odd.pack_rows() and not q4_1.packed and not odd.packed


def test_the_embedding_packs_a_copy_for_the_head(on_cpu):
    from mlx_ggml_ext.nn import GGMLEmbedding
    rng = np.random.default_rng(12)
    n, k = 64, 512
    blocks, dense = blocks_of(rng, "Q6_K", n, k)
    table = GGMLEmbedding(GGMLTensor(blocks, GGMLType.Q6_K, (n, k)), precise_x=True)
    x = mx.array(rng.standard_normal((3, k)).astype(np.float32))
    ids = mx.array([0, 5, 63])
    plain_head, plain_rows = table.as_linear(x), table(ids)
    assert table.pack_rows() and table.packed and not table.pack_rows()
    assert "packed_head=True" in repr(table)
    assert rel_max(to_numpy(table.as_linear(x)), to_numpy(plain_head)) <= PLAIN_AGREEMENT
    assert np.array_equal(np.array(table(ids)), np.array(plain_rows))  # lookups read the blocks
    assert np.array_equal(np.array(table.weight), np.array(blocks))
    assert not table.unfreeze().trainable_parameters()


@pytest.mark.parametrize("call, exc, match", [
    (lambda b, p: ops.pack_rows(b, "Q4_1"), ValueError, "packs Q4_K, Q6_K, Q4_0, IQ4_NL, Q5_0 and Q8_0 rows only"),
    (lambda b, p: ops.pack_rows(b, "Q6_K"), ValueError, "210-byte blocks"),  # Q4_K's bytes, called Q6_K
    (lambda b, p: ops.pack_rows(b, "Q8_0"), ValueError, "34-byte blocks"),
    (lambda b, p: ops.unpack_rows(p, "Q4_K"), ValueError, "unpacks Q4_K_R8, Q6_K_R8, Q4_0_R8, IQ4_NL_R8, Q5_0_R8 and Q8_0_R8"),
    (lambda b, p: ops.pack_rows(p, "Q4_K_R8"), ValueError, "already packed"),
    (lambda b, p: ops.pack_rows(b[:12], "Q4_K"), ValueError, "multiple of 8"),
    (lambda b, p: ops.pack_rows(b[:, :100], "Q4_K"), ValueError, "144-byte blocks"),
    (lambda b, p: ops.pack_rows(b.astype(mx.float32), "Q4_K"), TypeError, "uint8"),
    (lambda b, p: ops.pack_rows(b, None), TypeError, "ggml_type"),
    (lambda b, p: ops.unpack_rows(b[:, :148 * 2]), ValueError, "148-byte blocks"),
    # (on the CPU stream: on a GPU one the refusal of the layout comes first, test_gpu_refuses_the_packed_layout)
    (lambda b, p: ops.quantized_matmul(mx.zeros((1, 512)), p[:12], "Q4_K_R8", stream=mx.cpu), ValueError,
     "multiple of 8 rows"),
    (lambda b, p: ops.quantized_matmul(mx.zeros((1, 256)), p, "Q4_K_R8", stream=mx.cpu), ValueError,
     "needs blocks of shape"),
    # the other ops would read the packed bytes as rows: they refuse the type (the C++ check, under ops' own)
    (lambda b, p: _ext.mul_mat(p, ops.Q4_K_R8, [16, 512], mx.zeros((1, 512))), ValueError, "mul_mat.*Q4_K_R8"),
    (lambda b, p: _ext.dequantize(p, ops.Q4_K_R8, [16, 512]), ValueError, "dequantize.*Q4_K_R8"),
    (lambda b, p: _ext.mul_mat(p, ops.Q4_K_R8, [16, 512], mx.zeros((1, 512))), ValueError, "quantized_matmul and "
     "mul_mat_id only"),  # (mul_mat_id reads packed experts: test_packed_experts.py)
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


def test_models_load_packs_q4k_matrices_and_changes_no_logit(on_cpu, cpu_isa, tmp_path):
    """models.load(pack_rows=True) packs the types with a SIMD kernel for packed rows on the CPU variant in use
    (models.PACKED_SIMD_TYPES: every packable type on AVX-512, Q4_K on AVX2, none on the baseline), the tied head's
    table included; the logits agree with the unpacked model's."""
    from mlx_ggml_ext.nn import GGMLEmbedding
    m = ref.TINY_MODELS["llama3"]  # a tied head
    path = str(tmp_path / "llama.gguf")
    ref.write_model(path, m, matrix_types=[gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K,
                                           gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q8_0,
                                           gguf.GGMLQuantizationType.Q4_0])  # (gguf has no IQ4_NL quantizer)
    packed_model, _ = models.load(path, tokenizer=False, pack_rows=True)
    plain_model, _ = models.load(path, tokenizer=False, pack_rows=False)
    types = set(models.PACKED_SIMD_TYPES.get(cpu_isa, ()))
    layers = [mod for mod in packed_model.modules() if isinstance(mod, GGMLLinear)]
    assert {layer.ggml_type for layer in layers if layer.packed} == types & {layer.ggml_type for layer in layers}
    assert all(layer.packed == (layer.ggml_type in types and layer.output_dims % 8 == 0) for layer in layers)
    tables = [mod for mod in packed_model.modules() if isinstance(mod, GGMLEmbedding)]
    assert len(tables) == 1 and tables[0].ggml_type == GGMLType.Q6_K
    assert tables[0].packed == (GGMLType.Q6_K in types)  # the tied head's copy
    assert not any(mod.packed for mod in plain_model.modules() if isinstance(mod, (GGMLLinear, GGMLEmbedding)))
    tokens = mx.array(np.random.default_rng(1).integers(0, 320, 12))[None]
    got, expected = np.array(packed_model(tokens)), np.array(plain_model(tokens))
    # Each product agrees to float32 rounding (above), but a last-bit difference can move one of the next layer's
    # activations across an int8 rounding boundary: a few 1e-3 at most through the model (measured 2e-6 to 1.5e-3
    # over six files of this shape).
    assert rel_max(got, expected) <= 5e-3
    assert np.array_equal(got.argmax(-1), expected.argmax(-1))


def test_load_default_follows_the_environment(monkeypatch):
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "1")
    assert models.packs_rows_by_default()
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "0")
    assert not models.packs_rows_by_default()
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "yes")
    with pytest.raises(ValueError, match="MLX_GGML_EXT_PACK_ROWS"):
        models.packs_rows_by_default()


def test_load_packs_by_default_only_what_fits_in_memory(on_cpu, cpu_isa, monkeypatch, tmp_path):
    """Left to itself, load packs only if the packed copies fit in the memory available less the reserve: with a
    byte too little it keeps the file's blocks and warns, with just enough (or where the memory is unknown) it
    packs; asked for (pack_rows=True or MLX_GGML_EXT_PACK_ROWS=1), it packs regardless."""
    path = str(tmp_path / "llama.gguf")
    ref.write_model(path, ref.TINY_MODELS["llama3"], matrix_types=[gguf.GGMLQuantizationType.Q4_K])
    monkeypatch.setitem(models.PACKED_SIMD_TYPES, cpu_isa, (GGMLType.Q4_K,))  # any CPU variant (portable: slower)
    monkeypatch.setattr(models, "packs_rows_by_default", lambda: True)
    monkeypatch.delenv("MLX_GGML_EXT_PACK_ROWS", raising=False)

    def q4k_layers(model):
        layers = [m for m in model.modules() if isinstance(m, GGMLLinear) and m.ggml_type == GGMLType.Q4_K]
        assert layers
        return layers

    plain, _ = models.load(path, tokenizer=False, pack_rows=False)
    needed = sum(layer.pack_rows_bytes() for layer in q4k_layers(plain))
    # Q4_K_R8 is 148 bytes per 256 elements, the blocks 144
    assert needed == sum(layer.weight.nbytes // 144 * 148 for layer in q4k_layers(plain) if layer.output_dims % 8 == 0) > 0

    def load_with(memory, **kwargs):
        monkeypatch.setattr(models, "available_memory", lambda: memory)
        model, _ = models.load(path, tokenizer=False, **kwargs)
        return {layer.packed for layer in q4k_layers(model) if layer.output_dims % 8 == 0}

    with pytest.warns(RuntimeWarning, match="rows not packed for the CPU.*pack_rows=True"):
        assert load_with(models.PACKING_RESERVE_BYTES + needed - 1) == {False}
    assert load_with(models.PACKING_RESERVE_BYTES + needed) == {True}
    assert load_with(None) == {True}
    assert load_with(0, pack_rows=True) == {True}
    monkeypatch.setenv("MLX_GGML_EXT_PACK_ROWS", "1")
    assert load_with(0) == {True}


def test_available_memory_reads_the_system():
    memory = models.available_memory()
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as meminfo:
            total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
        assert isinstance(memory, int) and 0 < memory <= total
    else:
        assert memory is None or memory > 0


def mapping_of(address):
    """(start, end, VmFlags) of this process's mapping that holds `address` (/proc/self/smaps), or None."""
    found = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and ":" not in first:  # a mapping's first line: "start-end perms ..."
                start, end = (int(v, 16) for v in first.split("-"))
                found = (start, end) if start <= address < end else None
            elif found and line.startswith("VmFlags:"):
                return (*found, line.split()[1:])
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's memory advice (no /proc/self/smaps)")
def test_large_packed_copies_ask_for_huge_pages():
    # From 2 MB the copy's pages are advised MADV_HUGEPAGE before they are written (VmFlags "hg"); in the CPU-only
    # build it is a mapping of its own starting on a 2 MB boundary, unmapped once no array holds it.
    blocks, _ = blocks_of(np.random.default_rng(11), "Q4_0", 1024, 4096)  # 2.36 MB
    packed = ops.pack_rows(blocks, "Q4_0")
    assert np.array_equal(to_numpy(ops.unpack_rows(packed, "Q4_0_R8")), to_numpy(blocks))
    address = np.asarray(memoryview(packed)).ctypes.data
    start, end, flags = mapping_of(address)
    assert "hg" in flags, (hex(start), hex(end), flags)
    if _ext.gpu_backend() == "cpu":
        assert address % (2 << 20) == 0 and end - address >= packed.nbytes
        del packed
        mx.clear_cache()
        assert mapping_of(address) is None or mapping_of(address)[:2] != (start, end)
