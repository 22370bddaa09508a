"""kernels/cuda/attention.cu run on the host (tests/cuda_emulation, as test_cuda_emulation.py) against the float64
reference of test_attention.py: decode with the keys split between blocks and combined, a small prefill, GQA,
causal and additive masks, a row that sees no key, softcap, sinks, 16-bit inputs, strided and odd head dims."""
import ctypes

import numpy as np
import pytest

from test_cuda_emulation import BF16, F16, F32, kernels, loaded, ptr, stored  # noqa: F401 (kernels: the fixture)
from test_attention import reference

TOL = {F32: 1e-5, F16: 1e-3, BF16: 8e-3}  # relative to the largest output: float32 math, one output rounding


class Tiling(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("heads_per_block", "queries_per_block", "head_chunks", "key_tile",
                                            "splits")] + \
               [("keys_per_split", ctypes.c_int64), ("k_vectors", ctypes.c_bool), ("v_vectors", ctypes.c_bool)]


class AttentionArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "y", "mask", "sinks", "workspace")] + \
               [(n, ctypes.c_int64 * 4) for n in ("q_strides", "k_strides", "v_strides", "mask_strides")] + \
               [(n, ctypes.c_int64) for n in ("sinks_batch_stride", "batch", "q_heads", "kv_heads", "q_len",
                                              "kv_len", "head_dim", "v_dim")] + \
               [("scale", ctypes.c_float), ("softcap", ctypes.c_float), ("causal", ctypes.c_bool),
                ("tiling", Tiling)]


