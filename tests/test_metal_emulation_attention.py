"""kernels/metal/attention.metal run in the project's Metal emulator (tests/metal_emu; see
tests/test_metal_emulation.py's docstring) with the launch plans csrc/backend/metal encodes (launch_plans.h's
plan_attention, through the emulator's planner), against the float64 reference of test_attention.py: decode
with the keys split between threadgroups and combined, prefill with a causal KV-cache offset, GQA, additive
and boolean masks (as the op hands them over: float32 0 / -inf) broadcast over batch and heads, a row that sees
no key, softcap, sinks (per head, and per batch as vmap gives them), 16-bit inputs, strided views, head dims
of every kernel (up to 128, 256, 512) and Dv != D. Nothing here ran on Apple hardware."""
import json
import sys

import numpy as np
import pytest

from metal_emu import emulator as emu
from metal_emu.emulator import DTYPES
from test_attention import reference

pytestmark = [
    pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the Metal emulator is for Linux CI (ucontext fibers, guard pages); on a Mac run "
                              "the kernel itself: MLX_GGML_EXT_DEVICE=gpu pytest -q tests/test_attention.py"),
]

# Relative to the largest output, as the CUDA kernel's emulation (test_cuda_emulation_attention.py): inputs that
# the dtype holds exactly, float32 math, one rounding of the output.
TOL = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}


@pytest.fixture(scope="module")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu_attention"), [emu.METAL_DIR / "attention.metal"])


def stored(rng, shape, dtype):
    """Random values in `dtype`'s storage, and the float64 values they hold."""
    storage, to_storage, to_f32 = DTYPES[dtype]
    s = to_storage(rng.standard_normal(shape))
    return s, to_f32(s.reshape(-1).view(np.uint8)).reshape(shape).astype(np.float64)


