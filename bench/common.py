"""Benchmark helpers: interleaved timing, the streaming roofline measured in the same
run, and JSON-lines output. Times are medians over rounds in which every contender
runs once, so a noisy neighbour slows all of them alike; report ratios."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import mlx.core as mx

import mlx_ggml_ext
from mlx_ggml_ext import _ext


def device_name() -> str:
    d = mx.default_device()
    if d == mx.cpu:
        return f"cpu:{mlx_ggml_ext.cpu_isa()}x{mlx_ggml_ext.num_threads()}"
    return f"gpu:{mlx_ggml_ext._ext.gpu_backend()}"


def timed(fn: Callable[[], object]) -> float:
    """Seconds to build and evaluate fn's graph; a contender that times itself (the
    roofline) returns its seconds as a float instead."""
    start = time.perf_counter()
    out = fn()
    if isinstance(out, float):
        return out
    mx.eval(out)
    mx.synchronize()
    return time.perf_counter() - start


def interleaved_samples(contenders: Dict[str, Callable[[], object]], rounds: int = 30,
                        warmup: int = 3) -> Dict[str, List[float]]:
    """Seconds per call of each contender in every round, measured round-robin."""
    for fn in contenders.values():
        for _ in range(warmup):
            timed(fn)
    samples = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            samples[name].append(timed(fn))
    return samples


def interleaved(contenders: Dict[str, Callable[[], object]], rounds: int = 30, warmup: int = 3) -> Dict[str, float]:
    """Median seconds per call of each contender, measured round-robin."""
    return {name: statistics.median(s) for name, s in interleaved_samples(contenders, rounds, warmup).items()}


def cpu_roofline_seconds(read_bytes: int, written_bytes: int, repeats: int = 1) -> float:
    """Seconds of a threaded streaming copy (or read when nothing is written) of the same
    bytes on the CPU kernels' own thread pool: the faster of a copy with ordinary stores
    and one with cache-bypassing stores (which some kernels use). As a contender in
    `interleaved` it meets the same machine noise as the ops it is the roofline for."""
    if written_bytes:
        n = max(read_bytes, written_bytes)
        return min(_ext.measure_stream(kind, n, repeats) for kind in ("copy", "copy_nt"))
    return _ext.measure_stream("read", read_bytes, repeats)


def with_cpu_roofline(contenders: Dict[str, Callable[[], object]], read_bytes: int,
                      written_bytes: int) -> Dict[str, Callable[[], object]]:
    """The contenders plus, on the CPU, a "roofline" one streaming the same bytes in the
    same rounds, so it meets the same machine noise as the ops it judges."""
    if mx.default_device() != mx.cpu:
        return contenders
    return {**contenders, "roofline": lambda: cpu_roofline_seconds(read_bytes, written_bytes)}


def roofline_fields(per_op: Dict[str, float], moved_per_op: int, name: str = "ours") -> dict:
    """roofline_gbs and fraction_of_roofline (median against median) when the roofline ran."""
    if "roofline" not in per_op:
        return {}
    roof = moved_per_op / per_op["roofline"] / 1e9
    return {"roofline_gbs": roof, "fraction_of_roofline": moved_per_op / per_op[name] / 1e9 / roof}


def streaming_op_fields(samples: Dict[str, List[float]], graph: int, moved_per_op: int) -> dict:
    """The fields of a streaming op ("ours") against MLX's built-in ("mlx") and the
    roofline, from interleaved_samples of graphs of `graph` ops: from the medians,
    and (best_*) from each contender's best round. On this shared machine a round is
    only ever slowed by interference (its bandwidth drops by up to 2x for whole
    rounds, for every contender alike but not in the same rounds), so the best
    rounds are the other fair summary (Python's timeit gives the same advice)."""
    fields = {}
    for prefix, summary in (("", statistics.median), ("best_", min)):
        per_op = {name: summary(s) / graph for name, s in samples.items()}
        fields.update({
            f"{prefix}time_us": per_op["ours"] * 1e6, f"{prefix}mlx_fast_time_us": per_op["mlx"] * 1e6,
            f"{prefix}gbs": moved_per_op / per_op["ours"] / 1e9,
            f"{prefix}speedup_vs_mlx_fast": per_op["mlx"] / per_op["ours"],
            **{prefix + k: v for k, v in roofline_fields(per_op, moved_per_op).items()},
        })
    return fields


def cpu_roofline_gbs(read_bytes: int, written_bytes: int, repeats: int = 7) -> float:
    """GB/s of cpu_roofline_seconds, best of `repeats` (the traffic counted as the
    bytes read plus the bytes written)."""
    n = 2 * max(read_bytes, written_bytes) if written_bytes else read_bytes
    return n / cpu_roofline_seconds(read_bytes, written_bytes, repeats) / 1e9


def emit(record: dict) -> None:
    record = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}
    print(json.dumps(record), flush=True)


# MLX's CPU allocator caches at most 32 MB of freed buffers by default; past that every
# evaluation page-faults its outputs in afresh (about 1 us per 4 KiB page), which would
# swamp any kernel, ours and MLX's alike. The benchmarks raise the limit for everyone.
CACHE_LIMIT = 4 << 30


def add_run_options(parser, rounds: int) -> None:
    """The options every benchmark shares: ops per evaluated graph, timed rounds, MLX's cache limit."""
    parser.add_argument("--graph", type=int, default=4, help="independent ops per evaluated graph")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--mlx-default-cache", action="store_true",
                        help="keep MLX's default 32 MB buffer cache (outputs page-fault on every eval)")


def header(raise_cache_limit: bool = True) -> None:
    limit = CACHE_LIMIT if raise_cache_limit else mx.set_cache_limit(0)
    mx.set_cache_limit(limit)
    emit({"cache_limit_bytes": limit, "bench": "environment", "mlx": mx.__version__, "mlx_ggml_ext": mlx_ggml_ext.__version__,
          "device": device_name(), "python": sys.version.split()[0]})


def require_executable(parser, path: str, option: str) -> None:
    """Stops the benchmark with a usage error when `path` (given as `option`) is not an executable."""
    if not os.access(path, os.X_OK):
        parser.error(f"{option} {path!r} is not an executable")
