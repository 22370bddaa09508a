"""Projections of one x stacked into one product at load (mlx_ggml_ext/models/projections.py): which layers stack,
the model's logits against the float64 forward pass and against the unstacked model, the KV cache through the
slices, and mlx-lm's LoRA conversion of a slice."""

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import model_reference as ref
from mlx_ggml_ext import models
from mlx_ggml_ext.models.projections import ProjectionSlice
from test_models import TOKENS, _cached_logits, _logits, _rel_max, _use_float_products

pytest.importorskip("mlx_lm")
Q = gguf.GGMLQuantizationType
# Per layer the matrices are written q, k, v, output, gate, up, down: a Q4_K_M-like mix (q and k, gate and up of
# one type, v and down of others) and a file of one type.
MIXED = [Q.Q4_0, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q4_0, Q.Q4_0, Q.Q6_K]
CASES = {"llama-mixed": ("llama", MIXED, ["q_proj", "k_proj"]),
         "qwen2-q8_0": ("qwen2", [Q.Q8_0], ["q_proj", "k_proj", "v_proj"])}  # qwen2: q/k/v biases stack too


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    made = {}
    for key, (arch, types, _) in CASES.items():
        m = ref.TINY_MODELS[arch]
        path = str(tmp_path_factory.mktemp("stacked") / f"{key}.gguf")
        ref.write_model(path, m, matrix_types=types)
        made[key] = (path, m, ref.read_weights(path))
    return made


@pytest.mark.parametrize("key", list(CASES))
def test_stacked_layers_and_logits(key, files):
    path, m, W = files[key]
    model, _ = models.load(path, tokenizer=False)
    _, _, sliced = CASES[key]
    for layer in model.layers:
        attention = layer.self_attn
        assert [n for n in ("q_proj", "k_proj", "v_proj") if isinstance(attention[n], ProjectionSlice)] == sliced
        assert attention.fused_proj.output_dims == sum(attention[n].output_dims for n in sliced)
        assert "gate_up_proj" in layer.mlp and "gate_proj" not in layer.mlp
    got = _logits(model, TOKENS)
    # The kernels' int8 rounding of x, as test_models.test_logits_through_the_kernels bounds it.
    expected = ref.forward(W, m, TOKENS)
    assert _rel_max(got, expected) < 4e-2
    assert np.sum((got - expected) ** 2) / np.sum(expected ** 2) < 1e-3
    # Each output is the same dot product of the same row as without stacking.
    bound = 1e-5 if mx.default_device() == mx.cpu else 2e-3
    assert _rel_max(got, _logits(models.load(path, tokenizer=False, stack_projections=False)[0], TOKENS)) < bound
    # The stacked q and k (and v where it stacks) go through ops.rope_qkv (models/qkv_attention.py).
    assert all(layer.self_attn._rope_qkv_plan[2] == ("v_proj" in sliced) for layer in model.layers)


def test_kv_cache_through_the_slices(files, monkeypatch):
    """One token at a time after a prefill: every call hands each slice its columns of that call's product."""
    _use_float_products(monkeypatch)
    path, m, W = files["llama-mixed"]
    model, _ = models.load(path, tokenizer=False)
    bound = 1e-5 if mx.default_device() == mx.cpu else 2e-3
    assert _rel_max(_cached_logits(model, TOKENS, 5), ref.forward(W, m, TOKENS)) < bound
    for layer in model.layers:  # nothing of the last call is held
        assert layer.self_attn.q_proj._product.x is None


def test_lora_takes_a_slice_out_of_its_stack(files):
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    path, _, _ = files["qwen2-q8_0"]
    model, _ = models.load(path, tokenizer=False)
    before = _logits(model, TOKENS)
    model.freeze()
    linear_to_lora_layers(model, 2, {"rank": 4, "scale": 4.0, "dropout": 0.0,
                                     "keys": ["self_attn.q_proj", "self_attn.v_proj"]})
    attention = model.layers[0].self_attn
    assert type(attention.q_proj).__name__ == "LoRALinear" and isinstance(attention.k_proj, ProjectionSlice)
    assert all("lora_" in name for name, _ in tree_flatten(model.trainable_parameters()))
    # LoRA's second matrix starts at zero: the same logits, with q and v now computed alone
    assert _rel_max(_logits(model, TOKENS), before) < 1e-5
    assert attention.k_proj._product.x is None  # k, the one slice still reading the stack, released it


def test_slices_read_the_product_module_in_place_now(files):
    """A stacked product replaced after load (update_modules, as MLX's nn.quantize does) is the one the slices
    read: here a float Linear of twice the stacked weight gives twice each slice's columns."""
    path, _, _ = files["llama-mixed"]
    model, _ = models.load(path, tokenizer=False)
    attention = model.layers[0].self_attn
    x = mx.random.normal((1, 3, attention.fused_proj.input_dims), key=mx.random.key(4))
    before = [np.array(attention[n](x)) for n in ("q_proj", "k_proj")]
    doubled = nn.Linear(attention.fused_proj.input_dims, attention.fused_proj.output_dims, bias=False)
    doubled.weight = 2 * attention.fused_proj.tensor.dequantize(mx.float32)
    attention.update_modules({"fused_proj": doubled})
    for name, old in zip(("q_proj", "k_proj"), before):
        # the stacked x is rounded to int8 blocks in the old product, not in the float one: about 1% apart
        np.testing.assert_allclose(np.array(attention[name](x)), 2 * old, rtol=0, atol=0.05 * np.abs(2 * old).max())
