"""The CUDA kernels on one GPU, one run, JSON lines: rms_norm, rope, dequantize and (when the build has it)
quantized_matmul, against MLX's built-ins and the device-to-device copy bandwidth measured in the same run.

Time per op = one evaluated graph of `--graph` independent ops on distinct inputs, divided by their count
(MLX's per-eval overhead is then shared); `latency_us` is one op evaluated alone. Times are medians over
rounds in which every contender runs once.

Where outputs live on the GPU (MLX_GGML_EXT_CUDA_MEMORY: device, managed or prefetch; see
csrc/backend/cuda/launch.h) is read once per process: `--compare-memory` runs the rms_norm, rope and a decode
matmul case once per policy in child processes, each record naming its policy."""

import argparse
import ctypes
import glob
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np

from common import emit, header, interleaved
from mlx_ggml_ext import GGMLType, ops, reference

MEMORY_POLICY = os.environ.get("MLX_GGML_EXT_CUDA_MEMORY") or "device"
MEMORY_POLICIES = ("device", "managed", "prefetch")


def graph_of(make, inputs):
    return lambda: [make(x) for x in inputs]


def per_op_us(contenders, graph, rounds):
    return {k: v / graph * 1e6 for k, v in interleaved(contenders, rounds=rounds).items()}


def latency_us(make, x, rounds):
    """One op evaluated alone (make() when x is None)."""
    one = (lambda: make()) if x is None else (lambda: make(x))
    return interleaved({"one": one}, rounds=rounds)["one"] * 1e6


class CudaRuntime:
    """cudaMemcpyAsync device-to-device timed with CUDA events, through the CUDA runtime library (ctypes)."""

    def __init__(self):
        names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        for site in sys.path:
            names += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*")))
        self.lib = None
        for name in names:
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue

    def copy_gbs(self, nbytes, repeats=20):
        """Bytes read plus bytes written per second of the best of `repeats` copies."""
        if self.lib is None:
            return None
        lib = self.lib
        src, dst = ctypes.c_void_p(), ctypes.c_void_p()
        if lib.cudaMalloc(ctypes.byref(src), ctypes.c_size_t(nbytes)) != 0:
            return None  # no usable GPU (the smoke run on a CPU)
        if lib.cudaMalloc(ctypes.byref(dst), ctypes.c_size_t(nbytes)) != 0:
            lib.cudaFree(src)
            return None
        lib.cudaMemset(src, 1, ctypes.c_size_t(nbytes))
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        lib.cudaEventCreate(ctypes.byref(start))
        lib.cudaEventCreate(ctypes.byref(stop))
        best = float("inf")
        for _ in range(repeats + 1):
            lib.cudaEventRecord(start, None)
            lib.cudaMemcpyAsync(dst, src, ctypes.c_size_t(nbytes), 3, None)  # 3: device to device
            lib.cudaEventRecord(stop, None)
            lib.cudaEventSynchronize(stop)
            ms = ctypes.c_float()
            lib.cudaEventElapsedTime(ctypes.byref(ms), start, stop)
            best = min(best, ms.value / 1e3)
        lib.cudaFree(src)
        lib.cudaFree(dst)
        lib.cudaEventDestroy(start)
        lib.cudaEventDestroy(stop)
        return 2 * nbytes / best / 1e9


