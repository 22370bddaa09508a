"""`mlx-ggml-ext` (or `python -m mlx_ggml_ext`): the package's command line.

`check` (the default) prints the versions and backends, checks every op on small random inputs against its
float64 reference on every available device, and times each op against MLX's built-in counterpart (each op
adds one entry to CHECKS and one to SPEEDS). `generate` and `inspect` run and describe GGUF models
(mlx_ggml_ext/models/cli.py)."""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

import mlx_ggml_ext
from mlx_ggml_ext import ops, reference


def _f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def _rel_err(got: mx.array, expected: np.ndarray) -> float:
    return float(np.max(np.abs(_f64(got) - expected)) / max(np.max(np.abs(expected)), 1e-30))


# ----------------------------------------------------------------------------- checks
# Each returns the relative error against the reference and the bound it must meet.

def check_rms_norm(rng, dtype):
    x = mx.array(rng.standard_normal((8, 1000)).astype(np.float32)).astype(dtype)
    w = mx.array(rng.standard_normal(1000).astype(np.float32)).astype(dtype)
    bound = {mx.float32: 2e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3}[dtype]
    return _rel_err(ops.rms_norm(x, w, 1e-5), reference.rms_norm(_f64(x), _f64(w), 1e-5)), bound


def check_rope(rng, dtype):
    x = mx.array(rng.standard_normal((2, 64, 8, 128)).astype(np.float32)).astype(dtype)
    positions = rng.integers(0, 100_000, 64).astype(np.int32)
    bound = {mx.float32: 2e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3}[dtype]
    got = ops.rope(x, mx.array(positions), 128, "neox", ext_factor=0.5, n_ctx_orig=4096)
    return _rel_err(got, reference.rope(_f64(x), positions, 128, "neox", ext_factor=0.5, n_ctx_orig=4096)), bound


def check_dequantize(rng, dtype):
    """Every ggml type, random blocks with finite scales, against the SPEC's float64 decoder."""
    worst = 0.0
    for t in filter(lambda t: reference.has_decoder(t.name), mlx_ggml_ext.GGMLType):  # grids: gguf's
        k = 8 * max(t.block_size, 32)
        data = reference.random_blocks(rng, t.name, 4, k)
        got = ops.dequantize(mx.array(data), t, (4, k), dtype)
        worst = max(worst, _rel_err(got, reference.dequantize(data, t.name, (4, k))))
    return worst, {mx.float32: 1e-6, mx.float16: 1e-3, mx.bfloat16: 8e-3}[dtype]


def check_quantized_matmul(rng, dtype):
    """Every ggml type: NMSE of x @ W^T against float64 math on the blocks as the SPEC decodes them
    (ggml's own MUL_MAT tolerance is 5e-4; quantized weights meet int8 activations on the CPU)."""
    worst = 0.0
    for t in filter(lambda t: reference.has_decoder(t.name), mlx_ggml_ext.GGMLType):  # grids: gguf's
        k = 512
        data = reference.random_blocks(rng, t.name, 24, k)
        x = mx.array(rng.standard_normal((3, k)).astype(np.float32)).astype(dtype)
        got = _f64(ops.quantized_matmul(x, mx.array(data), t))
        expected = _f64(x) @ reference.dequantize(data, t.name, (24, k)).T
        worst = max(worst, float(np.sum((got - expected) ** 2) / np.sum(expected ** 2)))
        if t in ops.PACKABLE_TYPES and mx.default_device() == mx.cpu:  # the same rows packed for the CPU
            got = _f64(ops.quantized_matmul(x, ops.pack_rows(mx.array(data), t), t.name + "_R8"))
            worst = max(worst, float(np.sum((got - expected) ** 2) / np.sum(expected ** 2)))
    return worst, 2e-4


CHECKS = [("rms_norm", check_rms_norm), ("rope", check_rope), ("dequantize", check_dequantize),
          ("quantized_matmul NMSE", check_quantized_matmul)]

# ----------------------------------------------------------------------------- speed
# Each returns (label, our op, MLX's built-in) on inputs built once.

def speed_rms_norm():
    x = mx.random.normal((512, 4096))
    w = mx.random.normal((4096,))
    mx.eval(x, w)
    return "rms_norm 512x4096 f32", (lambda: ops.rms_norm(x, w)), (lambda: mx.fast.rms_norm(x, w, 1e-6))


def speed_rope():
    x = mx.random.normal((1, 512, 32, 128))
    x_mlx = mx.contiguous(x.transpose(0, 2, 1, 3))  # MLX's (B, H, T, D) layout
    mx.eval(x, x_mlx)
    return ("rope 1x512x32x128 f32 neox", (lambda: ops.rope(x, 0, 128, "neox")),
            (lambda: mx.fast.rope(x_mlx, 128, traditional=False, base=10000.0, scale=1.0, offset=0)))


