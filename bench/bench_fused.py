"""The fused CPU ops against what mlx-lm runs without them, on this machine's CPU, alternated.

- glu: ops.glu(g, u, kind) against nn.gelu_approx(g) * u (geglu) and nn.silu(g) * u (swiglu), on (256, 2048)
  (a 256-token prefill of Gemma 3 270M's FFN) and (1, 8192) (decode).
- attention: ops.attention against mx.fast.scaled_dot_product_attention (which on the CPU falls back to
  unfused matmuls), for Gemma 3 270M's heads (4 query heads, 1 kv head, D 256; T 256 causal, and decode Tq 1
  over 256 / 1024 cached keys) and Llama-3.2-1B's (32 / 8 heads, D 64; T 512 causal, decode over 512).

Each round runs every contender once (ours with the package's threads and with one thread, MLX's own CPU
ops being single-threaded), each timing `--graph` independent ops per evaluation. The machine is shared:
every sample also records the other processes' CPU load over its run (from /proc/stat, minus this process's
own CPU time), and the summary gives medians of the per-round ratios, which a neighbour's load hits alike.
"""

import argparse
import math
import os
import statistics
import time

import mlx.core as mx
import mlx.nn as nn

import mlx_ggml_ext
from common import emit, header
from mlx_ggml_ext import ops


def machine_busy_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def timed_with_load(fn):
    """Wall seconds of one evaluation of fn's graph, this process's CPU seconds in it (every thread), and the
    other processes' CPU load during it (CPUs busy, from /proc/stat's jiffies: coarse for short samples)."""
    tick = os.sysconf("SC_CLK_TCK")
    busy0, _ = machine_busy_jiffies()
    cpu0 = time.process_time()
    start = time.perf_counter()
    mx.eval(fn())
    seconds = time.perf_counter() - start
    own = time.process_time() - cpu0
    busy1, _ = machine_busy_jiffies()
    others = max(0.0, (busy1 - busy0) / tick - own) / seconds
    return seconds, own, others


def alternate(contenders, rounds, warmup=2):
    for fn in contenders.values():
        for _ in range(warmup):
            mx.eval(fn())
    samples = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            threads = 1 if name.endswith("_1t") else None
            mlx_ggml_ext.set_num_threads(threads or 0)
            samples[name].append(timed_with_load(fn))
    mlx_ggml_ext.set_num_threads(0)
    return samples


def summarize(bench, params, samples, baseline, graph):
    """Medians per op, and medians of the per-round ratios baseline / contender: of wall time (what a user waits
    for, hit by the neighbours' load) and of this process's CPU time (work done, much less so)."""
    record = {"bench": bench, **params, "graph_ops": graph, "threads": mlx_ggml_ext.num_threads(),
              "isa": mlx_ggml_ext.cpu_isa(), "rounds": len(samples[baseline]),
              "others_load_cpus_median": statistics.median(l for s in samples.values() for _, _, l in s)}
    for column, label in ((0, "wall"), (1, "cpu")):
        values = {name: [sample[column] for sample in s] for name, s in samples.items()}
        for name, vs in values.items():
            record[f"{name}_{label}_us_median"] = statistics.median(vs) / graph * 1e6
            if name != baseline:
                record[f"{label}_speedup_{name}"] = statistics.median(
                    b / max(v, 1e-9) for b, v in zip(values[baseline], vs))
    return record


def bench_glu(rows, cols, kind, graph, rounds):
    gs = [mx.random.normal((rows, cols)) for _ in range(graph)]
    us = [mx.random.normal((rows, cols)) for _ in range(graph)]
    mx.eval(gs, us)
    act = nn.gelu_approx if kind == "geglu" else nn.silu
    contenders = {
        "mlx": lambda: [act(g) * u for g, u in zip(gs, us)],
        "ours": lambda: [ops.glu(g, u, kind=kind) for g, u in zip(gs, us)],
        "ours_1t": lambda: [ops.glu(g, u, kind=kind) for g, u in zip(gs, us)],
    }
    return summarize("glu", {"kind": kind, "shape": [rows, cols], "dtype": "float32"},
                     alternate(contenders, rounds), "mlx", graph)


def bench_attention(name, b, hq, hk, tq, tk, d, causal, graph, rounds, dtype=mx.float32):
    qs = [mx.random.normal((b, hq, tq, d)).astype(dtype) for _ in range(graph)]
    # Decode reads keys and values as mlx-lm's KVCache hands them over: the first Tk positions of a buffer
    # grown in steps of 256 (a strided view, not a copy).
    alloc = tk if tq > 1 else (tk // 256 + 1) * 256
    ks = [mx.random.normal((b, hk, alloc, d)).astype(dtype)[:, :, :tk] for _ in range(graph)]
    vs = [mx.random.normal((b, hk, alloc, d)).astype(dtype)[:, :, :tk] for _ in range(graph)]
    mx.eval(qs, ks, vs)
    scale = 1.0 / math.sqrt(d)
    mask = "causal" if causal else None
    contenders = {
        "mlx": lambda: [mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
                        for q, k, v in zip(qs, ks, vs)],
        "ours": lambda: [ops.attention(q, k, v, mask, scale=scale) for q, k, v in zip(qs, ks, vs)],
        "ours_1t": lambda: [ops.attention(q, k, v, mask, scale=scale) for q, k, v in zip(qs, ks, vs)],
    }
    params = {"model": name, "shape": {"B": b, "Hq": hq, "Hk": hk, "Tq": tq, "Tk": tk, "D": d}, "kv_buffer": alloc,
              "mask": mask or "none", "dtype": str(dtype).split(".")[-1]}
    return summarize("attention", params, alternate(contenders, rounds), "mlx", graph)


ATTENTION_CASES = [  # name, B, Hq, Hk, Tq, Tk, D, causal
    ("gemma3-270m prefill", 1, 4, 1, 256, 256, 256, True),
    ("gemma3-270m decode", 1, 4, 1, 1, 256, 256, False),
    ("gemma3-270m decode", 1, 4, 1, 1, 1024, 256, False),
    ("llama-3.2-1b prefill", 1, 32, 8, 512, 512, 64, True),
    ("llama-3.2-1b decode", 1, 32, 8, 1, 512, 64, False),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", type=int, default=4, help="independent ops per evaluated graph")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--only", choices=["glu", "attention"], default=None)
    args = p.parse_args()
    mx.set_default_device(mx.cpu)
    header()
    if args.only != "attention":
        for rows, cols in [(256, 2048), (1, 8192)]:
            for kind in ("geglu", "swiglu"):
                emit(bench_glu(rows, cols, kind, args.graph, args.rounds))
    if args.only != "glu":
        for case in ATTENTION_CASES:
            emit(bench_attention(*case, graph=args.graph, rounds=args.rounds))


if __name__ == "__main__":
    main()
