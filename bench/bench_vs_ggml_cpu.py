"""quantized_matmul on the CPU against ggml's own CPU backend, on the same machine, in one run: ggml's
`test-backend-ops perf -o MUL_MAT` (its cases weight 4096 x 14336, x n x 14336 float32: our 4096x14336 shape)
alternated with ours at the same shape, threads and weight handling (one weight buffer reused, as
test-backend-ops does; 4-bit 4096x14336 is 33 MB, about this L3's size). JSON lines: each round's times, then a
summary per type and n with the medians, ours over ggml's, and the read roofline of the weight's bytes measured
in the same rounds.

ggml is not a dependency: build its test-backend-ops once (any ggml checkout; CPU backend only), e.g.
    cmake -S ggml -B ggml/build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DGGML_BUILD_TESTS=ON
    cmake --build ggml/build --target test-backend-ops -j
and pass --ggml-bin ggml/build/bin/test-backend-ops. It runs on std::thread::hardware_concurrency() threads;
ours on mlx_ggml_ext.num_threads() (both recorded). Types our quantizer makes take its blocks of normal data,
the others (IQ grids, TQ1_0, IQ4_XS) random codes with small scales (bench_matmul.weight_blocks).

--ours-only times ours alone (no --ggml-bin): for before/after runs of two builds, each run with PYTHONPATH on
one build's package, alternated by the caller, --label naming the build."""

import argparse
import os
import re
import statistics
import subprocess
import time

import mlx.core as mx
import numpy as np

from bench_matmul import weight_blocks
from common import CACHE_LIMIT, device_name, emit, require_executable
from mlx_ggml_ext import GGMLType, _ext, num_threads, ops

N, K = 4096, 14336  # test-backend-ops' MUL_MAT perf shape (m=4096, k=14336)
# ggml's names of the types.
GGML_NAMES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0", "Q4_K": "q4_K",
              "Q5_K": "q5_K", "Q6_K": "q6_K", "MXFP4": "mxfp4", "IQ4_XS": "iq4_xs", "IQ2_XXS": "iq2_xxs",
              "IQ2_XS": "iq2_xs", "IQ2_S": "iq2_s", "IQ3_XXS": "iq3_xxs", "IQ3_S": "iq3_s", "IQ1_S": "iq1_s",
              "IQ1_M": "iq1_m", "TQ1_0": "tq1_0"}
LINE = re.compile(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=4096,n=(\d+),k=14336,bs=\[1,1\].*?([\d.]+) us/run")


def ggml_times(binary: str, types, ns) -> dict:
    """{(our type name, n): microseconds per run} from one test-backend-ops perf call."""
    by_ggml = {GGML_NAMES[t]: t for t in types}
    pattern = (f"type_a=({'|'.join(by_ggml)}),type_b=f32,m=4096,n=({'|'.join(map(str, ns))}),k=14336,"
               r"bs=\[1,1\],")
    out = subprocess.run([binary, "perf", "-b", "CPU", "-o", "MUL_MAT", "-p", pattern], check=True,
                         capture_output=True, text=True).stdout
    times = {(by_ggml[m[1]], int(m[2])): float(m[3]) for m in LINE.finditer(out)}
    missing = [(t, n) for t in types for n in ns if (t, n) not in times]
    if missing:
        raise RuntimeError(f"test-backend-ops printed no time for {missing}:\n{out[-2000:]}")
    return times


def ours_us(x: mx.array, w: mx.array, t: GGMLType, runs: int) -> float:
    """Median microseconds of one evaluated product, over batches of `runs`."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(runs):
            mx.eval(ops.quantized_matmul(x, w, t))
        batches.append((time.perf_counter() - start) / runs)
    return statistics.median(batches) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ggml-bin", help="path of ggml's test-backend-ops")
    p.add_argument("--ours-only", action="store_true", help="time ours alone (before/after runs of two builds)")
    p.add_argument("--label", default="", help="what our build is (recorded as given)")
    p.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q6_K")
    p.add_argument("--n", default="1,8", help="rows of x (the first is the reference of *_n_over_n1)")
    p.add_argument("--rounds", type=int, default=3, help="alternations of ggml's run and ours")
    p.add_argument("--runs", type=int, default=10, help="products per timed batch of ours")
    p.add_argument("--ggml-label", default="", help="what ggml was built from (commit, flags), recorded as given")
    args = p.parse_args()
    if not args.ours_only:
        require_executable(p, args.ggml_bin, "--ggml-bin")
    types, ns = args.types.split(","), [int(v) for v in args.n.split(",")]
    unknown = [t for t in types if t not in GGML_NAMES]
    if unknown:
        p.error(f"types {unknown} not benchmarked here; choose from {sorted(GGML_NAMES)}")
    mx.set_default_device(mx.cpu)
    mx.set_cache_limit(CACHE_LIMIT)
    weights = {t: weight_blocks(np.random.default_rng(i), GGMLType[t], N, K) for i, t in enumerate(types)}
    xs = {n: mx.random.normal((n, K)) for n in ns}
    mx.eval(list(weights.values()), list(xs.values()))
    samples = {(t, n): {"ggml": [], "ours": [], "read": []} for t in types for n in ns}
    for r in range(args.rounds):
        theirs = {} if args.ours_only else ggml_times(args.ggml_bin, types, ns)
        for t in types:
            for n in ns:
                s = samples[(t, n)]
                s["ggml"].append(theirs.get((t, n), float("nan")))
                s["ours"].append(ours_us(xs[n], weights[t], GGMLType[t], args.runs))
                s["read"].append(_ext.measure_stream("read", weights[t].size, 3) * 1e6)
                emit({"bench": "vs_ggml_cpu_round", "label": args.label, "round": r, "type": t, "shape": [N, K], "n": n,
                      "ggml_us": s["ggml"][-1], "ours_us": s["ours"][-1], "read_roofline_us": s["read"][-1]})
    for (t, n), s in samples.items():
        g, o, rd = (statistics.median(s[k]) for k in ("ggml", "ours", "read"))
        emit({"bench": "vs_ggml_cpu", "label": args.label, "type": t, "shape": [N, K], "n": n, "device": device_name(),
              "ours_threads": num_threads(), "ggml_threads": os.cpu_count(), "rounds": args.rounds,
              "ggml": args.ggml_label,
              "ggml_us": g, "ours_us": o, "ggml_over_ours": g / o,
              "ours_fraction_of_read_roofline": rd / o, "ggml_fraction_of_read_roofline": rd / g,
              "ours_n_over_n1": o / statistics.median(samples[(t, ns[0])]["ours"]),
              "ggml_n_over_n1": g / statistics.median(samples[(t, ns[0])]["ggml"])})


if __name__ == "__main__":
    main()