def bench_copy(runtime, args):
    nbytes = (4 << 20) if args.smoke else (256 << 20)
    memcpy = runtime.copy_gbs(nbytes)
    xs = [mx.random.normal((nbytes // 2 // 4096, 4096)).astype(mx.float16) for _ in range(8)]
    mx.eval(xs)
    t = per_op_us({"copy": graph_of(lambda x: x * 1, xs)}, len(xs), args.rounds)["copy"]
    mlx_copy = 2 * nbytes / (t * 1e-6) / 1e9
    record = {"bench": "copy_roofline", "bytes": nbytes, "cuda_memcpy_d2d_gbs": memcpy, "mlx_copy_gbs": mlx_copy}
    emit(record)
    return memcpy or mlx_copy


def roofline_record(moved, us, copy_gbs):
    gbs = moved / (us * 1e-6) / 1e9
    return {"gbs": gbs, "fraction_of_copy": gbs / copy_gbs}


def bench_rms_norm(args, copy_gbs):
    rows, dim = (256, 4096) if args.smoke else (4096, 4096)
    xs = [mx.random.normal((rows, dim)).astype(mx.float16) for _ in range(args.graph)]
    w = mx.random.normal((dim,)).astype(mx.float16)
    mx.eval(xs, w)
    ours = lambda x: ops.rms_norm(x, w, 1e-6)
    mlx = lambda x: mx.fast.rms_norm(x, w, 1e-6)
    t = per_op_us({"ours": graph_of(ours, xs), "mlx": graph_of(mlx, xs)}, args.graph, args.rounds)
    moved = 2 * rows * dim * 2
    emit({"bench": "rms_norm", "shape": [rows, dim], "dtype": "float16", "graph_ops": args.graph, "memory": MEMORY_POLICY,
          "time_us": t["ours"], "mlx_fast_time_us": t["mlx"], "speedup_vs_mlx_fast": t["mlx"] / t["ours"],
          **roofline_record(moved, t["ours"], copy_gbs),
          "latency_us": latency_us(ours, xs[0], args.rounds), "mlx_fast_latency_us": latency_us(mlx, xs[0], args.rounds)})


def bench_rope(args, copy_gbs):
    b, tokens, heads, dim = (1, 64, 4, 128) if args.smoke else (1, 2048, 32, 128)
    xs = [mx.random.normal((b, tokens, heads, dim)).astype(mx.float16) for _ in range(args.graph)]
    xs_mlx = [mx.contiguous(x.transpose(0, 2, 1, 3)) for x in xs]  # mx.fast.rope's (B, H, T, D)
    positions = mx.arange(tokens, dtype=mx.int32)
    mx.eval(xs, xs_mlx)
    moved = 2 * b * tokens * heads * dim * 2
    for mode, traditional in (("normal", True), ("neox", False)):
        ours = lambda x: ops.rope(x, positions, dim, mode, 10000.0)
        mlx = lambda x: mx.fast.rope(x, dim, traditional=traditional, base=10000.0, scale=1.0, offset=0)
        t = per_op_us({"ours": graph_of(ours, xs), "mlx": graph_of(mlx, xs_mlx)}, args.graph, args.rounds)
        emit({"bench": "rope", "mode": mode, "shape": [b, tokens, heads, dim], "dtype": "float16", "memory": MEMORY_POLICY,
              "graph_ops": args.graph, "time_us": t["ours"], "mlx_fast_time_us": t["mlx"],
              "speedup_vs_mlx_fast": t["mlx"] / t["ours"], **roofline_record(moved, t["ours"], copy_gbs),
              "latency_us": latency_us(ours, xs[0], args.rounds),
              "mlx_fast_latency_us": latency_us(mlx, xs_mlx[0], args.rounds)})


def random_blocks(t, rows, k, rng):
    """Random blocks with finite scales (like real weights), as an mx.array of bytes."""
    return mx.array(reference.random_blocks(rng, t.name, rows, k))


def bench_dequantize(args, copy_gbs):
    rows, k = (64, 1024) if args.smoke else (4096, 4096)
    rng = np.random.default_rng(0)
    graph = max(4, args.graph // 4)
    for t in GGMLType:
        datas = [random_blocks(t, rows, k, rng) for _ in range(graph)]
        mx.eval(datas)
        for out_dtype, name in ((mx.float32, "float32"), (mx.float16, "float16")):
            ours = lambda d: ops.dequantize(d, t, (rows, k), out_dtype)
            t_us = per_op_us({"ours": graph_of(ours, datas)}, graph, args.rounds)
            moved = datas[0].nbytes + rows * k * (4 if out_dtype == mx.float32 else 2)
            record = {"bench": "dequantize", "type": t.name, "shape": [rows, k], "out_dtype": name, "graph_ops": graph,
                      "memory": MEMORY_POLICY,
                      "time_us": t_us["ours"], **roofline_record(moved, t_us["ours"], copy_gbs)}
            emit(record)


QMM_TYPES = [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0]


def bench_quantized_matmul(args, copy_gbs):
    """Decode (m = 1..8) against the copy bandwidth (weight bytes) and MLX's 4-bit affine quantized_matmul;
    prefill (m = 512) in TFLOP/s against MLX's float16 matmul. Every op of a graph has its own weight copy,
    so the weights stream from memory rather than from L2."""
    rng = np.random.default_rng(1)
    graph = max(4, args.graph // 2)
    shapes = ((256, 512), (512, 256)) if args.smoke else ((4096, 14336), (14336, 4096))
    types, ms = QMM_TYPES, ([1, 8, 64] if args.smoke else list(range(1, 9)) + [512])
    if args.quick_matmul:  # the memory-policy comparison: one decode case
        shapes, types, ms = shapes[1:], types[:1], [1, 8]
    for n, k in shapes:
        w16 = [mx.random.normal((n, k)).astype(mx.float16) * 0.02 for _ in range(graph)]
        affine = [mx.quantize(w, group_size=64, bits=4) for w in w16]
        mx.eval(w16, affine)
        for t in types:
            blocks = [random_blocks(t, n, k, rng) for _ in range(graph)]
            mx.eval(blocks)
            m1_us = None
            for m in ms:
                x = mx.random.normal((m, k)).astype(mx.float16)
                mx.eval(x)
                ours = [lambda b=b: ops.quantized_matmul(x, b, t) for b in blocks]
                contenders = {"ours": lambda: [f() for f in ours]}
                if m > 8:
                    contenders["mlx_fp16"] = lambda: [x @ w.T for w in w16]
                elif t == QMM_TYPES[0]:
                    contenders["mlx_affine4"] = lambda: [mx.quantized_matmul(x, q, s, b, transpose=True, group_size=64,
                                                                             bits=4) for q, s, b in affine]
                us = per_op_us(contenders, graph, args.rounds)
                record = {"bench": "quantized_matmul", "type": t.name, "n": n, "k": k, "m": m, "x_dtype": "float16",
                          "graph_ops": graph, "memory": MEMORY_POLICY, "time_us": us["ours"],
                          "latency_us": latency_us(ours[0], None, args.rounds)}
                if m == 1:
                    m1_us = us["ours"]
                elif m <= 8 and m1_us:
                    record["time_vs_m1"] = us["ours"] / m1_us
                if m > 8:
                    flops = 2 * m * n * k
                    record.update({"tflops": flops / (us["ours"] * 1e-6) / 1e12,
                                   "mlx_fp16_tflops": flops / (us["mlx_fp16"] * 1e-6) / 1e12})
                else:
                    record.update(roofline_record(blocks[0].nbytes, us["ours"], copy_gbs))
                    if "mlx_affine4" in us:
                        record.update({"mlx_affine4_time_us": us["mlx_affine4"],
                                       "speedup_vs_mlx_affine4": us["mlx_affine4"] / us["ours"]})
                emit(record)
            del blocks


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--graph", type=int, default=32, help="independent ops per evaluated graph")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--only", default="rms_norm,rope,dequantize,quantized_matmul")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on any device: checks that the script runs")
    p.add_argument("--compare-memory", action="store_true",
                   help="run rms_norm, rope and one decode case under each output-memory policy (child processes)")
    p.add_argument("--quick-matmul", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare_memory:
        for policy in MEMORY_POLICIES:
            child = [sys.executable, __file__, "--only", "rms_norm,rope,quantized_matmul", "--quick-matmul",
                     "--graph", str(args.graph), "--rounds", str(args.rounds)] + (["--smoke"] if args.smoke else [])
            subprocess.run(child, env={**os.environ, "MLX_GGML_EXT_CUDA_MEMORY": policy}, check=True)
        return
    if not args.smoke and (mx.default_device() == mx.cpu or not mx.cuda.is_available()):
        raise SystemExit("bench_cuda.py needs MLX's CUDA build and a GPU (--smoke runs tiny shapes anywhere)")
    header()
    copy_gbs = bench_copy(CudaRuntime(), args)
    only = args.only.split(",")
    for name, fn in (("rms_norm", bench_rms_norm), ("rope", bench_rope), ("dequantize", bench_dequantize)):
        if name in only:
            fn(args, copy_gbs)
    if "quantized_matmul" in only and hasattr(ops, "quantized_matmul"):
        bench_quantized_matmul(args, copy_gbs)


if __name__ == "__main__":
    main()
