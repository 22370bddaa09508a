"""mul_mat_id's forward product at prefill on the tensor-core tiles (kernels/cuda/mul_mat_id_tiles.cuh), run on the
host (tests/cuda_emulation, as test_cuda_emulation.py) against float64 on gguf's decoded experts.

The route is taken from an average of 16 pairs per expert (t * n_used >= 16 E); the cases here have 80 pairs over
4 experts, routed unevenly: expert 0 more pairs than one tile holds (64: two tiles, the second partial), expert 2
none, a bad id (NaN row, no weight read). The tiles round the weight to x's type (bfloat16 for float32 x), so the
bound is the tiles' of quantized_matmul: one rounding of x, the weight and the output, far below what a wrong row,
pair or scale gives (NMSE near 1)."""

import numpy as np
import pytest

from harness import nmse
from mlx_ggml_ext import GGMLType
from test_cuda_emulation import (BF16, F16, F32, MulMatIdArgs, kernels, mul_mat_id_case,  # noqa: F401 (fixture)
                                 param_id)

# NMSE of one rounding of x and the weight to the tensor cores' type and of the output to x's type: float16
# (2^-11)^2 scale, bfloat16 (2^-8)^2 scale (float32 x runs in bfloat16, its output float32). The emulation gave
# 4e-8 - 9e-8 (float16) and 5e-6 - 6.4e-6 (bfloat16): about 5x and 4x below these.
BOUND = {F16: 4e-7, BF16: 2.5e-5, F32: 2.5e-5}
E = 4


def uneven_ids():
    """(40 tokens, 2 slots): 66 pairs on expert 0, 9 on expert 1, none on 2, 4 on 3, and one bad id (E)."""
    ids = np.zeros((40, 2), np.int32)
    flat = ids.reshape(-1)
    flat[[3, 17, 29, 41, 52, 60, 66, 71, 78]] = 1
    flat[[9, 33, 47, 75]] = 3
    flat[58] = E
    return ids


def takes_tiles(kernels, t, x_type, ids, n, k, slots):
    args = MulMatIdArgs(None, None, None, None, None, ids.shape[0], ids.shape[1], slots, E, n, k,
                        k // t.block_size * t.type_size)
    return kernels.emulated_mul_mat_id_takes_tiles(args, int(t), x_type, 0) == 1


# Aligned words (Q4_0 of 128, Q4_K), the reference decoders (Q8_0 of 96: 102-byte rows; an IQ grid; float16
# weights with float16 x), x broadcast over the slots once.
CASES = [(GGMLType.Q4_0, F32, 128, 2), (GGMLType.Q4_0, F16, 128, 1), (GGMLType.Q4_K, F32, 256, 2),
         (GGMLType.Q4_K, BF16, 256, 2), (GGMLType.Q8_0, F16, 96, 2), (GGMLType.IQ2_XXS, F16, 256, 2),
         (GGMLType.F16, F16, 67, 2)]


@pytest.mark.parametrize("t, x_type, k, slots", CASES, ids=param_id)
def test_mul_mat_id_tiles(kernels, t, x_type, k, slots):
    """Every valid pair's row within the tiles' rounding of float64 (outputs past the first 128-row block of the
    weight: n = 130), every bad id's row NaN (mul_mat_id_case), the route taken."""
    ids, n = uneven_ids(), 130
    assert takes_tiles(kernels, t, x_type, ids, n, k, slots)
    got, exact, _ = mul_mat_id_case(kernels, t, x_type, ids, E, n, k, slots, False, seed=int(t) + x_type)
    err = nmse(got, exact)
    assert err < BOUND[x_type], err
    if x_type == F32:  # rounded to bfloat16 on the tensor cores, not the float32 sums of the float kernels
        assert err > 1e-9, err


def test_mul_mat_id_tiles_route(kernels):
    """Not taken: fewer than 16 pairs per expert on average (a decode of 8 tokens, or 80 pairs over 8 experts),
    float32 x on float weights (float32 sums, as quantized_matmul keeps), the transposed product."""
    ids = uneven_ids()
    assert not takes_tiles(kernels, GGMLType.Q4_K, F32, ids[:8], 130, 256, 2)
    assert not takes_tiles(kernels, GGMLType.F16, F32, ids, 130, 64, 2)
    args = MulMatIdArgs(None, None, None, None, None, 40, 2, 2, 2 * E, 130, 256, 144)
    assert kernels.emulated_mul_mat_id_takes_tiles(args, int(GGMLType.Q4_K), F32, 0) == 0
    args.e = E
    assert kernels.emulated_mul_mat_id_takes_tiles(args, int(GGMLType.Q4_K), F32, 0) == 1
    assert kernels.emulated_mul_mat_id_takes_tiles(args, int(GGMLType.Q4_K), F32, 1) == 0
