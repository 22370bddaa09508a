"""mul_mat_id (the mixture-of-experts product) on the CPU: 8 of 64 experts of 1536 x 4096 Q4_K per token, decode
(T = 1, 2, 4, 8 tokens) and prefill (T = 512). One run, JSON lines.

Contenders, interleaved in the same rounds (medians, and best rounds):
- ours: one ops.mul_mat_id over the (T, 8) ids (tokens grouped by expert inside the primitive);
- per_expert: what a caller without it runs, the ids known on the host: one quantized_matmul per chosen expert
  on the rows routed to it (each expert's slice of the same blocks), results gathered back in one graph;
- dense_8n: one quantized_matmul of the T rows against a single 12288 x 4096 Q4_K matrix (8 experts' rows): the
  same multiply-adds, and for decode the same weight bytes read, as a dense model would take.
Weights are random Q4_K blocks with small scales (the kernels do not branch on values)."""

import argparse
import statistics

import mlx.core as mx
import numpy as np

from common import add_run_options, device_name, emit, header, interleaved_samples
from mlx_ggml_ext import GGMLTensor, GGMLType, ops

E, USED, N, K = 64, 8, 1536, 4096
T_TYPE = GGMLType.Q4_K


def random_q4_k(rng, rows: int) -> mx.array:
    data = rng.integers(0, 256, (rows * K // 256, 144), dtype=np.uint8)
    data[:, 0:4] = np.full((data.shape[0], 2), 0.01, np.float16).view(np.uint8)  # d and dmin
    return mx.array(data.reshape(rows, -1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    add_run_options(parser, rounds=9)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 4, 8, 512])
    args = parser.parse_args()
    header(not args.mlx_default_cache)
    rng = np.random.default_rng(0)
    blocks = random_q4_k(rng, E * N)
    dense = random_q4_k(rng, USED * N)
    mx.eval(blocks, dense)
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
