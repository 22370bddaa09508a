"""Experts (mul_mat_id's (E, N, K) weights) with their rows packed for the CPU: GGMLSwitchLinear.pack_rows packs
each expert's rows in groups of 8, mul_mat_id reads them (per expert the packed product), and the results agree
with float64 math on gguf's decoding and with the plain experts; the gradient in x too; the GPU refuses them; and
models.load packs a mixture-of-experts model's experts without changing its answer."""

import mlx.core as mx
import numpy as np
import pytest

import model_reference as ref
from harness import nmse, to_numpy
from mlx_ggml_ext import GGMLTensor, GGMLType, _ext, models
from mlx_ggml_ext.nn import GGMLSwitchLinear
from test_packed_rows import PACKED, PLAIN_AGREEMENT, QUANT_NMSE, blocks_of, on_cpu, rel_max  # noqa: F401

gguf = pytest.importorskip("gguf")


def experts(t, E, N, K, seed):
    """(plain layer, packed layer, the experts as float64 (E, N, K)) of random blocks of type t."""
    blocks, dense = blocks_of(np.random.default_rng(seed), t, E * N, K)
    tensor = GGMLTensor(blocks, GGMLType[t], (E, N, K))
    plain, packed = GGMLSwitchLinear(tensor), GGMLSwitchLinear(tensor)
    assert packed.pack_rows() and packed.packed and not packed.pack_rows() and not plain.packed
    return plain, packed, dense.reshape(E, N, K)


def float64_experts(dense, x, ids):
    x = to_numpy(x)
    return np.stack([np.stack([dense[e] @ x[t, s if x.shape[1] > 1 else 0] for s, e in enumerate(row)])
                     for t, row in enumerate(np.array(ids))])


# T = 1 with one slot: the decode path, an expert of one row cut into slices over the threads (72 rows: slices
# rounded up to whole groups of 8); more tokens: the experts' rows gathered, one product per expert.
@pytest.mark.parametrize("t", list(PACKED))
@pytest.mark.parametrize("T, used, slots, N", [(1, 1, 1, 72), (1, 3, 1, 64), (4, 2, 2, 64), (33, 3, 1, 64)])
def test_packed_experts_match_float64_and_the_plain_ones(on_cpu, cpu_isa, t, T, used, slots, N):
    E, K = 6, 512
    plain, packed, dense = experts(t, E, N, K, seed=T + N)
    rng = np.random.default_rng(T)
    x = mx.array(rng.standard_normal((T, slots, K)).astype(np.float32))
    ids = mx.array(np.stack([rng.choice(E, used, replace=False) for _ in range(T)]).astype(np.int32))
    got = packed.product(x, ids)
    assert got.shape == (T, used, N)
    assert nmse(to_numpy(got), float64_experts(dense, x, ids)) <= QUANT_NMSE, cpu_isa
    assert rel_max(to_numpy(got), to_numpy(plain.product(x, ids))) <= PLAIN_AGREEMENT, cpu_isa
    # x's gradient (the transposed product unpacks each block): the plain experts' gradient
    loss = lambda layer: lambda x: (layer.product(x, ids) ** 2).sum()  # noqa: E731
    assert rel_max(to_numpy(mx.grad(loss(packed))(x)), to_numpy(mx.grad(loss(plain))(x))) <= 1e-5, cpu_isa


def test_the_experts_unpack_and_refuse_bad_shapes(on_cpu):
    plain, packed, _ = experts("Q4_K", 4, 16, 512, seed=5)
    assert np.array_equal(np.array(packed.tensor.data), np.array(plain.tensor.data))  # bit for bit
    assert "packed_rows=True" in repr(packed)
    x, ids = mx.zeros((1, 1, 512)), mx.zeros((1, 1), mx.int32)
    # groups of 8 rows cannot be split: 4 experts of 16 rows read as 8 experts of 8 is fine, 16 of 4 is not
    with pytest.raises(ValueError, match="multiple of 8 rows"):
        mx.eval(_ext.mul_mat_id(packed["weight"], packed.kernel_type, [16, 4, 512], x, ids))
    odd = GGMLSwitchLinear(GGMLTensor(blocks_of(np.random.default_rng(6), "Q4_K", 4 * 12, 512)[0], GGMLType.Q4_K,
                                      (4, 12, 512)))
    assert not odd.pack_rows() and not odd.packed  # 12 rows an expert: left as blocks


def test_gpu_refuses_packed_experts(device):
    _, packed, _ = experts("Q4_K", 2, 8, 256, seed=7)
    if device == mx.cpu:
        assert mx.default_device() == mx.cpu
        return
    with pytest.raises(NotImplementedError, match="CPU layout"):
        mx.eval(_ext.mul_mat_id(packed["weight"], packed.kernel_type, [2, 8, 256], mx.zeros((1, 1, 256)),
                                mx.zeros((1, 1), mx.int32), stream=mx.gpu))


@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral"])
def test_models_load_packs_the_experts_and_keeps_the_answer(on_cpu, cpu_isa, tmp_path, arch):
    m = ref.TINY_MODELS[arch]
    path = str(tmp_path / f"{arch}.gguf")
    ref.write_model(path, m)  # test_models.py's files: its types cycled through the matrices, the experts' too
    packed_model, _ = models.load(path, tokenizer=False, pack_rows=True)
    plain_model, _ = models.load(path, tokenizer=False, pack_rows=False)
    types = set(models.PACKED_SIMD_TYPES.get(cpu_isa, ()))
    switches = [mod for mod in packed_model.modules() if isinstance(mod, GGMLSwitchLinear)]
    assert switches and all(s.packed == (s.ggml_type in types) for s in switches)
    assert any(s.packed for s in switches) == bool(types & {s.ggml_type for s in switches})
    tokens = np.random.default_rng(1).integers(0, 320, 12)
    expected = ref.forward(ref.read_weights(path), m, tokens)  # float64, from the model's math
    # As test_models.py's logits through the kernels (x rounded to int8 per 32 elements): a last-bit difference
    # between the packed and plain products can flip an int8 rounding and, through a router, an expert choice, so
    # the packed model is held to the float64 forward pass, with the plain one's bounds.
    for model in (packed_model, plain_model):
        got = np.array(model(mx.array(tokens)[None])[0]).astype(np.float64)
        assert rel_max(got, expected) < 4e-2
        assert nmse(got, expected) < 1e-3
