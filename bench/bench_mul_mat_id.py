"""mul_mat_id (the mixture-of-experts product) on the CPU: 8 of 64 experts of 1536 x 4096 Q4_K per token, decode
(T = 1, 2, 4, 8 tokens) and prefill (T = 512). One run, JSON lines.

Contenders, interleaved in the same rounds (medians, and best rounds):
- ours: one ops.mul_mat_id over the (T, 8) ids (tokens grouped by expert inside the primitive);
- per_expert: what a caller without it runs, the ids known on the host: one quantized_matmul per chosen expert
  on the rows routed to it (each expert's slice of the same blocks), results gathered back in one graph;
- dense_8n: one quantized_matmul of the T rows against a single 12288 x 4096 Q4_K matrix (8 experts' rows): the
  same multiply-adds, and for decode the same weight bytes read, as a dense model would take.
Weights: one random expert quantized by ops.quantize and repeated (distinct memory per expert; the kernels do
not branch on values). --experts/--used/--n/--k/--types set the case: llama.cpp's test-backend-ops perf cases
are 128 experts, 8 used, 768 x 2048 (qwen3-30b-a3b) and 32, 4, 2880 x 2880 (gpt-oss-20b, MXFP4)."""

import argparse
import statistics

import mlx.core as mx
import numpy as np

from common import add_run_options, device_name, emit, header, interleaved_samples
from mlx_ggml_ext import GGMLTensor, GGMLType, ops


def random_experts(rng, ggml_type: GGMLType, experts: int, n: int, k: int) -> mx.array:
    """(experts * n, row_bytes) blocks: one random (n, k) expert quantized, repeated."""
    one = ops.quantize(mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.02), ggml_type, stream=mx.cpu)
    return mx.concatenate([one] * experts, axis=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    add_run_options(parser, rounds=9)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 4, 8, 512])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--used", type=int, default=8)
    parser.add_argument("--n", type=int, default=1536, help="rows of each expert (output features)")
    parser.add_argument("--k", type=int, default=4096, help="columns of each expert (input features)")
    parser.add_argument("--types", default="Q4_K", help="comma-separated ggml types")
    args = parser.parse_args()
    header(not args.mlx_default_cache)
    E, USED, N, K = args.experts, args.used, args.n, args.k
    rng = np.random.default_rng(0)
    for T_TYPE in [GGMLType.of(t) for t in args.types.split(",")]:
        blocks = random_experts(rng, T_TYPE, E, N, K)
        dense = random_experts(rng, T_TYPE, USED, N, K)
        mx.eval(blocks, dense)
        run_type(args, rng, T_TYPE, blocks, dense, E, USED, N, K)


def run_type(args, rng, T_TYPE, blocks, dense, E, USED, N, K):
    """Every --tokens count of one type: the three contenders interleaved, one JSON line each."""
    experts = GGMLTensor(blocks, T_TYPE, (E, N, K))
    slices = [blocks[e * N:(e + 1) * N] for e in range(E)]
    mx.eval(slices)
    for T in args.tokens:
        ids_np = np.stack([rng.permutation(E)[:USED] for _ in range(T)]).astype(np.int32)
        ids = mx.array(ids_np)
        x = mx.random.normal((T, 1, K), key=mx.random.key(T))
        x2 = x.reshape(T, K)
        mx.eval(x, x2, ids)
        chosen = sorted(set(ids_np.reshape(-1).tolist()))
        rows_of = {e: mx.array(np.nonzero((ids_np == e).any(axis=1))[0].astype(np.int32)) for e in chosen}

        def per_expert():
            return [ops.quantized_matmul(x2[rows_of[e]], slices[e], T_TYPE) for e in chosen]

        contenders = {"ours": lambda: ops.mul_mat_id(experts, x, ids), "per_expert": per_expert,
                      "dense_8n": lambda: ops.quantized_matmul(x2, dense, T_TYPE)}
        rounds = max(3, args.rounds if T <= 8 else args.rounds // 3)
        samples = interleaved_samples(contenders, rounds=rounds, warmup=1)
        weight_bytes = len(chosen) * N * blocks.shape[1]
        record = {"bench": "mul_mat_id", "device": device_name(), "type": T_TYPE.name, "experts": E, "used": USED,
                  "n": N, "k": K, "tokens": T, "experts_touched": len(chosen), "rounds": rounds}
        # Medians, and each contender's best round (on a shared machine rounds are only ever slowed down).
        for prefix, summary in (("", statistics.median), ("best_", min)):
            t = {name: summary(s) for name, s in samples.items()}
            record.update({**{f"{prefix}{name}_ms": v * 1e3 for name, v in t.items()},
                           f"{prefix}ours_weight_gbs": weight_bytes / t["ours"] / 1e9,
                           f"{prefix}per_expert_over_ours": t["per_expert"] / t["ours"],
                           f"{prefix}dense_8n_over_ours": t["dense_8n"] / t["ours"],
                           f"{prefix}ours_gflops": 2 * T * USED * N * K / t["ours"] / 1e9})
        emit(record)


if __name__ == "__main__":
    main()
