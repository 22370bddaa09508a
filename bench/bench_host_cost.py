"""What one op costs the host, ours against MLX's own quantized_matmul, on any device: JSON lines.

A decode step is hundreds of small ops, so what each op costs before its kernel runs (building the graph node,
the primitive's eval_gpu/eval_cpu, the launch) decides tokens per second as much as the kernels do. Here every
op is so small that its kernel is negligible: a dependent chain of `--chain` products y <- op(y) of a (1, D)
vector with a D x D weight (D = 256 by default: 32-72 KB of weight), one evaluation per chain, so the wall
time per op is the host's cost per op (or the launch latency, whichever is larger), and the process's CPU
time per op is what the host threads spent. Contenders, alternated within each round: our quantized_matmul on
the blocks of each of `--types` (Q4_0 by default), MLX's `mx.quantized_matmul` (affine 4-bit, group 64: what mlx-lm's `nn.quantize` makes) and
MLX's float16 matmul, plus our rms_norm against `mx.fast.rms_norm` (the smallest op of a layer)."""

import argparse
import os
import time

import mlx.core as mx
import numpy as np

from common import emit, header
from mlx_ggml_ext import GGMLType, _ext, ops, reference


def chain_cost(step, y0, chain: int):
    """Wall and process-CPU seconds per op of one evaluated chain of `chain` ops."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    y = y0
    for _ in range(chain):
        y = step(y)
    mx.eval(y)
    return (time.perf_counter() - wall0) / chain, (time.process_time() - cpu0) / chain


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--chain", type=int, default=256, help="dependent ops per evaluated graph")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--types", default="Q4_0", help="our block types to time (e.g. Q4_0,Q4_K,Q6_K,Q8_0: the "
                   "decode route, and so the kernel nodes per product, differ by type)")
    args = p.parse_args()
    header()
    d = args.dim
    rng = np.random.default_rng(0)
    w = mx.array(rng.standard_normal((d, d)).astype(np.float32) * (1.0 / np.sqrt(d)))
    dtype = mx.float32 if mx.default_device() == mx.cpu else mx.float16
    w16 = w.astype(dtype)
    types = [GGMLType[t.strip().upper()] for t in args.types.split(",") if t.strip()]
    # Random blocks (any type, the IQ grids included, which ops.quantize does not make): a product's host cost
    # does not depend on the values.
    blocks = {t: mx.array(reference.random_blocks(rng, t.name, d, d, scales=(0.01, 0.02))) for t in types}
    affine = mx.quantize(w16, group_size=64, bits=4)
    norm_w = mx.ones((d,), dtype=dtype)
    y0 = mx.array(rng.standard_normal((1, d)).astype(np.float32)).astype(dtype)
    mx.eval(w16, list(blocks.values()), affine, norm_w, y0)
    contenders = {f"ours_{t.name.lower()}": (lambda y, t=t: ops.quantized_matmul(y, blocks[t], t)) for t in types}
    # The same primitives called as the package's nn modules call them (the extension's binding directly, without
    # ops' Python checks of types and shapes): what a model's step pays per op.
    contenders.update({f"ours_{t.name.lower()}_binding": (lambda y, t=t: _ext.quantized_matmul(y, blocks[t], int(t)))
                       for t in types})
    contenders["ours_rms_norm_binding"] = lambda y: _ext.rms_norm(y, norm_w, 1e-6)
    contenders.update({
        "mlx_affine4": lambda y: mx.quantized_matmul(y, *affine, transpose=True, group_size=64, bits=4),
        "mlx_matmul": lambda y: y @ w16.T,
        "ours_rms_norm": lambda y: ops.rms_norm(y, norm_w, 1e-6),
        "mlx_fast_rms_norm": lambda y: mx.fast.rms_norm(y, norm_w, 1e-6),
    })
    samples = {k: [] for k in contenders}
    for r in range(args.rounds + 2):  # two warm-up rounds, dropped
        for name, step in contenders.items():
            if r >= 2:
                samples[name].append(chain_cost(step, y0, args.chain))
            else:
                chain_cost(step, y0, args.chain)
    for name, s in samples.items():
        wall = float(np.median([a for a, _ in s]))
        cpu = float(np.median([b for _, b in s]))
        emit({"bench": "host_cost", "op": name, "dim": d, "chain": args.chain, "dtype": str(dtype),
              "device": str(mx.default_device()), "rounds": args.rounds,
              # our CUDA buffer cache's limit (csrc/backend/cuda/buffer_cache.h; unset: 256 MB, 0: off)
              "cuda_cache_mb": os.environ.get("MLX_GGML_EXT_CUDA_CACHE_MB", "default"),
              "wall_us_per_op": wall * 1e6,
              "process_cpu_us_per_op": cpu * 1e6})


if __name__ == "__main__":
    main()
