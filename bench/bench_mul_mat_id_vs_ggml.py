"""ops.mul_mat_id against llama.cpp's own MUL_MAT_ID on the same machine and backend, in one run: JSON lines.

llama.cpp's `test-backend-ops perf -o MUL_MAT_ID` times its perf cases (the experts of qwen3-30b-a3b: 128 of
them, 8 used per token, 768 x 2048 each; of gpt-oss-20b: 32, 4 used, 2880 x 2880, MXFP4), x float32 with
n tokens. Each round runs it once, then ours on the same cases: `--graph` products of the same x and ids (random,
each token choosing distinct experts, as test-backend-ops draws them once per case) in one evaluated graph, so
the time per product is what a model's step pays per op (kernel plus host cost), like test-backend-ops'
repeated launches of one graph. Both therefore read the same chosen experts again and again: at few tokens they
come from the last-level cache (8 of 128 Q4_K experts of 768 x 2048 are 7 MB), not from memory as in a real
decode, where each token picks new ones. Weights are random blocks made by ops.quantize (ggml's are random too;
no kernel branches on values). On the CPU test-backend-ops runs half the machine's CPUs as threads (one on a
2-core machine), and ours takes as many unless --threads says otherwise.

    python bench_mul_mat_id_vs_ggml.py --ggml-bin llama.cpp/build/bin/test-backend-ops --backend CUDA0

`--packed` (CPU) adds a third contender in the same rounds: our experts with their rows packed for the CPU
(GGMLSwitchLinear.pack_rows, what models.load does on AVX-512), for the types that have a packing.
test-backend-ops' own CPU buffers are not repacked (its plain kernels); llama-bench's model weights are.

test-backend-ops is not a dependency: build llama.cpp with -DLLAMA_BUILD_TESTS=ON (and -DGGML_CUDA=ON for the
GPU) and build the target test-backend-ops."""

import argparse
import os
import re
import statistics
import subprocess
import time

import mlx.core as mx
import numpy as np

from common import CACHE_LIMIT, device_name, emit, require_executable
from mlx_ggml_ext import GGMLTensor, GGMLType, num_threads, ops, set_num_threads
from mlx_ggml_ext.nn import GGMLSwitchLinear

# Our type names by the spelling of ggml's type names.
GGML_SPELLING = {"Q4_0": "q4_0", "Q8_0": "q8_0", "Q4_K": "q4_K", "Q6_K": "q6_K", "IQ4_XS": "iq4_xs",
                 "MXFP4": "mxfp4", "F16": "f16"}
RESULT = re.compile(r"MUL_MAT_ID\(type_a=(\w+),type_b=f32,n_mats=(\d+),n_used=(\d+),b=0,m=(\d+),n=(\d+),"
                    r"k=(\d+)[^)]*\):.*?([\d.]+) us/run")


def ggml_run(binary: str, backend: str, types, tokens, case) -> dict:
    """{(type, tokens): us per product} of one test-backend-ops call, for the case (experts, used, m, k)."""
    experts, used, m, k = case
    spelled = {GGML_SPELLING[t]: t for t in types}
    pattern = (f"type_a=({'|'.join(spelled)}),type_b=f32,n_mats={experts},n_used={used},b=0,m={m},"
               f"n=({'|'.join(map(str, tokens))}),k={k},")
    out = subprocess.run([binary, "perf", "-b", backend, "-o", "MUL_MAT_ID", "-p", pattern], check=True,
                         capture_output=True, text=True).stdout
    found = {}
    for r in RESULT.finditer(out):
        if (int(r[2]), int(r[3]), int(r[4]), int(r[6])) == case:
            found[(spelled[r[1]], int(r[5]))] = float(r[7])
    absent = [(t, n) for t in types for n in tokens if (t, n) not in found]
    if absent:
        raise RuntimeError(f"test-backend-ops gave no time for {absent} of case {case}:\n{out[-1500:]}")
    return found


def our_products(rng, ggml_type: GGMLType, case, tokens: int, count: int):
    """The expert weights of one case and `count` references to one (x, ids), evaluated."""
    experts, used, m, k = case
    one = ops.quantize(mx.array(rng.standard_normal((m, k)).astype(np.float32)), ggml_type, stream=mx.cpu)
    weights = GGMLTensor(mx.concatenate([one] * experts, axis=0), ggml_type, (experts, m, k))
    ids = np.stack([rng.permutation(experts)[:used] for _ in range(tokens)]).astype(np.int32)
    # x and ids as a model's are: written by MLX kernels (x * 1, ids + 0), not arrays made from host memory (which
    # MLX's CUDA backend keeps in managed memory). On the H200 the per-product times came out as before.
    x = mx.array(rng.standard_normal((tokens, 1, k)).astype(np.float32)) * 1.0
    ids = mx.array(ids) + 0
    mx.eval(weights.data, x, ids)
    return weights, [(x, ids)] * count


def packed_us(weights: GGMLTensor, inputs) -> float:
    """As our_us (lazy, unchecked ids), through a GGMLSwitchLinear whose experts are packed for the CPU."""
    layer = GGMLSwitchLinear(weights, check_ids=False)
    layer.pack_rows()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        lazy = inputs[0][1] + 0
        mx.eval([layer.product(x, lazy) for x, _ in inputs])
        times.append((time.perf_counter() - start) / len(inputs))
    return statistics.median(times) * 1e6