def strides(a):
    return (ctypes.c_int64 * 4)(*(s // a.itemsize for s in a.strides))


def run(kernels, ftype, q, k, v, *, scale, mask=None, causal=False, softcap=0.0, sinks=None, dv=None):
    """Stores q, k, v (float64, k and v possibly strided views) as `ftype`, runs the plan; returns (y, tiling)."""
    def as_type(a):  # the view's strides kept: a strided float64 view becomes a strided view of the stored type
        base = a.base if a.base is not None else a
        stored_base = stored(base, ftype)
        offsets = np.array(a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 8
        view = np.lib.stride_tricks.as_strided(stored_base.reshape(-1)[int(offsets):], a.shape,
                                               [s // 8 * stored_base.itemsize for s in a.strides])
        return stored_base, view
    keep = []
    (qb, qs), (kb, ks), (vb, vs) = as_type(q), as_type(k), as_type(v)
    keep += [qb, kb, vb]
    b, hq, tq, d = q.shape
    y = np.zeros((b, hq, tq, v.shape[3]), stored(np.zeros(1), ftype).dtype)
    a = AttentionArgs(q=ptr(qs), k=ptr(ks), v=ptr(vs), y=ptr(y), q_strides=strides(qs), k_strides=strides(ks),
                      v_strides=strides(vs), batch=b, q_heads=hq, kv_heads=k.shape[1], q_len=tq, kv_len=k.shape[2],
                      head_dim=d, v_dim=v.shape[3], scale=scale, softcap=softcap, causal=causal)
    if mask is not None:
        m = np.ascontiguousarray(mask, np.float32).reshape((1,) * (4 - mask.ndim) + mask.shape)
        keep.append(m)
        a.mask = ptr(m)
        a.mask_strides = (ctypes.c_int64 * 4)(*(0 if m.shape[i] == 1 else m.strides[i] // 4 for i in range(4)))
    if sinks is not None:
        s = np.ascontiguousarray(sinks, np.float32)
        keep.append(s)
        a.sinks = ptr(s)
    assert kernels.emulated_attention(ctypes.byref(a), ftype) == 0
    return loaded(y, ftype), a.tiling


def inputs(rng, b, hq, hk, tq, tk, d, ftype, dv=None, step=1):
    """q, k, v as float64 values that `ftype` holds exactly; k and v are views with element stride `step`."""
    def exact(shape):
        return loaded(stored(rng.standard_normal(shape), ftype), ftype)
    q = exact((b, hq, tq, d))
    k = exact((b, hk, tk + 3, d * step))[:, :, 2:tk + 2, ::step]  # a slice of a larger cache
    v = exact((b, hk, tk, (dv or d) * step))[..., ::step]
    return q, k, v


def check(got, expected, ftype):
    err = np.max(np.abs(got - expected))
    scale = max(np.max(np.abs(expected)), 1e-30)
    assert err <= TOL[ftype] * scale, f"max error {err:.3e} > {TOL[ftype]:.1e} * {scale:.3e}"


CASES = {  # name: (B, Hq, Hk, Tq, Tk, D, Dv, step)
    "decode_gqa": (1, 4, 2, 1, 600, 64, 64, 1),
    "decode_few_queries": (2, 4, 1, 3, 300, 32, 32, 1),
    "prefill": (1, 4, 2, 40, 45, 40, 40, 1),          # two blocks of query positions, the second partial
    "odd_dims_strided": (1, 3, 1, 5, 37, 18, 10, 2),
    "many_heads_wide": (1, 20, 1, 2, 40, 260, 16, 1),  # D > 256: 16 rows a block, the group in two head chunks
}


VARIANTS = ["causal_sinks", "additive_softcap"]
# Every case in float32; the 16-bit types on a decode and a prefill (the emulation runs every thread: kept short).
PARAMS = [(c, F32, v) for c in CASES for v in VARIANTS] + \
         [("decode_gqa", F16, v) for v in VARIANTS] + [("prefill", BF16, "additive_softcap"),
                                                       ("decode_few_queries", BF16, "causal_sinks")]


@pytest.mark.parametrize("case, ftype, variant", PARAMS,
                         ids=lambda p: {F32: "f32", F16: "f16", BF16: "bf16"}.get(p, p) if isinstance(p, int) else p)
def test_attention_matches_float64(kernels, case, ftype, variant):
    b, hq, hk, tq, tk, d, dv, step = CASES[case]
    rng = np.random.default_rng(tk + tq + ftype)
    q, k, v = inputs(rng, b, hq, hk, tq, tk, d, ftype, dv, step)
    scale = 1.0 / np.sqrt(d)
    if variant == "causal_sinks":
        sinks = rng.standard_normal(hq) * 2
        sinks[0] = 8.0  # a sink above every score of head 0's rows
        y, tiling = run(kernels, ftype, q, k, v, scale=scale, causal=True, sinks=sinks)
        expected = reference(q, k, v, scale=scale, causal=True, sinks=sinks)
    else:
        mask = rng.standard_normal((b, 1, tq, tk))
        mask[rng.random(mask.shape) < 0.2] = -np.inf
        mask[0, 0, tq - 1] = -np.inf  # a row that sees no key: zeros
        y, tiling = run(kernels, ftype, 4 * q, k, v, scale=scale, mask=mask, softcap=2.0)
        expected = reference(4 * q, k, v, mask=mask, scale=scale, softcap=2.0)
        assert np.all(y[0, :, tq - 1] == 0)
    if tk >= 300:
        assert tiling.splits > 1, "decode over a long cache splits the keys between blocks"
    assert tiling.k_vectors == (step == 1 and d % 4 == 0)
    if case == "many_heads_wide":
        assert tiling.head_chunks == 2
    if case == "prefill":
        assert tiling.queries_per_block < tq
    check(y, expected, ftype)


def test_more_queries_than_keys_with_sinks_gives_zeros(kernels):
    """Causal with Tq > Tk: the first rows see no key; with a sink they still give zeros (as ggml)."""
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, 1, 2, 1, 6, 4, 16, F32)
    sinks = np.array([0.5, -1.0])
    y, _ = run(kernels, F32, q, k, v, scale=0.25, causal=True, sinks=sinks)
    expected = reference(q, k, v, scale=0.25, causal=True, sinks=sinks)
    assert np.all(y[:, :, :2] == 0) and np.all(expected[:, :, :2] == 0)
    check(y, expected, F32)
