"""dequantize per ggml type against the streaming roofline, MLX's own dequantize of a comparable format, and
the kernel alone; then quantize throughput. One run, JSON lines.

Each timed evaluation holds `--graph` dequantize ops on distinct inputs. Bytes counted: blocks read plus
float32 written (dequantize is write-bound: 4-bit blocks are about 1/7 of the output). The roofline is a
threaded streaming copy of max(read, written) bytes on the same pool, measured in the same run, counted as
2 x that (read + write), so it is if anything generous to the copy: a copy moves equal volumes both ways
while dequantize mostly writes. Plain stores throughout (no non-temporal stores), as in the copy.
fraction_of_roofline: the best op time against bench/common.py's best-of-7 copy; fraction_of_median_roofline:
the median op time against the median of a copy sampled in every timing round (steadier on a shared,
noisy machine); kernel_only_fraction: the kernel's best time against the best-of-7 copy.

The MLX comparison: mx.dequantize of MLX's own quantized format with the same bits per weight and group 32
(affine; mode "mxfp4" for MXFP4; float16/bfloat16 -> float32 is astype): the built-in that does the same job
for MLX's formats. Different formats, so it says how the cost compares, not which output is "right".
"kernel_only": the same kernel called from C++ on preallocated, faulted-in buffers (no graph, no allocation),
which shows how much of the gap to the roofline is MLX's per-op cost rather than the kernel."""

import argparse
import statistics

import mlx.core as mx
import numpy as np

from common import add_run_options, cpu_roofline_gbs, device_name, emit, header, interleaved
from mlx_ggml_ext import GGMLType, _ext, ops

