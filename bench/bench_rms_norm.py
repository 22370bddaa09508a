"""rms_norm against mx.fast.rms_norm and the streaming roofline, one run.

Each timed evaluation holds `--graph` independent ops on distinct inputs so MLX's
per-eval overhead is amortized and the data does not sit in cache between ops."""

import argparse

import mlx.core as mx

from common import add_run_options, device_name, emit, header, interleaved_samples, streaming_op_fields, with_cpu_roofline
from mlx_ggml_ext import ops

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def run(rows: int, dim: int, dtype_name: str, graph: int, rounds: int) -> dict:
    dtype = DTYPES[dtype_name]
    xs = [mx.random.normal((rows, dim)).astype(dtype) for _ in range(graph)]
    w = mx.random.normal((dim,)).astype(dtype)
    mx.eval(xs, w)
    moved = 2 * rows * dim * xs[0].itemsize  # read x, write y (w stays in cache)
    samples = interleaved_samples(with_cpu_roofline({
        "ours": lambda: [ops.rms_norm(x, w, 1e-6) for x in xs],
        "mlx": lambda: [mx.fast.rms_norm(x, w, 1e-6) for x in xs],
    }, graph * moved // 2, graph * moved // 2), rounds=rounds)
    record = {
        "bench": "rms_norm", "shape": [rows, dim], "dtype": dtype_name, "device": device_name(),
        "graph_ops": graph, **streaming_op_fields(samples, graph, moved),
    }
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="512x4096")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    add_run_options(p, rounds=30)
    args = p.parse_args()
    rows, dim = (int(v) for v in args.shape.split("x"))
    header(raise_cache_limit=not args.mlx_default_cache)
    for name in args.dtypes.split(","):
        emit(run(rows, dim, name, args.graph, args.rounds))


if __name__ == "__main__":
    main()
