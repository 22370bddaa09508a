import mlx.core as mx
import pytest

from mlx_ggml_ext import GGMLTensor, GGMLType

# Block layouts from docs/formats.md, written out independently of the package's table.
SPEC_LAYOUTS = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18),
    "IQ4_XS": (23, 256, 136), "MXFP4": (39, 32, 17),
    "IQ2_XXS": (16, 256, 66), "IQ2_XS": (17, 256, 74), "IQ3_XXS": (18, 256, 98), "IQ1_S": (19, 256, 50),
    "IQ3_S": (21, 256, 110), "IQ2_S": (22, 256, 82), "IQ1_M": (29, 256, 56), "TQ1_0": (34, 256, 54),
    "TQ2_0": (35, 256, 66),
}


@pytest.mark.parametrize("name", sorted(SPEC_LAYOUTS))
def test_layouts_match_spec_and_gguf(name):
    gguf = pytest.importorskip("gguf")
    type_id, block, size = SPEC_LAYOUTS[name]
    t = GGMLType.of(name.lower())
    assert (int(t), t.block_size, t.type_size) == (type_id, block, size)
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)] == (block, size)


def test_lookup_by_name_id_and_errors():
    assert GGMLType.of("q4_k") is GGMLType.Q4_K
    assert GGMLType.of(8) is GGMLType.Q8_0
    with pytest.raises(ValueError, match="unknown ggml type 'q9_0'"):
        GGMLType.of("q9_0")
    with pytest.raises(ValueError, match="unsupported ggml type id 4"):
        GGMLType.of(4)
    with pytest.raises(TypeError, match="float"):
        GGMLType.of(2.0)


def test_tensor_validates_its_bytes():
    t = GGMLTensor(mx.zeros((3, 2 * 18), dtype=mx.uint8), "q4_0", (3, 64))
    assert t.shape == (3, 64) and t.nbytes == 108
    flat = GGMLTensor(mx.zeros((108,), dtype=mx.uint8), GGMLType.Q4_0, (3, 64))
    assert flat.data.shape == (3, 36)
    with pytest.raises(ValueError, match=r"needs 3 x 36 bytes.*\(3, 35\)"):
        GGMLTensor(mx.zeros((3, 35), dtype=mx.uint8), "q4_0", (3, 64))
    with pytest.raises(ValueError, match="multiple of 256"):
        GGMLTensor(mx.zeros((1, 144), dtype=mx.uint8), "q4_k", (1, 300))
    with pytest.raises(TypeError, match="uint8"):
        GGMLTensor(mx.zeros((3, 36), dtype=mx.int8), "q4_0", (3, 64))


def test_iq_grids_header_is_ggmls_tables():
    """kernels/common/iq_grids.h holds exactly the grids of the gguf package (tools/gen_iq_grids.py --check also
    checks the decoders' value maps against gguf's and the ksigns rule)."""
    pytest.importorskip("gguf")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "tools" / "gen_iq_grids.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
