"""kernels/cuda/rms_norm.cu with the fused residual add (add_rms_norm's CUDA path: RmsNormArgs.residual and sum)
run on the host (tests/cuda_emulation, as test_cuda_emulation.py): the stored sum equals x + residual rounded to the
dtype bit for bit, and the output is the float64 norm of that sum, on the vector and scalar paths, rows held in
registers and rows past them, and with the sum written over x (the kernel allows it; MLX 0.32 never donates x to this
two-output primitive, csrc/utils.h)."""
import numpy as np
import pytest

from test_cuda_emulation import (BF16, F16, F32, TOL, RmsNormArgs, kernels, loaded, ptr,  # noqa: F401 (the fixture)
                                 stored)
from mlx_ggml_ext import reference


@pytest.mark.parametrize("ftype", [F32, F16, BF16])
@pytest.mark.parametrize("in_place", [False, True], ids=["own_sum", "sum_over_x"])
def test_add_rms_norm(kernels, ftype, in_place):
    rng = np.random.default_rng(20 + ftype)
    # 3/17/100: scalar path; 16/64/4096: vectors in registers; 20000: past the registers
    for dim in [3, 16, 17, 64, 100, 4096, 20000]:
        rows = 5
        x = stored(rng.standard_normal((rows, dim)) * 3, ftype)
        r = stored(rng.standard_normal((rows, dim)), ftype)
        w = stored(rng.standard_normal((1, dim)), ftype)
        x_values, r_values = loaded(x, ftype), loaded(r, ftype)
        y = np.zeros_like(x)
        h = x if in_place else np.zeros_like(x)
        args = RmsNormArgs(ptr(x), ptr(w), ptr(y), rows, dim, rows, 1e-5, ptr(r), ptr(h))
        assert kernels.emulated_rms_norm(args, ftype) == 0
        expected_sum = stored((x_values.astype(np.float32) + r_values.astype(np.float32)).astype(np.float64),
                              ftype)
        np.testing.assert_array_equal(h, expected_sum)
        expected = reference.rms_norm(loaded(expected_sum, ftype), loaded(w, ftype), 1e-5)
        err = np.max(np.abs(loaded(y, ftype) - expected))
        assert err <= TOL[ftype] * np.max(np.abs(expected)), (dim, in_place, err)