def speed_dequantize():
    # MLX's built-in counterpart: mx.dequantize of its own 4-bit affine format (group 32), same shape.
    w = mx.random.normal((1024, 4096))
    blocks = ops.quantize(w, "q4_k", stream=mx.cpu)  # the quantizers are CPU-only
    mlx_q = mx.quantize(w, group_size=32, bits=4)
    mx.eval(blocks, mlx_q)
    return ("dequantize q4_k 1024x4096", (lambda: ops.dequantize(blocks, "q4_k", (1024, 4096))),
            (lambda: mx.dequantize(*mlx_q, group_size=32, bits=4)))


def speed_quantized_matmul():
    # MLX's built-in counterpart: mx.quantized_matmul on its own 4-bit affine format (group 32), same shape;
    # one row of x (decode), four weights per evaluation so that they do not all stay in cache.
    ws = [mx.random.normal((4096, 4096)) for _ in range(4)]
    blocks = [ops.quantize(w, "q4_0", stream=mx.cpu) for w in ws]
    mlx_q = [mx.quantize(w, group_size=32, bits=4) for w in ws]
    x = mx.random.normal((1, 4096))
    mx.eval(blocks, mlx_q, x)
    return ("quantized_matmul q4_0 4x(1x4096 @ 4096x4096)", (lambda: [ops.quantized_matmul(x, b, "q4_0") for b in blocks]),
            (lambda: [mx.quantized_matmul(x, *q, transpose=True, group_size=32, bits=4) for q in mlx_q]))


SPEEDS = [speed_rms_norm, speed_rope, speed_dequantize, speed_quantized_matmul]


def _short(x) -> str:
    return str(x).split(".")[-1]


def _median_time(fn, reps):
    mx.eval(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    from .models import cli as models_cli
    parser = argparse.ArgumentParser(
        prog="mlx-ggml-ext",
        description="ggml's quantized formats and operations in MLX: run GGUF models, inspect GGUF files, and "
                    "check this installation's ops. Without a command: check.")
    parser.add_argument("--reps", type=int, default=20, help="check: timed repetitions per op")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    check = commands.add_parser("check", help="check every op against a float64 reference and time it",
                                description="Print the versions and backends, check every op on small random "
                                            "inputs against a float64 reference on every available device, and "
                                            "time each op against MLX's built-in counterpart.")
    check.add_argument("--reps", type=int, default=20, help="timed repetitions per op")
    check.set_defaults(run=run_checks)
    models_cli.add_parsers(commands)
    args = parser.parse_args(argv)
    return getattr(args, "run", run_checks)(args)


def run_checks(args) -> int:
    b = mlx_ggml_ext.backends()
    print(f"mlx-ggml-ext {mlx_ggml_ext.__version__}, MLX {mx.__version__}")
    print(f"GPU backend built: {b['gpu_backend_built']}; available: CPU yes, "
          f"CUDA {'yes' if b['cuda'] else 'no'}, Metal {'yes' if b['metal'] else 'no'}")
    print(f"CPU kernels: {mlx_ggml_ext.cpu_isa()} x {mlx_ggml_ext.num_threads()} threads")

    devices = [mx.cpu] + ([mx.gpu] if (b["cuda"] or b["metal"]) else [])
    rng = np.random.default_rng(0)
    failures = 0
    print("\ncorrectness (max relative error vs float64 reference)")
    for device in devices:
        with mx.stream(device):
            for name, check in CHECKS:
                for dtype in (mx.float32, mx.float16, mx.bfloat16):
                    try:
                        err, bound = check(rng, dtype)
                        ok = err <= bound
                        detail = f"{err:.2e} (bound {bound:.0e})"
                    except Exception as e:  # a backend without the op reports it, never hides it
                        ok, detail = False, f"{type(e).__name__}: {e}"
                    failures += not ok
                    print(f"  {_short(device):<5} {name:<18} {_short(dtype):<9} {'ok ' if ok else 'FAIL'} {detail}")

    print("\nspeed (median per evaluation; ratio = MLX built-in time / ours)")
    for device in devices:
        with mx.stream(device):
            for make in SPEEDS:
                label, ours, builtin = make()
                t_ours, t_mlx = _median_time(ours, args.reps), _median_time(builtin, args.reps)
                print(f"  {_short(device):<5} {label:<28} ours {t_ours * 1e6:9.1f} us   "
                      f"MLX {t_mlx * 1e6:9.1f} us   x{t_mlx / t_ours:.1f}")
    print("\nall checks passed" if failures == 0 else f"\n{failures} check(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