def view(rng, shape, dtype, step=1, extra_tokens=0):
    """A (B, H, T, D) view of a larger stored array (a KV cache's slice: `extra_tokens` more rows, starting at
    row 2 when there are, and element stride `step`): (the buffer from the view's first element, its element
    strides, the float64 values of the view)."""
    b, h, t, d = shape
    base, base64 = stored(rng, (b, h, t + extra_tokens, d * step), dtype)
    first = 2 if extra_tokens else 0
    strides = [s // base.itemsize for s in base.strides]
    strides[3] *= step
    return base.reshape(-1)[first * strides[2]:], strides, base64[:, :, first:first + t, ::step]


def csv(values):
    return ",".join(str(int(x)) for x in values)


def run(metal, dtype, shape, *, scale, step=1, extra_tokens=0, mask=None, causal=False, softcap=0.0, sinks=None,
        seed=0, traffic=False):
    """Stores random q, k, v in `dtype` (views with element stride `step`; k and v of a larger cache), dispatches csrc/backend/metal's plan for
    the Attention primitive (the main kernel, then the combine when the keys are split) and returns
    (y as float64, expected float64, plan); with `traffic`, plan["traffic"] holds the main dispatch's load
    figures per buffer (tests/metal_emu/traffic.h)."""
    b, hq, hk, tq, tk, d, dv = shape
    rng = np.random.default_rng(seed)
    qb, qs, q = view(rng, (b, hq, tq, d), dtype, step)
    kb, ks, k = view(rng, (b, hk, tk, d), dtype, step, extra_tokens)
    vb, vs, v = view(rng, (b, hk, tk, dv), dtype, step, extra_tokens)
    fields = dict(dtype=dtype, batch=b, q_heads=hq, kv_heads=hk, q_len=tq, kv_len=tk, head_dim=d, v_dim=dv,
                  q_strides=csv(qs), k_strides=csv(ks), v_strides=csv(vs), has_mask=int(mask is not None),
                  has_sinks=int(sinks is not None), scale=float(scale), softcap=float(softcap), causal=int(causal))
    buffers = {0: qb, 1: kb, 2: vb, 3: qb, 4: qb, 6: qb}  # the glue binds q where an input is absent
    if mask is not None:  # float32, row-contiguous, 4-D with each axis 1 or full (csrc/attention.cpp's kernel_mask)
        m = np.ascontiguousarray(mask, np.float32).reshape((1,) * (4 - mask.ndim) + mask.shape)
        fields["mask_strides"] = csv(0 if m.shape[i] == 1 else m.strides[i] // 4 for i in range(4))
        buffers[3] = m
    if sinks is not None:
        sinks = np.asarray(sinks, np.float32)
        fields["sinks_batch_stride"] = hq if sinks.ndim == 2 else 0
        buffers[4] = sinks
    plan = metal.plan("attention", **fields)
    itemsize = np.dtype(DTYPES[dtype][0]).itemsize
    buffers[5] = np.full(b * hq * tq * dv * itemsize, 0xFF, np.uint8)  # NaN bytes: every element must be written
    if plan["combine"] is not None:
        buffers[6] = np.full(plan["partials_bytes"], 0xA5, np.uint8)  # the main kernel writes what combine reads
    out = metal.dispatch_plan(plan, buffers, args_index=7, seed=seed, traffic=traffic)
    plan["traffic"] = metal.traffic
    if plan["combine"] is not None:
        combine = dict(plan["combine"], args=bytes.fromhex(plan["combine"]["args"]))
        out = metal.dispatch_plan(combine, {4: buffers[4], 5: out[5], 6: out[6]}, args_index=7, seed=seed)
    y = DTYPES[dtype][2](out[5]).reshape(b, hq, tq, dv).astype(np.float64)
    s64 = None if sinks is None else sinks.astype(np.float64)
    if s64 is not None and s64.ndim == 2:  # per-batch sinks: each batch against its own row
        expected = np.concatenate([reference(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                                             None if mask is None else np.broadcast_to(mask, (b, hq, tq, tk))[i:i + 1],
                                             scale, softcap, causal, s64[i]) for i in range(b)])
    else:
        expected = reference(q, k, v, mask, scale, softcap, causal, s64)
    return y, expected, plan


def check(got, expected, dtype, what=""):
    err = float(np.max(np.abs(got - expected)))
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3e} > {TOL[dtype]:.1e} * {scale:.3e}"


def splits(plan):
    return plan["groups"][0]


CASES = {  # name: ((B, Hq, Hk, Tq, Tk, D, Dv), element stride of q, k and v, extra cache rows around k and v)
    "decode_gqa": ((1, 4, 2, 1, 300, 64, 64), 1, 5),      # keys split between threadgroups, then combined
    "prefill": ((1, 4, 2, 19, 45, 40, 40), 1, 0),         # 3 query blocks of 8, the last partial; KV offset 26
    "d80_strided_dv": ((1, 3, 1, 5, 37, 80, 24), 2, 3),   # D 80 (two chunks, the second partial), Dv != D
    "d256": ((1, 2, 1, 3, 40, 256, 96), 1, 0),            # the 256 kernel
    "d512_many_heads": ((1, 10, 1, 1, 70, 320, 16), 1, 0),  # the 512 kernel (8 rows): the group in 2 head chunks
}


def causal_sinks(rng, shape):
    sinks = rng.standard_normal(shape[1]) * 2
    sinks[0] = 8.0  # a sink above every score of head 0's rows
    return dict(causal=True, sinks=sinks)


def additive_softcap(rng, shape):
    b, hq, hk, tq, tk, d, dv = shape
    mask = rng.standard_normal((b, 1, tq, tk))  # broadcast over the heads
    mask[rng.random(mask.shape) < 0.2] = -np.inf
    mask[0, 0, tq - 1] = -np.inf  # a row that sees no key: zeros
    return dict(mask=mask, softcap=2.0)


VARIANTS = {"causal_sinks": causal_sinks, "additive_softcap": additive_softcap}
PARAMS = [(c, "f32", v) for c in CASES for v in VARIANTS] + [("decode_gqa", "f16", "causal_sinks"),
                                                             ("prefill", "bf16", "additive_softcap")]


@pytest.mark.parametrize("case, dtype, variant", PARAMS)
def test_attention_matches_float64(metal, case, dtype, variant):
    shape, step, extra = CASES[case]
    rng = np.random.default_rng(len(case) + len(variant))
    options = VARIANTS[variant](rng, shape)
    scale = 4.0 / np.sqrt(shape[5]) if variant == "additive_softcap" else 1.0 / np.sqrt(shape[5])
    y, expected, plan = run(metal, dtype, shape, scale=scale, step=step, extra_tokens=extra, seed=shape[4],
                            **options)
    assert plan["kernel"] == f"attention_d{128 if max(shape[5:]) <= 128 else 256 if max(shape[5:]) <= 256 else 512}_{dtype}"
    if case == "decode_gqa":
        assert splits(plan) > 1 and plan["combine"] is not None, "decode over a long cache splits the keys"
    if variant == "additive_softcap":
        assert np.all(y[0, :, shape[3] - 1] == 0), "a row that sees no key gives zeros"
    check(y, expected, dtype, f"{case} {dtype} {variant}")


def test_boolean_mask_per_head_and_batch_sinks(metal):
    """A boolean mask as the op passes it (True keeps: 0, False: -inf, float32) of shape (Tq, Tk), broadcast over
    batch and heads, a per-head additive mask (1, Hq, Tq, Tk), and per-batch sinks (B, Hq) as vmap makes them;
    two batches, decode split into several key ranges."""
    rng = np.random.default_rng(7)
    shape = (2, 4, 1, 2, 200, 32, 32)
    keep = rng.random((2, 200)) < 0.7
    keep[1] = False  # the second query sees nothing: zeros even with sinks
    bool_mask = np.where(keep, 0.0, -np.inf)
    sinks = rng.standard_normal((2, 4))
    y, expected, plan = run(metal, "f32", shape, scale=0.3, mask=bool_mask, sinks=sinks, seed=3)
    assert splits(plan) > 1
    assert np.all(y[:, :, 1] == 0)
    check(y, expected, "f32", "boolean mask, per-batch sinks")
    head_mask = rng.standard_normal((1, 4, 2, 200))
    y, expected, _ = run(metal, "f32", shape, scale=0.3, mask=head_mask, seed=4)
    check(y, expected, "f32", "per-head mask")


def test_more_queries_than_keys_with_sinks_gives_zeros(metal):
    """Causal with Tq > Tk: the first rows see no key; with a sink they still give zeros (as ggml)."""
    y, expected, _ = run(metal, "f32", (1, 2, 1, 6, 4, 16, 16), scale=0.25, causal=True, sinks=[0.5, -1.0], seed=5)
    assert np.all(y[:, :, :2] == 0) and np.all(expected[:, :, :2] == 0)
    check(y, expected, "f32", "Tq > Tk")


def test_every_kernel_the_glue_asks_for_exists(metal):
    """The host names plan_attention gives for every dtype and head-dim class exist in attention.metal; past
    kAttentionMaxHeadDim there is no plan (eval_gpu raises; the op refuses such shapes when the graph is built)."""
    for dtype in DTYPES:
        for d, dv, expected in ((64, 128, 128), (129, 8, 256), (512, 300, 512)):
            plan = metal.plan("attention", dtype=dtype, batch=1, q_heads=2, kv_heads=1, q_len=1, kv_len=4096,
                              head_dim=d, v_dim=dv, q_strides="1,1,1,1", k_strides="1,1,1,1", v_strides="1,1,1,1",
                              has_mask=0, has_sinks=0, scale=1.0, softcap=0.0, causal=0)
            assert plan["kernel"] == f"attention_d{expected}_{dtype}" and plan["kernel"] in metal.kernels
            assert plan["combine"]["kernel"] == f"attention_combine_{dtype}" in metal.kernels
    plan = metal.plan("attention", dtype="f32", batch=1, q_heads=1, kv_heads=1, q_len=1, kv_len=4, head_dim=513,
                      v_dim=8, q_strides="1,1,1,1", k_strides="1,1,1,1", v_strides="1,1,1,1", has_mask=0,
                      has_sinks=0, scale=1.0, softcap=0.0, causal=0)
    assert plan["kernel"] == ""


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_decode_traffic(metal, dtype):
    """Decode over 256 keys (GQA 4:1, D 64): the keys and values are requested once, in whole 128-byte lines, by
    coalesced loads (4-element vectors: a float16 row by 2-byte elements would request each line twice)."""
    shape = (1, 4, 1, 1, 256, 64, 64)
    y, expected, plan = run(metal, dtype, shape, scale=0.125, seed=9, traffic=True)
    check(y, expected, dtype, f"decode {dtype}")
    kv_bytes = 256 * 64 * np.dtype(DTYPES[dtype][0]).itemsize
    for index in (1, 2):  # k, v
        t = plan["traffic"][index]
        figures = {"kernel": plan["kernel"], "buffer": "kv"[index - 1], "bytes_per_byte": t["lines"] * 128 / kv_bytes,
                   "coalesced_share": t["coalesced"] / t["instructions"], "threadgroup_bytes": plan["threadgroup_bytes"]}
        print(json.dumps(figures))
        assert figures["bytes_per_byte"] == 1.0 and figures["coalesced_share"] == 1.0, figures
