"""quantized_matmul per ggml type: decode (m = 1..8 rows of x) against the streaming-read roofline of the
weight's bytes and MLX's own 4-bit quantized_matmul, prefill (m = 256) against MLX's float32 matmul. One run,
JSON lines.

Decode is memory-bound: each evaluated graph holds `--graph` products on distinct weights (so the weights do
not stay in the 32 MB L3), and the roofline is a threaded streaming read of the same number of bytes on the
kernels' own thread pool (same threads), sampled in the same rounds (medians against medians).
mlx_q4: mx.quantized_matmul with MLX's 4-bit affine format, group 32, at the same shape (its CPU kernel is
measured once per shape and m, a few rounds). Prefill: GFLOP/s (2*m*N*K per product) of ours and of
mx.matmul on float32 (x @ W.T with W dense), same shape, same rounds."""

import argparse
import statistics

import mlx.core as mx
import numpy as np

from common import add_run_options, device_name, emit, header, interleaved, timed
from mlx_ggml_ext import GGMLType, _ext, ops, reference

HEADLINE = ["Q4_0", "Q8_0", "Q4_K", "Q6_K"]
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K"]


def weight_blocks(rng, t: GGMLType, n: int, k: int) -> mx.array:
    """Valid blocks: our quantizer of normal data where there is one, else random codes with small float16
    scales (the kernels do not branch on values)."""
    if t.name in QUANTIZABLE or t.is_float:
        return ops.quantize(mx.random.normal((n, k), key=mx.random.key(int(rng.integers(1 << 30)))), t)
    return mx.array(reference.random_blocks(rng, t.name, n, k, scales=(0.01, 0.01)))


def median_interleaved(contenders, rounds):
    return interleaved(contenders, rounds=rounds, warmup=2)


def bench_decode(t: GGMLType, n: int, k: int, ms, graph: int, rounds: int, mlx_times: dict) -> None:
    rng = np.random.default_rng(int(t) + n)
    weights = [weight_blocks(rng, t, n, k) for _ in range(graph)]
    mx.eval(weights)
    wbytes = weights[0].size
    per_m = {}
    for m in ms:
        xs = [mx.random.normal((m, k)) for _ in range(graph)]
        mx.eval(xs)
        per_op = median_interleaved({
            "ours": lambda: [ops.quantized_matmul(x, w, t) for x, w in zip(xs, weights)],
            "roofline": lambda: _ext.measure_stream("read", graph * wbytes, 1),
        }, rounds)
        ours, roof = per_op["ours"] / graph, per_op["roofline"] / graph
        per_m[m] = ours
        record = {"bench": "quantized_matmul_decode", "type": t.name, "shape": [n, k], "m": m,
                  "device": device_name(), "graph_ops": graph, "time_us": ours * 1e6,
                  "weight_gbs": wbytes / ours / 1e9, "read_roofline_gbs": wbytes / roof / 1e9,
                  "fraction_of_roofline": roof / ours, "time_vs_m1": ours / per_m[ms[0]]}
        if (n, k, m) in mlx_times:
            record.update(mlx_q4_time_us=mlx_times[(n, k, m)] * 1e6, speedup_vs_mlx_q4=mlx_times[(n, k, m)] / ours)
        emit(record)


def mlx_q4_seconds(n: int, k: int, m: int, rounds: int) -> float:
    w = mx.random.normal((n, k))
    q = mx.quantize(w, group_size=32, bits=4)
    x = mx.random.normal((m, k))
    mx.eval(q, x)
    return statistics.median(timed(lambda: mx.quantized_matmul(x, *q, transpose=True, group_size=32, bits=4))
                             for _ in range(rounds))


def bench_prefill(t: GGMLType, n: int, k: int, m: int, rounds: int) -> None:
    rng = np.random.default_rng(int(t))
    w = weight_blocks(rng, t, n, k)
    dense = ops.dequantize(w, t, (n, k))
    x = mx.random.normal((m, k))
    mx.eval(w, dense, x)
    per = median_interleaved({
        "ours": lambda: ops.quantized_matmul(x, w, t),
        "mlx_f32": lambda: mx.matmul(x, dense.T),
    }, rounds)
    flop = 2.0 * m * n * k
    emit({"bench": "quantized_matmul_prefill", "type": t.name, "shape": [n, k], "m": m, "device": device_name(),
          "time_ms": per["ours"] * 1e3, "gflops": flop / per["ours"] / 1e9,
          "mlx_f32_matmul_gflops": flop / per["mlx_f32"] / 1e9, "speedup_vs_mlx_f32": per["mlx_f32"] / per["ours"]})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="14336x4096,4096x14336", help="weight shapes N x K")
    p.add_argument("--types", default=",".join(t.name for t in GGMLType if not t.is_float) + ",F16")
    p.add_argument("--m", default="1,2,4,8", help="decode rows of x (the first is the reference for time_vs_m1)")
    p.add_argument("--prefill-m", type=int, default=256)
    p.add_argument("--prefill-types", default=",".join(HEADLINE))
    p.add_argument("--mlx-rounds", type=int, default=3)
    add_run_options(p, rounds=10)
    p.set_defaults(graph=3)
    args = p.parse_args()
    header(raise_cache_limit=not args.mlx_default_cache)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    mlx_times = {(n, k, m): mlx_q4_seconds(n, k, m, args.mlx_rounds) for n, k in shapes for m in (ms[0], ms[-1])}
    names = args.types.split(",")
    names = [n for n in HEADLINE if n in names] + [n for n in names if n not in HEADLINE]
    for name in names:
        for n, k in shapes:
            bench_decode(GGMLType.of(name), n, k, ms, args.graph, args.rounds, mlx_times)
    for name in args.prefill_types.split(","):
        n, k = shapes[0]
        bench_prefill(GGMLType.of(name), n, k, args.prefill_m, max(3, args.rounds // 2))


if __name__ == "__main__":
    main()
