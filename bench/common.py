"""Benchmark helpers: interleaved timing, the streaming roofline measured in the same
run, and JSON-lines output. Times are medians over rounds in which every contender
runs once, so a noisy neighbour slows all of them alike; report ratios."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable, Dict

import mlx.core as mx

import mlx_ggml_ext
from mlx_ggml_ext import _ext


def device_name() -> str:
    d = mx.default_device()
    if d == mx.cpu:
        return f"cpu:{mlx_ggml_ext.cpu_isa()}x{mlx_ggml_ext.num_threads()}"
    return f"gpu:{mlx_ggml_ext._ext.gpu_backend()}"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    mx.eval(fn())
    mx.synchronize()
    return time.perf_counter() - start


def interleaved(contenders: Dict[str, Callable[[], object]], rounds: int = 30, warmup: int = 3) -> Dict[str, float]:
    """Median seconds per call of each contender, measured round-robin."""
    for fn in contenders.values():
        for _ in range(warmup):
            timed(fn)
    samples = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            samples[name].append(timed(fn))
    return {name: statistics.median(s) for name, s in samples.items()}


def cpu_roofline_gbs(read_bytes: int, written_bytes: int, repeats: int = 7) -> float:
    """GB/s of a threaded streaming copy (or read when nothing is written) over the same
    number of bytes, on the CPU kernels' own thread pool."""
    if written_bytes:
        seconds = _ext.measure_stream("copy", max(read_bytes, written_bytes), repeats)
        return 2 * max(read_bytes, written_bytes) / seconds / 1e9
    seconds = _ext.measure_stream("read", read_bytes, repeats)
    return read_bytes / seconds / 1e9


def emit(record: dict) -> None:
    record = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}
    print(json.dumps(record), flush=True)


# MLX's CPU allocator caches at most 32 MB of freed buffers by default; past that every
# evaluation page-faults its outputs in afresh (about 1 us per 4 KiB page), which would
# swamp any kernel, ours and MLX's alike. The benchmarks raise the limit for everyone.
CACHE_LIMIT = 4 << 30


def header(raise_cache_limit: bool = True) -> None:
    limit = CACHE_LIMIT if raise_cache_limit else mx.set_cache_limit(0)
    mx.set_cache_limit(limit)
    emit({"cache_limit_bytes": limit, "bench": "environment", "mlx": mx.__version__, "mlx_ggml_ext": mlx_ggml_ext.__version__,
          "device": device_name(), "python": sys.version.split()[0]})
