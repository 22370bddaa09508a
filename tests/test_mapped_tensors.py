"""Tensors of a mapped GGUF file reach the kernels without a copy on every call.

A mapped tensor's buffer is the whole file, and MLX's Contiguous shares a buffer only when it is at most
16 KiB larger than the array: any lazy reshape of the weight before a primitive made every call copy the
whole weight (a 178 MB output head cost 0.13 s and 43,521 page faults per decode step). A copy shows in
MLX's peak memory, which is what these tests measure around one call (on the CPU, and on a GPU where
MLX_GGML_EXT_DEVICE=gpu)."""

import os

import mlx.core as mx
import numpy as np
import pytest

from mlx_ggml_ext import _ext, gguf, nn as gnn, ops

ROWS, K = 4096, 1024  # Q8_0: 4.35 MB of blocks


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = mx.array(rng.standard_normal((ROWS, K)).astype(np.float32))
    blocks = ops.quantize(w, "q8_0", stream=mx.cpu)
    path = str(tmp_path_factory.mktemp("mapped") / "big.gguf")
    # A second tensor, so that the file is larger than either tensor.
    gguf.save(path, {"general.architecture": "test"},
              {"small": rng.standard_normal((64, 64)).astype(np.float32),
               "big": gguf.GGMLTensor(blocks, "q8_0", (ROWS, K))})
    return gguf.load(path), np.array(w)


def _peak_bytes_of(fn) -> int:
    """MLX's peak allocation above what was in use, over one evaluated call (after a warm-up call)."""
    mx.eval(fn())
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    mx.eval(fn())
    mx.synchronize()
    return mx.get_peak_memory() - before


def test_quantized_matmul_reads_the_mapping_in_place(mapped):
    f, _ = mapped
    t = f.tensors["big"]
    assert t.nbytes > 4_000_000
    x = mx.ones((1, K))
    assert _peak_bytes_of(lambda: ops.quantized_matmul(x, t)) < t.nbytes // 8
    layer = gnn.GGMLLinear(t)
    assert _peak_bytes_of(lambda: layer(x)) < t.nbytes // 8
    table = gnn.GGMLEmbedding(t)
    assert _peak_bytes_of(lambda: table.as_linear(x)) < t.nbytes // 8
    assert _peak_bytes_of(lambda: ops.mul_mat(t, x)) < t.nbytes // 8


def test_embedding_and_dequantize_copy_only_what_they_return(mapped):
    f, w = mapped
    t = f.tensors["big"]
    table = gnn.GGMLEmbedding(t)
    ids = mx.array([0, 7, ROWS - 1])
    assert _peak_bytes_of(lambda: table(ids)) < t.nbytes // 8
    out_bytes = ROWS * K * 4
    assert _peak_bytes_of(lambda: t.dequantize()) < out_bytes + t.nbytes // 8
    # and the values are the tensor's (rows through the Q8_0 round trip)
    np.testing.assert_allclose(np.array(table(ids)), w[np.array(ids)], atol=0.05)


def _resident_bytes(address: int) -> int:
    """Rss of the mapping holding `address` (/proc/self/smaps): the bytes of it this process has page-table
    entries for."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        head = line.split(maxsplit=1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            if lo <= address < hi:
                rss = next(l for l in lines[i + 1:] if l.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_prefault_maps_every_page_so_that_reads_do_not_fault(tmp_path):
    """MappedFile.prefault (GGUFFile.prefault, models.load's default) maps every page at once: the file's mapping
    is then resident in full (where a fresh one has no page until read), and reading one byte of each page takes
    (almost) no page fault. (Fault counts of a fresh mapping are no control: a kernel with large page-cache folios
    maps 2 MB per fault.)"""
    resource = pytest.importorskip("resource")  # POSIX: ru_minflt
    size = 8 << 20
    path = tmp_path / "pages.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes())
    page = os.sysconf("SC_PAGE_SIZE")
    have_smaps = os.path.exists("/proc/self/smaps")

    fresh = _ext.MappedFile(str(path))
    m = _ext.MappedFile(str(path))
    m.prefault()
    view = m.view()
    if have_smaps:
        assert _resident_bytes(fresh.view().__array_interface__["data"][0]) == 0
        assert _resident_bytes(view.__array_interface__["data"][0]) == size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    int(view[::page].sum())
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before <= 4


def test_gguf_prefault_keeps_the_tensors(mapped):
    f, w = mapped
    f.prefault()  # a no-op where the tensors are copies (zero_copy False)
    out = ops.dequantize(f.tensors["big"].data, "q8_0", (ROWS, K))
    ref = ops.dequantize(ops.quantize(mx.array(w), "q8_0", stream=mx.cpu), "q8_0", (ROWS, K))
    assert mx.array_equal(out, ref).item()
