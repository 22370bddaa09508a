"""mul_mat_id's forward product on expert rows whose length is not a multiple of 4 bytes, run on the host
(tests/cuda_emulation, as test_cuda_emulation.py) against float64 on gguf's decoded experts: the integer dots on rows
staged through the warp's shared memory (kernels/cuda/mul_mat_id.cu, grouped_dot_kernel's kStaged), which such rows
take since they cannot be read as aligned words from global memory. Every expert after the first then starts off a
word boundary too."""

import numpy as np
import pytest

from mlx_ggml_ext import GGMLType
from test_cuda_emulation import F32, assert_mul_mat_id, kernels, mul_mat_id_case  # noqa: F401 (fixture)


@pytest.mark.parametrize("t", [GGMLType.Q6_K, GGMLType.IQ2_XXS, GGMLType.Q4_0, GGMLType.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 9])
def test_mul_mat_id_rows_off_word_boundaries(kernels, t, tokens):
    """Three blocks a row: Q6_K and IQ2_XXS at 768 elements (630 and 198 bytes: the rows of qwen3-30b-a3b's down
    experts), Q4_0 at 96 (54 bytes), MXFP4 (51). One token (one pair per chunk: the two launches, not the one-launch
    kernel, which reads words from global memory) and 9 (chunks of several pairs); a bad id gets a NaN row."""
    rng = np.random.default_rng(int(t) + tokens)
    E, n, used = 5, 24, 3
    k = 3 * t.block_size
    assert (k // t.block_size * t.type_size) % 4 != 0
    ids = np.stack([rng.permutation(E)[:used] for _ in range(tokens)]).astype(np.int32)
    ids[-1, 0] = E
    got, exact, theirs = mul_mat_id_case(kernels, t, F32, ids, E, n, k, used, False, seed=int(t))
    assert_mul_mat_id(got, exact, theirs, t, F32, k, False, f"tokens={tokens}")
