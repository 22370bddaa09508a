"""One harness for every op and backend (in the spirit of llama.cpp's test-backend-ops).

The device comes from the environment: MLX_GGML_EXT_DEVICE=cpu (default) or gpu.
Asking for gpu where this installation has no GPU backend is an error, not a skip:
a GPU run that silently tested the CPU would prove nothing.
"""

import os

import mlx.core as mx
import pytest

# The CPU kernels' workers poll for the next job for 50 ms by default (a benchmark setting); tests time nothing,
# and polling workers only take the cores from the test process and the emulation tests' compilers.
os.environ.setdefault("MLX_GGML_EXT_SPIN_MS", "0")

import mlx_ggml_ext  # noqa: E402  (reads MLX_GGML_EXT_SPIN_MS when its thread pool starts)


def _select_device() -> mx.Device:
    name = os.environ.get("MLX_GGML_EXT_DEVICE", "cpu").lower()
    if name == "cpu":
        return mx.cpu
    if name == "gpu":
        b = mlx_ggml_ext.backends()
        if not (b["cuda"] or b["metal"]):
            raise pytest.UsageError(
                f"MLX_GGML_EXT_DEVICE=gpu but no GPU backend is usable here: {b}")
        return mx.gpu
    raise pytest.UsageError(f"MLX_GGML_EXT_DEVICE must be cpu or gpu, got {name!r}")


DEVICE = _select_device()
mx.set_default_device(DEVICE)


def pytest_report_header(config):
    return (f"mlx_ggml_ext device: {DEVICE}, GPU backend built: {mlx_ggml_ext._ext.gpu_backend()}, "
            f"CPU kernels: {mlx_ggml_ext.cpu_isa()} ({mlx_ggml_ext.num_threads()} threads)")


@pytest.fixture
def device():
    return DEVICE


# Ops without a Metal kernel yet (rope_qkv, kv_cache_append) raise on Metal's GPU stream.
METAL = DEVICE == mx.gpu and mlx_ggml_ext._ext.gpu_backend() == "metal"


@pytest.fixture(params=mlx_ggml_ext.cpu_isas() if DEVICE == mx.cpu else [mlx_ggml_ext.cpu_isa()])
def cpu_isa(request):
    """Runs a CPU test once per kernel variant this CPU supports (base/NEON, AVX2, AVX-512); on the GPU,
    where the CPU variant plays no part, once."""
    previous = mlx_ggml_ext.cpu_isa()
    mlx_ggml_ext.set_cpu_isa(request.param)
    yield request.param
    mlx_ggml_ext.set_cpu_isa(previous)
