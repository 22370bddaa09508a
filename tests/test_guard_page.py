"""No kernel reads past the end of a weight: every type's quantized_matmul, mul_mat, dequantize and x-gradient
on a tensor memory-mapped from a GGUF file that ends exactly where an inaccessible page begins.

This is the realistic failure: a model whose last tensor ends at a page-aligned end of its file, where a load
wider than the bytes left in the last block row (a 16-byte load of Q3_K's 12 scale bytes did this) faults.
The GGUF is written so that its last tensor ends at the end of the file on a page boundary, loaded with
gguf.load (zero copy: the tensor is the mapping), and a PROT_NONE page is placed right after it. Each CPU
variant runs in its own subprocess, so a fault fails that variant's test instead of killing pytest; the child
also checks the results against the `gguf` package's dequantization and float64 products.
"""

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlx_ggml_ext

PAGE = mmap.PAGESIZE
K, N = 512, 32  # 32 rows: every type's tensor is a multiple of 32 bytes, the default GGUF alignment
ROWS_OF_X = (1, 9)  # the one-row and the tiled paths
MAP_FIXED_NOREPLACE = 0x100000


def variants():
    return list(mlx_ggml_ext.cpu_isas())


@pytest.mark.parametrize("variant", variants())
def test_no_read_past_a_mapped_tensor(variant, tmp_path):
    child = subprocess.run([sys.executable, __file__, variant, str(tmp_path)], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == 0, (f"variant {variant}: the child exited with {child.returncode} (a negative "
                                   f"code is the signal)\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}")
    done = json.loads(child.stdout.strip().splitlines()[-1])
    if "skip" in done:
        pytest.skip(done["skip"])
    assert done["variant"] == variant and len(done["types"]) == len(mlx_ggml_ext.GGMLType), done


# ------------------------------------------------------------------------------------------------------------
# The child: one CPU variant, every type
# ------------------------------------------------------------------------------------------------------------

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _weight_bytes(t, rng) -> np.ndarray:
    """N rows of K elements of type t as raw bytes, every float field finite."""
    from mlx_ggml_ext import GGMLType
    if t in (GGMLType.F32, GGMLType.BF16):
        w = rng.standard_normal((N, K)).astype(np.float32)
        return (w.view(np.uint8) if t == GGMLType.F32 else (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
    # Bytes below 0x7C: a half (or E8M0) whose high byte is one of them is finite.
    return rng.integers(0, 0x7C, size=(N, t.row_bytes(K)), dtype=np.uint8)


def _write_tensor_at_page_end(path: Path, t, blocks: np.ndarray) -> None:
    """A GGUF whose last tensor 'w' ends the file on a page boundary (a 'pad' tensor before it sets where)."""
    from mlx_ggml_ext import GGMLTensor, gguf
    import mlx.core as mx
    w = GGMLTensor(mx.array(blocks.reshape(N, -1)), t, (N, K))

    def write(pad_floats: int) -> int:
        gguf.save(path, {}, {"pad": np.zeros(pad_floats, np.float32), "w": w})
        return gguf.load(path).tensor_info["w"].offset + blocks.nbytes

    end = write(8)
    end = write(8 + (-end % PAGE) // 4)
    assert end % PAGE == 0 and end == path.stat().st_size, (end, path.stat().st_size)


def _guard_after(libc, end: int) -> bool:
    """A PROT_NONE page at `end` (which must be free): the first byte past the tensor faults."""
    got = libc.mmap(end, PAGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if got == end:
        return True
    if got not in (None, ctypes.c_void_p(-1).value):
        libc.munmap(ctypes.c_void_p(got), PAGE)
    return False


def _load_guarded(libc, path: Path, keep: list):
    """gguf.load(path)'s tensor 'w', ending right before an inaccessible page."""
    from mlx_ggml_ext import gguf
    span = path.stat().st_size + 2 * PAGE  # the file and the page the reader reserves before it
    for _ in range(64):
        # A hole the size of the file's mapping right below a PROT_NONE page: the mapping usually lands in it
        # (mmap takes the highest free gap that fits). Where it lands elsewhere, the page after the tensor is
        # guarded directly if free; if not, that mapping stays alive (filling its gap) and the next try goes on.
        hole = libc.mmap(None, span + PAGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        libc.munmap(ctypes.c_void_p(hole), span)
        guard = hole + span
        f = gguf.load(path)
        keep.append(f)
        if not f.zero_copy:
            return None
        w = f.tensors["w"]
        end = np.asarray(w.data).ctypes.data + f.tensor_info["w"].nbytes
        assert end % PAGE == 0, hex(end)
        if end == guard or _guard_after(libc, end):
            return w
    raise AssertionError("could not place an inaccessible page after the mapped tensor in 64 tries")


def _check_type(t, tmp: Path, libc, rng, keep: list) -> bool:
    import mlx.core as mx
    from gguf import GGMLQuantizationType, quants
    from mlx_ggml_ext import ops
    blocks = _weight_bytes(t, rng)
    path = tmp / f"{t.name}.gguf"
    _write_tensor_at_page_end(path, t, blocks)
    w = _load_guarded(libc, path, keep)
    if w is None:
        return False
    expected_w = quants.dequantize(blocks.reshape(N, -1), GGMLQuantizationType(int(t))).astype(np.float64).reshape(N, K)

    got = np.array(ops.dequantize(w.data, t, (N, K)))
    assert np.array_equal(got, expected_w.astype(np.float32), equal_nan=True), f"{t.name} dequantize"
    scale = np.abs(expected_w).max() * np.sqrt(K)
    for m in ROWS_OF_X:
        x = rng.standard_normal((m, K)).astype(np.float32)
        ref = x.astype(np.float64) @ expected_w.T
        for name, out in [("quantized_matmul", ops.quantized_matmul(mx.array(x), w)),
                          ("mul_mat", ops.mul_mat(w, mx.array(x[None].repeat(2, 0)))[1])]:
            err = np.abs(np.array(out) - ref).max() / scale
            assert err < 0.05, f"{t.name} {name} m={m}: error {err} of the largest possible term"
        c = rng.standard_normal((m, N)).astype(np.float32)
        grad = mx.grad(lambda v: (ops.quantized_matmul(v, w) * mx.array(c)).sum())(mx.array(x))
        err = np.abs(np.array(grad) - c.astype(np.float64) @ expected_w).max() / (np.abs(expected_w).max() * np.sqrt(N))
        assert err < 0.05, f"{t.name} x-gradient m={m}: error {err}"
    return True


def _child(variant: str, tmp: str) -> None:
    from mlx_ggml_ext import GGMLType
    import mlx.core as mx
    mx.set_default_device(mx.cpu)  # the CPU kernels, whatever the machine's default device
    mlx_ggml_ext.set_cpu_isa(variant)
    libc, rng, keep = _libc(), np.random.default_rng(30), []
    done = []
    for t in GGMLType:
        if not _check_type(t, Path(tmp), libc, rng, keep):
            # A build whose tensors are copies (MLX's CUDA allocator): there is no mapped tensor to guard.
            print(json.dumps({"skip": "gguf.load copies tensors in this build (zero_copy is False)"}))
            return
        done.append(t.name)
    print(json.dumps({"variant": mlx_ggml_ext.cpu_isa(), "types": done}))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
