"""kernels/metal/rope.metal with rope_qkv's extras (ops.rope_qkv's Metal path: RopeArgs.copied_heads, has_norm) in the
project's Metal emulator (tests/metal_emu; see tests/test_metal_emulation.py's docstring), launched with the plan
csrc/backend/metal encodes (launch_plans.h's plan_rope): q and k heads rms-normed (Qwen 3, Gemma 3) and rotated as the
float64 unfused math does, within rope's tolerance; the v heads copied bit for bit. Nothing here ran on Apple
hardware."""
import sys

import numpy as np
import pytest

from metal_emu import emulator as emu
from metal_emu.emulator import DTYPES
from test_metal_emulation import TOL, assert_close, rope_host_constants
from test_rope_qkv import expected_heads

pytestmark = [
    pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the Metal emulator is for Linux CI (ucontext fibers, guard pages); on a Mac run "
                              "the op itself: MLX_GGML_EXT_DEVICE=gpu pytest -q tests/test_rope_qkv.py"),
]

CASES = {  # batches, tokens, heads, kv_heads, D, n_dims, mode, with_v, normed
    "decode-gqa-neox": (1, 1, 8, 2, 64, 64, "neox", True, False),
    "prefill-normal-partial": (2, 5, 3, 1, 40, 24, "normal", True, False),
    "qwen3-norms": (1, 3, 4, 2, 64, 64, "neox", True, True),
    "norms-partial-no-v": (2, 2, 2, 1, 80, 32, "normal", False, True),
    "norms-odd-head": (1, 2, 3, 1, 18, 18, "neox", True, True),
}


@pytest.fixture(scope="module")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu_rope_qkv"), [emu.METAL_DIR / "rope.metal"])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_rope_qkv(metal, case, dtype):
    batches, tokens, heads, kv_heads, dim, n_dims, mode, with_v, normed = CASES[case]
    total = heads + kv_heads * (2 if with_v else 1)
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng = np.random.default_rng(len(case) + dim)
    qkv = to_storage(rng.standard_normal((batches, tokens, total, dim)) * 3)
    positions = rng.integers(0, 5000, (1, tokens)).astype(np.int32)
    norms = [rng.uniform(0.5, 1.5, dim).astype(np.float32) for _ in range(2)]
    params = dict(freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0,
                  beta_slow=1.0, n_ctx_orig=0)
    theta_scale, mscale, sin_sign, _ = rope_host_constants(n_dims, inverse=False, **params)
    copied = kv_heads if with_v else 0
    plan = metal.plan("rope", dtype=dtype, batches=batches, tokens=tokens, heads=total, dim=dim, n_dims=n_dims,
                      batches_per_positions_row=batches, batches_per_factors_row=batches, neox=int(mode == "neox"),
                      has_factors=0, has_ramp=0, theta_scale=float(theta_scale), freq_scale=1.0,
                      mscale=float(mscale), sin_sign=float(sin_sign), copied_heads=copied, has_norm=int(normed),
                      q_heads=heads, norm_eps=1e-5)
    assert plan["threadgroup_bytes"] >= 4 * (n_dims + (total - copied if normed else 0))
    buffers = {0: qkv, 1: np.full(qkv.shape, 0xFF, storage), 2: positions, 3: qkv, 4: qkv,  # as the glue binds
               6: norms[0] if normed else qkv, 7: norms[1] if normed else qkv}
    out = metal.dispatch_plan(plan, buffers, args_index=5, seed=dim)
    got = out[1].view(storage).reshape(qkv.shape)
    xf = to_f32(qkv.reshape(-1).view(np.uint8)).reshape(batches, tokens, total * dim).astype(np.float64)
    for b in range(batches):
        expected = expected_heads(xf[b], positions[0], heads, kv_heads, n_dims, mode, with_v=with_v,
                                  norms=norms if normed else None, eps=1e-5, **params)
        got_heads = to_f32(got[b].reshape(-1).view(np.uint8)).reshape(tokens, total, dim).swapaxes(0, 1)
        assert_close(got_heads[:heads], expected[0], TOL["rope"][dtype], f"q {case} {dtype}")
        assert_close(got_heads[heads:heads + kv_heads], expected[1], TOL["rope"][dtype], f"k {case} {dtype}")
        if with_v:  # copied: the same bits
            np.testing.assert_array_equal(got[b][:, heads + kv_heads:], qkv[b][:, heads + kv_heads:])
