"""kernels/metal/rms_norm.metal with the fused residual add (ops.add_rms_norm's Metal path: RmsNormArgs.residual)
in the project's Metal emulator (tests/metal_emu; see tests/test_metal_emulation.py's docstring), launched with the
plan csrc/backend/metal encodes (launch_plans.h's plan_rms_norm): the stored sum equals x + residual rounded to
the dtype bit for bit, and the output is the float64 norm of that sum. Nothing here ran on Apple hardware."""
import sys

import numpy as np
import pytest

from metal_emu import emulator as emu
from metal_emu.emulator import DTYPES
from test_metal_emulation import TOL, rms_norm_reference

pytestmark = [
    pytest.mark.skipif(emu.CXX is None, reason="the Metal emulator needs g++"),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the Metal emulator is for Linux CI (ucontext fibers, guard pages); on a Mac run "
                              "the kernel itself: MLX_GGML_EXT_DEVICE=gpu pytest -q tests/test_add_rms_norm.py"),
]


@pytest.fixture(scope="module")
def metal(tmp_path_factory):
    return emu.build(tmp_path_factory.mktemp("metal_emu_add_rms_norm"), [emu.METAL_DIR / "rms_norm.metal"])


def run(metal, dtype, dim, rows, weighted, vec4=None, in_place=False):
    storage, to_storage, to_f32 = DTYPES[dtype]
    rng = np.random.default_rng(dim * 3 + rows)
    x, r = to_storage(rng.standard_normal((rows, dim)) * 3), to_storage(rng.standard_normal((rows, dim)))
    w = to_storage(rng.standard_normal(dim))
    fields = dict(dtype=dtype, rows=rows, dim=dim, rows_per_weight=rows, weighted=int(weighted), eps=1e-5,
                  residual=1)
    if vec4 is not None:
        fields["vec4"] = int(vec4)
    plan = metal.plan("rms_norm", **fields)
    buffers = {0: x, 1: w if weighted else x, 2: np.full(x.shape, 0xFF, storage), 4: r}
    if not in_place:
        buffers[5] = np.full(x.shape, 0xFF, storage)
    out = metal.dispatch_plan(plan, buffers, args_index=3, seed=dim, aliases={5: 0} if in_place else None)
    sum32 = to_f32(x.reshape(-1).view(np.uint8)) + to_f32(r.reshape(-1).view(np.uint8))  # float32, as the kernel
    expected_sum = to_storage(sum32).reshape(rows, dim)
    got_sum = out[0 if in_place else 5].view(storage).reshape(rows, dim)
    np.testing.assert_array_equal(got_sum, expected_sum)
    h = to_f32(expected_sum.reshape(-1).view(np.uint8)).reshape(rows, dim)
    got = to_f32(out[2]).reshape(rows, dim)
    expected = rms_norm_reference(h, to_f32(w.view(np.uint8)) if weighted else None, 1e-5)
    emu_close = np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30)
    assert emu_close <= TOL["rms_norm"][dtype], f"add_rms_norm {dtype} dim {dim}: {emu_close}"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dim,rows,weighted", [(1, 3, True), (33, 4, False), (200, 3, True), (1100, 2, True)])
def test_add_rms_norm(metal, dtype, dim, rows, weighted):
    run(metal, dtype, dim, rows, weighted)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_scalar_path_of_a_vector_row(metal, dtype):
    """vec4 off for a row that could take it (the host turns it off for misaligned inputs)."""
    run(metal, dtype, 256, 2, True, vec4=False)


def test_sum_in_place_of_x(metal):
    """The kernel with the sum aliasing x (it allows it; MLX 0.32 never donates x to this two-output primitive, so
    eval_gpu gives the sum a buffer of its own: csrc/utils.h)."""
    run(metal, "f32", 1100, 3, True, in_place=True)
    run(metal, "bf16", 64, 2, True, in_place=True)