# MLX's comparable quantization of each ggml type: (bits, mode); None: astype from the float type.
MLX_COUNTERPART = {
    "F16": None, "BF16": None, "Q4_0": (4, "affine"), "Q4_1": (4, "affine"), "Q5_0": (5, "affine"),
    "Q5_1": (5, "affine"), "Q8_0": (8, "affine"), "Q2_K": (2, "affine"), "Q3_K": (3, "affine"),
    "Q4_K": (4, "affine"), "Q5_K": (5, "affine"), "Q6_K": (6, "affine"), "IQ4_NL": (4, "affine"),
    "IQ4_XS": (4, "affine"), "MXFP4": (4, "mxfp4"),
}
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(rng, t: GGMLType, rows: int, k: int) -> mx.array:
    """Valid blocks of realistic values: our quantizer where there is one, else random bytes with the
    float16 scales of normal weights (the kernel does not branch on values)."""
    if t.name in QUANTIZABLE or t.is_float:
        return ops.quantize(mx.array(rng.standard_normal((rows, k)).astype(np.float32)), t)
    data = rng.integers(0, 256, (rows * k // t.block_size, t.type_size), dtype=np.uint8)
    scale_offsets = {"Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0]}[t.name]
    for off in scale_offsets:
        data[:, off:off + 2] = np.full((data.shape[0], 1), 0.01, np.float16).view(np.uint8)
    return mx.array(data.reshape(rows, -1))


def mlx_counterpart(name: str, w: mx.array):
    spec = MLX_COUNTERPART[name]
    if spec is None:
        x = w.astype(mx.float16 if name == "F16" else mx.bfloat16)
        mx.eval(x)
        return lambda: x.astype(mx.float32)
    bits, mode = spec
    q = mx.quantize(w, group_size=32, bits=bits, mode=mode)
    mx.eval(q)
    return lambda: mx.dequantize(*q, group_size=32, bits=bits, mode=mode)


def bench_dequantize(name: str, rows: int, k: int, graph: int, rounds: int) -> dict:
    t = GGMLType.of(name)
    rng = np.random.default_rng(int(t))
    blocks = [random_blocks(rng, t, rows, k) for _ in range(graph)]
    w = mx.random.normal((rows, k))
    mx.eval(blocks, w)
    theirs = [mlx_counterpart(name, w) for _ in range(graph)]
    read, written = rows * t.row_bytes(k), rows * k * 4
    contenders = {
        "ours": lambda: [ops.dequantize(b, t, (rows, k)) for b in blocks],
        "mlx": lambda: [f() for f in theirs],
    }
    # The copy roofline sampled once per round too (its own timing, buffers faulted in beforehand): on a
    # shared machine the median of both under the same conditions is the steadier ratio.
    copy_bytes = graph * max(read, written)
    copies = []
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for contender, seconds in interleaved(contenders, rounds=1, warmup=1 if times["ours"] else 3).items():
            times[contender].append(seconds)
        copies.append(2 * copy_bytes / _ext.measure_stream("copy", copy_bytes, 1) / 1e9)
    per_op = {key: statistics.median(v) / graph for key, v in times.items()}
    best_op = min(times["ours"]) / graph
    # the kernel alone over the graph's bytes (all `graph` tensors at once, so nothing stays in cache)
    kernel = _ext.time_dequantize_kernel(int(t), graph * rows * k // t.block_size, 7) / graph
    record = {
        "bench": "dequantize", "type": name, "shape": [rows, k], "dtype": "float32", "device": device_name(),
        "graph_ops": graph, "time_us": per_op["ours"] * 1e6, "best_time_us": best_op * 1e6,
        "mlx_time_us": per_op["mlx"] * 1e6,
        "speedup_vs_mlx": per_op["mlx"] / per_op["ours"],
        "written_gbs": written / per_op["ours"] / 1e9, "read_gbs": read / per_op["ours"] / 1e9,
        "gbs": (read + written) / per_op["ours"] / 1e9,
        "kernel_only_us": kernel * 1e6, "kernel_only_gbs": (read + written) / kernel / 1e9,
    }
    if mx.default_device() == mx.cpu:
        roof = cpu_roofline_gbs(graph * read, graph * written)
        median_roof = statistics.median(copies)
        # like for like: best op time against the best-of copy, median against the median copy
        record.update(roofline_gbs=roof, fraction_of_roofline=(read + written) / best_op / 1e9 / roof,
                      kernel_only_fraction=record["kernel_only_gbs"] / roof,
                      median_roofline_gbs=median_roof, fraction_of_median_roofline=record["gbs"] / median_roof)
    return record


def bench_quantize(name: str, rows: int, k: int, rounds: int) -> dict:
    t = GGMLType.of(name)
    w = mx.random.normal((rows, k))
    mx.eval(w)
    bits, mode = MLX_COUNTERPART[name]
    times = interleaved({
        "ours": lambda: ops.quantize(w, t),
        "mlx": lambda: mx.quantize(w, group_size=32, bits=bits, mode=mode),
    }, rounds=rounds, warmup=1)
    return {"bench": "quantize", "type": name, "shape": [rows, k], "device": device_name(),
            "time_ms": times["ours"] * 1e3, "input_gbs": rows * k * 4 / times["ours"] / 1e9,
            "melements_per_s": rows * k / times["ours"] / 1e6,
            "mlx_quantize_time_ms": times["mlx"] * 1e3}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1024x4096")
    p.add_argument("--types", default=",".join(MLX_COUNTERPART))
    p.add_argument("--quantize-shape", default="256x4096")
    p.add_argument("--no-quantize", action="store_true")
    add_run_options(p, rounds=20)
    args = p.parse_args()
    rows, k = (int(v) for v in args.shape.split("x"))
    header(raise_cache_limit=not args.mlx_default_cache)
    for name in args.types.split(","):
        emit(bench_dequantize(name.upper(), rows, k, args.graph, args.rounds))
    if not args.no_quantize:
        qrows, qk = (int(v) for v in args.quantize_shape.split("x"))
        for name in QUANTIZABLE:
            emit(bench_quantize(name, qrows, qk, max(3, args.rounds // 4)))


if __name__ == "__main__":
    main()
