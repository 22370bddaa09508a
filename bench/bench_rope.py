"""rope against mx.fast.rope and the streaming roofline, one run.

Our op runs on ggml's layout (B, T, H, D); mx.fast.rope gets the same data in MLX's
(B, H, T, D) layout (copied once, outside the timing). Each timed evaluation holds
`--graph` independent ops on distinct inputs so MLX's per-eval overhead is amortized
and the data does not sit in cache between ops."""

import argparse

import mlx.core as mx

from common import add_run_options, device_name, emit, header, interleaved_samples, streaming_op_fields, with_cpu_roofline
from mlx_ggml_ext import ops

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def run(shape, mode: str, dtype_name: str, graph: int, rounds: int) -> dict:
    dtype = DTYPES[dtype_name]
    batch, tokens, heads, dim = shape
    xs = [mx.random.normal(shape).astype(dtype) for _ in range(graph)]
    xs_mlx = [mx.contiguous(x.transpose(0, 2, 1, 3)) for x in xs]
    positions = mx.arange(tokens, dtype=mx.int32)
    mx.eval(xs, xs_mlx, positions)
    traditional = mode == "normal"
    moved = 2 * xs[0].nbytes  # read x, write y (positions and the angle tables stay in cache)
    samples = interleaved_samples(with_cpu_roofline({
        "ours": lambda: [ops.rope(x, positions, dim, mode) for x in xs],
        "mlx": lambda: [mx.fast.rope(x, dim, traditional=traditional, base=10000.0, scale=1.0, offset=0)
                        for x in xs_mlx],
    }, graph * moved // 2, graph * moved // 2), rounds=rounds)
    record = {
        "bench": "rope", "shape": list(shape), "mode": mode, "dtype": dtype_name, "device": device_name(),
        "graph_ops": graph, **streaming_op_fields(samples, graph, moved),
    }
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="1x512x32x128", help="B x T x H x D (ggml layout)")
    p.add_argument("--modes", default="normal,neox")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    add_run_options(p, rounds=20)
    args = p.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    header(raise_cache_limit=not args.mlx_default_cache)
    for dtype in args.dtypes.split(","):
        for mode in args.modes.split(","):
            emit(run(shape, mode, dtype, args.graph, args.rounds))


if __name__ == "__main__":
    main()
