"""mul_mat_id (ggml's ggml_mul_mat_id, the mixture-of-experts product) against float64 numpy on the experts as
gguf decodes them: several ggml types, broadcast x, gradients against finite differences, vmap, jvp, compile,
zero tokens and bad ids."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import GGMLTensor, GGMLType, num_threads, ops, reference, set_num_threads
from harness import nmse, to_numpy

gguf = pytest.importorskip("gguf")

QUANT_NMSE = 2e-4  # as test_matmul.py: x quantized to int8 per 32 elements meets the blocks (ggml's CPU scheme)
FLOAT_NMSE = {mx.float32: 1e-11, mx.float16: 2e-6, mx.bfloat16: 3e-5}


def experts(rng, t: GGMLType, E: int, N: int, K: int):
    """E experts (E, N, K) of random blocks and their float64 values as gguf decodes them."""
    data = reference.random_blocks(rng, t.name, E * N, K)
    if t.is_float:
        dense = to_numpy(ops.dequantize(mx.array(data), t, (E * N, K), mx.float32))
    else:
        dense = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
    return GGMLTensor(mx.array(data), t, (E, N, K)), dense.reshape(E, N, K)


def expected(dense, x, ids):
    """out[t, s] = W[ids[t, s]] @ x[t, s or 0] in float64."""
    x = np.asarray(x, np.float64)
    T, U = ids.shape
    out = np.zeros((T, U, dense.shape[1]))
    for t in range(T):
        for s in range(U):
            out[t, s] = dense[ids[t, s]] @ x[t, s if x.shape[1] > 1 else 0]
    return out


def random_ids(rng, T, U, E):
    """Distinct experts per token, as a top-k router chooses them."""
    return np.stack([rng.permutation(E)[:U] for _ in range(T)]).astype(np.int32)


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F16,
                               GGMLType.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("x_slots", ["per_slot", "broadcast"])
def test_matches_float64_per_token_and_expert(t, x_slots, cpu_isa):
    """T = 1 (decode: every expert one row, run in slices of its weight rows) and T = 9 (experts with several
    rows)."""
    rng = np.random.default_rng(int(t) + (x_slots == "broadcast"))
    E, N, K, U = 6, 40, 256, 3
    w, dense = experts(rng, t, E, N, K)
    for T in (1, 9):
        ids = random_ids(rng, T, U, E)
        x = rng.standard_normal((T, U if x_slots == "per_slot" else 1, K)).astype(np.float32)
        y = ops.mul_mat_id(w, mx.array(x), mx.array(ids))
        assert y.shape == (T, U, N) and y.dtype == mx.float32
        assert nmse(to_numpy(y), expected(dense, x, ids)) <= (FLOAT_NMSE[mx.float32] if t.is_float else QUANT_NMSE)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("used", [1, 2, 8])
def test_one_token_slices_cover_every_row(threads, used):
    """At one token the CPU cuts each expert's rows into as many slices as keep the threads busy (more slices for
    fewer experts); N = 37 leaves a partial last slice for most thread and expert counts. Every row must come out
    once, whatever the cut."""
    rng = np.random.default_rng(100 * threads + used)
    E, N, K = 8, 37, 128
    w, dense = experts(rng, GGMLType.Q4_0, E, N, K)
    ids = random_ids(rng, 1, used, E)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    before = num_threads()
    set_num_threads(threads)
    try:
        y = ops.mul_mat_id(w, mx.array(x), mx.array(ids))
        mx.eval(y)
    finally:
        set_num_threads(before)
    assert nmse(to_numpy(y), expected(dense, x, ids)) <= QUANT_NMSE


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_half_precision_x_and_a_float_weight_array(dtype):
    rng = np.random.default_rng(3)
    E, N, K, T, U = 4, 24, 64, 5, 2
    dense = rng.standard_normal((E, N, K)).astype(np.float32)
    ids = random_ids(rng, T, U, E)
    x = mx.array(rng.standard_normal((T, 1, K)).astype(np.float32)).astype(dtype)
    y = ops.mul_mat_id(mx.array(dense), x, mx.array(ids))
    assert y.dtype == dtype
    assert nmse(to_numpy(y), expected(dense.astype(np.float64), to_numpy(x), ids)) <= FLOAT_NMSE[dtype] + 1e-6


def test_experts_shared_by_many_tokens_and_unused_experts():
    """Prefill-like routing: every token on the same two experts (each expert's rows in one product) while the
    other experts get none, and ids repeated within a token."""
    rng = np.random.default_rng(5)
    w, dense = experts(rng, GGMLType.Q5_K, 8, 32, 512)
    ids = np.tile(np.array([[5, 2, 5]], np.int32), (40, 1))
    x = rng.standard_normal((40, 3, 512)).astype(np.float32)
    y = ops.mul_mat_id(w, mx.array(x), mx.array(ids))
    assert nmse(to_numpy(y), expected(dense, x, ids)) <= QUANT_NMSE


def test_zero_tokens_and_empty_rows():
    rng = np.random.default_rng(6)
    w, _ = experts(rng, GGMLType.Q8_0, 3, 16, 64)
    y = ops.mul_mat_id(w, mx.zeros((0, 1, 64)), mx.zeros((0, 2), mx.int32))
    assert y.shape == (0, 2, 16)
    mx.eval(y)
    y = ops.mul_mat_id(mx.zeros((3, 5, 0)), mx.ones((2, 1, 0)), mx.array([[0, 2], [1, 1]], mx.int32))
    np.testing.assert_array_equal(np.array(y), np.zeros((2, 2, 5)))


def test_bad_ids_raise_and_never_read_out_of_bounds():
    rng = np.random.default_rng(7)
    w, _ = experts(rng, GGMLType.Q4_0, 4, 8, 32)
    x = mx.ones((2, 1, 32))
    for bad in (4, -1, 1 << 30):
        ids = mx.array([[0, 1], [2, bad]], mx.int32)
        mx.eval(ids)
        with pytest.raises(ValueError, match=rf"ids\[1, 1\] = {bad} is not an expert index: there are E = 4"):
            ops.mul_mat_id(w, x, ids)
    # ids still lazy when the graph is built: on the CPU the evaluation fails with the same message, before any
    # weight read; on the GPU the op evaluates the ids itself and raises at the call
    lazy = mx.array([[0, 1], [2, 3]], mx.int32) + mx.array([[0, 0], [0, 5]], mx.int32)
    with pytest.raises(RuntimeError if mx.default_device() == mx.cpu else ValueError,
                       match=r"ids\[1, 1\] = 8 is not an expert index"):
        mx.eval(ops.mul_mat_id(w, x, lazy))
    # and the stream keeps working
    ok = ops.mul_mat_id(w, x, mx.array([[0, 1], [2, 3]], mx.int32) + 0)
    mx.eval(ok)


def test_unchecked_ids_stay_lazy_and_bad_ones_still_never_read_out_of_bounds(monkeypatch):
    """check_ids=False (what models.load's routers use): the same products for good ids, the ids never evaluated
    by the op; a bad lazy id still fails the CPU evaluation, and on a GPU gives its pair a NaN row, the other
    pairs right."""
    rng = np.random.default_rng(17)
    E, N, K, T, U = 5, 24, 64, 3, 2
    w, dense = experts(rng, GGMLType.Q8_0, E, N, K)
    ids = random_ids(rng, T, U, E)
    x = rng.standard_normal((T, 1, K)).astype(np.float32)
    evaluated = []
    monkeypatch.setattr(ops, "evaluate_ids_on_gpu", lambda *a, **k: evaluated.append(a))
    y = ops.mul_mat_id(w, mx.array(x), mx.array(ids) + 0, check_ids=False)
    assert evaluated == []
    checked = ops.mul_mat_id(w, mx.array(x), mx.array(ids) + 0)
    assert len(evaluated) == 1
    np.testing.assert_array_equal(to_numpy(y), to_numpy(checked))
    assert nmse(to_numpy(y), expected(dense, x, ids)) <= QUANT_NMSE
    bad = mx.array(ids) + mx.array([[0, 0], [0, 0], [0, E]], mx.int32)  # pair (2, 1) out of range
    out = ops.mul_mat_id(w, mx.array(x), bad, check_ids=False)
    if mx.default_device() == mx.cpu:
        with pytest.raises(RuntimeError, match=rf"ids\[2, 1\] = {ids[2, 1] + E} is not an expert index"):
            mx.eval(out)
    else:
        got = to_numpy(out)
        assert np.isnan(got[2, 1]).all()
        keep = np.ones((T, U), bool)
        keep[2, 1] = False
        assert nmse(got[keep], expected(dense, x, ids)[keep]) <= QUANT_NMSE
    with pytest.raises(TypeError, match="check_ids must be a bool"):
        ops.mul_mat_id(w, mx.array(x), mx.array(ids), check_ids=1)


def test_bad_shapes_and_types():
    w, _ = experts(np.random.default_rng(8), GGMLType.Q4_0, 4, 8, 32)
    ids = mx.array([[0, 1], [2, 3]], mx.int32)
    with pytest.raises(ValueError, match="has K = 64 but the experts"):
        ops.mul_mat_id(w, mx.ones((2, 1, 64)), ids)
    with pytest.raises(ValueError, match="does not fit ids"):
        ops.mul_mat_id(w, mx.ones((2, 3, 32)), ids)
    with pytest.raises(ValueError, match="does not fit ids"):
        ops.mul_mat_id(w, mx.ones((3, 1, 32)), ids)
    with pytest.raises(TypeError, match="ids must be an integer array"):
        ops.mul_mat_id(w, mx.ones((2, 1, 32)), ids.astype(mx.float32))
    with pytest.raises(ValueError, match="must be 3-D experts"):
        ops.mul_mat_id(GGMLTensor(w.data, GGMLType.Q4_0, (32, 32)), mx.ones((2, 1, 32)), ids)
    with pytest.raises(TypeError, match="x must be an mlx.core.array"):
        ops.mul_mat_id(w, np.ones((2, 1, 32)), ids)


def test_vjp_matches_finite_differences_and_the_weight_has_none():
    rng = np.random.default_rng(9)
    E, N, K, T, U = 5, 12, 64, 4, 3
    w, dense = experts(rng, GGMLType.Q8_0, E, N, K)
    ids = random_ids(rng, T, U, E)
    c = rng.standard_normal((T, U, N))
    for slots in (U, 1):
        x0 = rng.standard_normal((T, slots, K))

        def loss(v):
            return mx.sum(ops.mul_mat_id(w, v, mx.array(ids)) * mx.array(c.astype(np.float32)))

        grad = np.array(mx.grad(loss)(mx.array(x0.astype(np.float32))), np.float64)
        # linear in x: central differences of the exact float64 function recover the gradient
        h = 1e-3
        fd = np.zeros_like(x0)
        for i in np.ndindex(x0.shape):
            e = np.zeros_like(x0)
            e[i] = h
            fd[i] = (np.sum(expected(dense, x0 + e, ids) * c) - np.sum(expected(dense, x0 - e, ids) * c)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5 * np.abs(fd).max())
    with pytest.raises(ValueError, match="differentiable in x only"):
        mx.grad(lambda d: ops.mul_mat_id(GGMLTensor(d, GGMLType.Q8_0, (E, N, K)), mx.ones((T, 1, K)),
                                         mx.array(ids)).sum())(w.data)


def test_jvp_and_second_order():
    rng = np.random.default_rng(10)
    w, dense = experts(rng, GGMLType.Q4_K, 4, 16, 256)
    ids = random_ids(rng, 3, 2, 4)
    x = rng.standard_normal((3, 2, 256)).astype(np.float32)
    tangent = rng.standard_normal((3, 2, 256)).astype(np.float32)
    _, (jv,) = mx.jvp(lambda v: ops.mul_mat_id(w, v, mx.array(ids)), [mx.array(x)], [mx.array(tangent)])
    assert nmse(to_numpy(jv), expected(dense, tangent, ids)) <= QUANT_NMSE
    # the transposed product's own vjp is the forward product again
    g = mx.array(rng.standard_normal((3, 2, 16)).astype(np.float32))
    inner = lambda u: mx.vjp(lambda v: ops.mul_mat_id(w, v, mx.array(ids)), [mx.array(x)], [u])[1][0]
    _, (back,) = mx.vjp(inner, [g], [mx.array(x)])
    assert nmse(to_numpy(back), expected(dense, x, ids)) <= QUANT_NMSE


def test_vmap_over_x_ids_and_a_batch_of_expert_sets():
    rng = np.random.default_rng(11)
    t, E, N, K, T, U = GGMLType.Q4_0, 3, 8, 64, 4, 2
    sets = [experts(rng, t, E, N, K) for _ in range(2)]
    stacked = mx.stack([s[0].data for s in sets])
    ids = np.stack([random_ids(rng, T, U, E) for _ in range(2)])
    x = rng.standard_normal((2, T, 1, K)).astype(np.float32)
    f = lambda v, i: ops.mul_mat_id(sets[0][0], v, i)
    y = mx.vmap(f)(mx.array(x), mx.array(ids))
    assert nmse(to_numpy(y), np.stack([expected(sets[0][1], x[v], ids[v]) for v in range(2)])) <= QUANT_NMSE
    g = lambda d, v: ops.mul_mat_id(GGMLTensor(d, t, (E, N, K)), v, mx.array(ids[0]))
    y = mx.vmap(g)(stacked, mx.array(x))
    assert nmse(to_numpy(y), np.stack([expected(sets[v][1], x[v], ids[0]) for v in range(2)])) <= QUANT_NMSE
    grad = mx.vmap(mx.grad(lambda v, i: f(v, i).sum()))(mx.array(x), mx.array(ids))
    want = np.stack([np.stack([sets[0][1][ids[v][tk]].sum(axis=(0, 1)) for tk in range(T)])[:, None]
                     for v in range(2)])
    assert nmse(to_numpy(grad), want) <= 1e-10


def test_compile_and_shapeless_compile():
    rng = np.random.default_rng(12)
    w, dense = experts(rng, GGMLType.Q8_0, 4, 16, 64)
    fs = mx.compile(lambda v, i: ops.mul_mat_id(w, v, i), shapeless=True)
    for T in (1, 5):
        ids = random_ids(rng, T, 2, 4)
        x = rng.standard_normal((T, 1, 64)).astype(np.float32)
        assert nmse(to_numpy(fs(mx.array(x), mx.array(ids))), expected(dense, x, ids)) <= QUANT_NMSE
    with pytest.raises(ValueError, match="does not fit the Q8_0 experts"):
        fs(mx.ones((2, 1, 32)), mx.zeros((2, 2), mx.int32))


# ----------------------------------------------------------------------------- nn: mlx-lm's switch layers

def test_switch_linear_is_a_drop_in_for_mlx_lms_switch_glu():
    """mlx-lm's own SwitchGLU, its three SwitchLinear replaced by GGMLSwitchLinear, against the same SwitchGLU with
    the decoded float experts: few tokens (gather_mm's unsorted call) and 64 or more indices (mlx-lm sorts the
    tokens by expert and calls with x (T k, 1, K)); with a bias, and GGMLSwitchGLU (no sort, ops.glu) alike."""
    from mlx_lm.models.switch_layers import SwitchGLU
    from mlx_ggml_ext.nn import GGMLSwitchGLU, GGMLSwitchLinear
    rng = np.random.default_rng(13)
    E, dims, hidden, used = 6, 256, 64, 2
    ours, ref = SwitchGLU(dims, hidden, E, bias=True), SwitchGLU(dims, hidden, E, bias=True)
    for name, (n, k), t in [("gate_proj", (hidden, dims), GGMLType.Q4_K), ("up_proj", (hidden, dims), GGMLType.Q8_0),
                            ("down_proj", (dims, hidden), GGMLType.Q5_0)]:
        w, dense = experts(rng, t, E, n, k)
        bias = mx.array(rng.standard_normal((E, n)).astype(np.float32))
        setattr(ours, name, GGMLSwitchLinear(w, bias))
        getattr(ref, name).weight = mx.array(dense.astype(np.float32))
        getattr(ref, name).bias = bias
    glu = GGMLSwitchGLU(ours.gate_proj, ours.up_proj, ours.down_proj)
    for T in (3, 40):  # 6 and 80 indices
        x = mx.array(rng.standard_normal((1, T, dims)).astype(np.float32))
        ids = mx.array(np.stack([rng.permutation(E)[:used] for _ in range(T)]).astype(np.int32)[None])
        # The reference off the device under test: MLX 0.32.4's CUDA gather_mm gave wrong rows here after some
        # earlier tests in the same process (docs/cuda.md, "What ran where"); its CPU gather_mm did not.
        with mx.stream(mx.cpu):
            want = to_numpy(ref(x, ids))
        for layer in (ours, glu):
            got = layer(x, ids)
            assert got.shape == (1, T, used, dims)
            assert nmse(to_numpy(got), want) <= 4 * QUANT_NMSE
            for proj in (ours.gate_proj, ours.up_proj, ours.down_proj):  # lazy ids (models.load's): same numbers
                proj.check_ids = False
            np.testing.assert_array_equal(to_numpy(layer(x, ids + 0)), to_numpy(got))
            for proj in (ours.gate_proj, ours.up_proj, ours.down_proj):
                proj.check_ids = True
    with pytest.raises(TypeError, match="check_ids must be a bool"):
        GGMLSwitchLinear(w, check_ids="no")


@pytest.mark.parametrize("bias", [False, True])
def test_switch_glu_stacks_gate_and_up_experts(bias):
    """GGMLSwitchGLU(stack=True): gate's and up's experts of one type as one set of 2N rows per expert (one
    mul_mat_id, ggml's fused layout for ops.glu): the same numbers as the two products (each row's dot is the
    same); experts of two types stay apart."""
    from mlx_ggml_ext.nn import GGMLSwitchGLU, GGMLSwitchLinear
    rng = np.random.default_rng(17)
    E, dims, hidden, used = 5, 256, 64, 2

    def layer(t, n, k):
        b = mx.array(rng.standard_normal((E, n)).astype(np.float32)) if bias else None
        return GGMLSwitchLinear(experts(rng, t, E, n, k)[0], b)

    gate, up, down = layer(GGMLType.Q4_K, hidden, dims), layer(GGMLType.Q4_K, hidden, dims), layer(GGMLType.Q8_0, dims, hidden)
    plain, stacked = GGMLSwitchGLU(gate, up, down), GGMLSwitchGLU(gate, up, down, stack=True)
    assert "gate_up_proj" in stacked and "gate_proj" not in stacked and "gate_up_proj" not in plain
    assert stacked.gate_up_proj.output_dims == 2 * hidden
    for T in (1, 9):
        x = mx.array(rng.standard_normal((T, dims)).astype(np.float32))
        ids = mx.array(np.stack([rng.permutation(E)[:used] for _ in range(T)]).astype(np.int32))
        np.testing.assert_array_equal(to_numpy(stacked(x, ids)), to_numpy(plain(x, ids)))
    mixed = GGMLSwitchGLU(gate, layer(GGMLType.Q8_0, hidden, dims), down, stack=True)
    assert "gate_up_proj" not in mixed and "gate_proj" in mixed