def our_us(weights, inputs, eager_ids: bool = False) -> float:
    """Median over 5 evaluations of all the products in one graph, per product. The ids are made inside the graph
    (one `ids + 0` shared by its products) and left unchecked, as a model's router gives them (models.load); with
    `eager_ids` they are the evaluated array and ops.mul_mat_id checks them on the host at each call (on a GPU a
    read of device-written memory per product)."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        if eager_ids:
            mx.eval([ops.mul_mat_id(weights, x, ids) for x, ids in inputs])
        else:
            lazy = inputs[0][1] + 0
            mx.eval([ops.mul_mat_id(weights, x, lazy, check_ids=False) for x, _ in inputs])
        times.append((time.perf_counter() - start) / len(inputs))
    return statistics.median(times) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ggml-bin", help="llama.cpp's test-backend-ops")
    p.add_argument("--ours-only", action="store_true", help="time ours alone (before/after runs of two builds)")
    p.add_argument("--backend", default="CPU", help="test-backend-ops' backend name: CPU, CUDA0")
    p.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q6_K,IQ4_XS")
    p.add_argument("--tokens", default="1,8,512")
    p.add_argument("--case", default="128,8,768,2048", help="experts,used,m,k of a test-backend-ops perf case")
    p.add_argument("--eager-ids", action="store_true",
                   help="ids evaluated beforehand and checked by the op at each call (the runs before 2026-11-28 "
                        "evening); default: made in the graph, unchecked, as in a model")
    p.add_argument("--packed", action="store_true", help="CPU: also ours with the experts' rows packed")
    p.add_argument("--label", default="", help="what llama.cpp was built from, recorded as given")
    p.add_argument("--threads", type=int, default=None,
                   help="our CPU threads (default on the CPU: test-backend-ops' own, half the machine's CPUs)")
    # how long: rounds of (test-backend-ops, ours); our products per evaluated graph
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--graph", type=int, default=16,
                   help="our products per graph (on the CPU 2 from 64 tokens, where one takes ~0.2 s)")
    args = p.parse_args()
    if not args.ours_only:
        require_executable(p, args.ggml_bin, "--ggml-bin")
    types, tokens = args.types.split(","), [int(v) for v in args.tokens.split(",")]
    case = tuple(int(v) for v in args.case.split(","))
    if len(case) != 4 or any(t not in GGML_SPELLING for t in types):
        p.error(f"--case takes 4 ints; --types from {sorted(GGML_SPELLING)}")
    mx.set_cache_limit(CACHE_LIMIT)
    if mx.default_device() == mx.cpu:
        # test-backend-ops gives its CPU backend half the machine's CPUs (at least one): the same for ours, unless told
        set_num_threads(args.threads or max(1, (os.cpu_count() or 2) // 2))
    rng = np.random.default_rng(0)
    # On a GPU every length takes --graph products: an evaluation costs MLX some 400 us of its own on the H200, which
    # 2 products of 512 tokens shared as ~200 us each (480-506 us per product there, against 300-325 with 16).
    on_cpu = mx.default_device() == mx.cpu
    ours_inputs = {(t, n): our_products(rng, GGMLType[t], case, n, 2 if on_cpu and n >= 64 else args.graph)
                   for t in types for n in tokens}
    samples = {key: {"ggml": [], "ours": [], "packed": []} for key in ours_inputs}
    packs = args.packed and on_cpu
    for r in range(args.rounds):
        theirs = {} if args.ours_only else ggml_run(args.ggml_bin, args.backend, types, tokens, case)
        for key, (weights, inputs) in ours_inputs.items():
            samples[key]["ggml"].append(theirs.get(key))
            samples[key]["ours"].append(our_us(weights, inputs, args.eager_ids))
            if packs and GGMLType[key[0]] in ops.PACKABLE_TYPES:
                samples[key]["packed"].append(packed_us(weights, inputs))
            emit({"bench": "mul_mat_id_vs_ggml_round", "round": r, "type": key[0], "tokens": key[1],
                  "ggml_us": samples[key]["ggml"][-1], "ours_us": samples[key]["ours"][-1],
                  **({"ours_packed_us": samples[key]["packed"][-1]} if samples[key]["packed"] else {})})
    experts, used, m, k = case
    for (t, n), s in samples.items():
        o = statistics.median(s["ours"])
        g = None if args.ours_only else statistics.median(s["ggml"])
        packed = statistics.median(s["packed"]) if s["packed"] else None
        emit({"bench": "mul_mat_id_vs_ggml", "type": t, "experts": experts, "used": used, "m": m, "k": k,
              "tokens": n, "device": device_name(), "ggml_backend": args.backend, "ggml": args.label,
              "ours_threads": num_threads(), "rounds": args.rounds,
              "ids": "eager, checked" if args.eager_ids else "lazy, unchecked", "ggml_us": g, "ours_us": o,
              "ggml_over_ours": None if g is None else g / o, "ours_gflops": 2 * n * used * m * k / o / 1e3,
              **({"ours_packed_us": packed, "ggml_over_ours_packed": None if g is None else g / packed}
                 if packed else {})})


if __name__ == "__main__":
    main()
