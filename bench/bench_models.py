"""Tokens per second of a GGUF model run by this package (mlx_ggml_ext.models.load + mlx-lm's model), side by side
with llama.cpp's llama-bench on the same file and threads, and on a GPU with MLX's own 4-bit model of the same
shape. One JSON line per contender and round, then a summary line with medians and ratios.

What is timed is what mlx-lm's generation loop does:
- prefill P tokens: the first P-1 through the model updating the KV cache only (no logits), then the last one
  with logits (mlx_lm.generate_step's order; llama-bench's pp test likewise asks for the last logits only);
- decode: N tokens one at a time from an empty cache, each step's argmax fed back (llama-bench's tg test decodes
  N tokens from an empty context), timed two ways: `tgN`, each token's graph built, then evaluated; and
  `tgN_pipelined`, mlx_lm.generate_step's order, where the next token's graph is built while the GPU or the CPU
  stream evaluates this one (`mx.async_eval`), so that graph building and MLX's per-op encoding overlap the
  kernels. llama-bench has one figure (its graph is built in C++ and, on CUDA, replayed).
Token ids are random (seeded), as llama-bench's are. Rounds alternate the contenders, and each line records the
CPU time other processes took meanwhile (in cores), since a busy neighbour slows llama.cpp far more than us:
compare rounds with low `others_cores` only.

    python bench_models.py --model gemma-3-270m-q4_k_m.gguf --llama-bench /path/to/llama-bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models.cache import make_prompt_cache

import mlx_ggml_ext
from mlx_ggml_ext import _ext, gguf, models
from mlx_ggml_ext.models.rope import FactorRoPE
from mlx_ggml_ext.nn import GGMLLinear, GGMLSwitchLinear


def busy_jiffies() -> int:
    """CPU time of the whole machine, all processes, in clock ticks (user + nice + system + irq + softirq)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6]


def own_seconds() -> float:
    """CPU seconds of this process and its finished children (llama-bench)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class LoadMeter:
    """Cores' worth of CPU that other processes used while a block ran (Linux; None elsewhere)."""

    def __enter__(self):
        self.linux = os.path.exists("/proc/stat")
        if self.linux:
            self.wall, self.busy, self.own = time.perf_counter(), busy_jiffies(), own_seconds()
        return self

    def __exit__(self, *exc):
        self.others_cores = None
        if self.linux:
            wall = time.perf_counter() - self.wall
            busy = (busy_jiffies() - self.busy) / os.sysconf("SC_CLK_TCK")
            self.others_cores = round(max(0.0, busy - (own_seconds() - self.own)) / wall, 3)


def prefill_tok_s(model, n_tokens: int, seed: int) -> float:
    tokens = mx.random.randint(0, model_vocab(model), (n_tokens,), key=mx.random.key(seed))
    mx.eval(tokens)
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    model(tokens[None, :-1], cache=cache)
    mx.eval([c.state for c in cache])
    logits = model(tokens[None, -1:], cache=cache)
    mx.eval(logits)
    return n_tokens / (time.perf_counter() - start)


def filled_cache(model, context: int, seed: int):
    """A prompt cache holding `context` random tokens (one prefill, evaluated): decode then runs at that depth."""
    cache = make_prompt_cache(model)
    if context:
        prompt = mx.random.randint(0, model_vocab(model), (1, context), key=mx.random.key(seed + 1))
        mx.eval(model(prompt, cache=cache))
        mx.eval([c.state for c in cache])
    return cache


def decode_tok_s(model, n_tokens: int, seed: int, context: int = 0) -> float:
    y = mx.random.randint(0, model_vocab(model), (1, 1), key=mx.random.key(seed))
    cache = filled_cache(model, context, seed)
    mx.eval(y)
    start = time.perf_counter()
    for _ in range(n_tokens):
        logits = model(y, cache=cache)
        y = mx.argmax(logits[:, -1:, :], axis=-1)
        mx.eval(y)
    return n_tokens / (time.perf_counter() - start)


def pipelined_decode_tok_s(model, n_tokens: int, seed: int, context: int = 0) -> float:
    """decode_tok_s in mlx_lm.generate_step's order: token t + 1's graph is built (its input the lazy argmax of
    token t) and handed to `mx.async_eval` before token t's value is read. The same tokens and arithmetic."""
    y = mx.random.randint(0, model_vocab(model), (1, 1), key=mx.random.key(seed))
    cache = filled_cache(model, context, seed)
    mx.eval(y)
    start = time.perf_counter()
    y = mx.argmax(model(y, cache=cache)[:, -1:, :], axis=-1)
    mx.async_eval(y)
    for _ in range(n_tokens - 1):
        following = mx.argmax(model(y, cache=cache)[:, -1:, :], axis=-1)
        mx.async_eval(following)
        y.item()
        y = following
    y.item()
    return n_tokens / (time.perf_counter() - start)


def model_vocab(model) -> int:
    return int(model.args.vocab_size)


def mlx_affine4(model: nn.Module, group_size: int = 64) -> nn.Module:
    """The same model with every GGMLLinear replaced by MLX's own affine 4-bit QuantizedLinear of the dequantized
    weight (what mlx-lm's `nn.quantize(group_size=64, bits=4)` makes of a float16 model). Its norms, RoPE and
    gated activation stay the package's ops (the caller loads it unstacked, with MLX's residual adds and mlx-lm's
    attention call)."""
    def convert(layer):
        linear = nn.Linear(layer.input_dims, layer.output_dims, bias="bias" in layer)
        linear.weight = layer.tensor.dequantize(mx.float16)
        if "bias" in layer:
            linear.bias = layer.bias
        quantized = nn.QuantizedLinear.from_linear(linear, group_size, 4)
        # Scales and biases in the activations' dtype (float32 here), as mlx-lm's model of a float16 checkpoint
        # has them in its: float16 ones cost MLX two conversion kernels per product and token.
        quantized.scales, quantized.biases = quantized.scales.astype(mx.float32), quantized.biases.astype(mx.float32)
        return quantized
    swaps = [(path, convert(m)) for path, m in model.named_modules() if isinstance(m, GGMLLinear)]
    model.update_modules(tree_unflatten(swaps))
    mx.eval(model.parameters())
    return model


def load_with(path: str, env: dict, **kwargs) -> nn.Module:
    """Ours loaded with the environment's A/B switches set (`MLX_GGML_EXT_FUSED_RESIDUAL=0`: each residual add and
    the norm after it as two ops; `MLX_GGML_EXT_ROPE_QKV=0`: mlx-lm's attention call) and models.load's `kwargs`."""
    previous = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return models.load(path, **kwargs)[0]
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def llama_bench(binary: str, model: str, prompts, decode: int, threads: int, extra: str = "", reps: int = 1) -> dict:
    """{'pp256': tok/s, ..., 'tg128': tok/s} from one llama-bench run (`reps` repetitions per test, their mean);
    `extra`: more llama-bench arguments (`-ngl 99` offloads every layer to a GPU build's device)."""
    cmd = [binary, "-m", model, "-p", ",".join(map(str, prompts)), "-n", str(decode), "-t", str(threads),
           "-r", str(reps), "-o", "json"] + shlex.split(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result = {}
    for test in json.loads(out):
        key = f"pp{test['n_prompt']}" if test["n_gen"] == 0 else f"tg{test['n_gen']}"
        result[key] = float(test["avg_ts"])
    return result


# Decode depth: tokens in the cache before the timed decode (--context); 0 decodes from an empty cache.
CONTEXT = 0


def ours(model, prompts, decode: int, seed: int, prefill_reps: int = 1) -> dict:
    result = {f"pp{p}": statistics.median(prefill_tok_s(model, p, seed + p) for _ in range(prefill_reps))
              for p in prompts}
    result[f"tg{decode}"] = decode_tok_s(model, decode, seed, CONTEXT)
    result[f"tg{decode}_pipelined"] = pipelined_decode_tok_s(model, decode, seed, CONTEXT)
    return result


def decode_bytes(path: str) -> int:
    """The weight bytes one decode token reads: every tensor, the embedding only when it is also the output head
    (with a separate output.weight a token reads one row of it: left out), and of each expert tensor the used
    experts' share."""
    g = gguf.load(path)
    arch = g.metadata.get("general.architecture", "")
    used, experts = g.metadata.get(f"{arch}.expert_used_count"), g.metadata.get(f"{arch}.expert_count")
    total = 0
    for name, t in g.tensors.items():
        if name.startswith("token_embd.") and "output.weight" in g.tensors:
            continue
        total += t.nbytes * used // experts if "_exps." in name and used and experts else t.nbytes
    return total


def read_roofline(nbytes: int, decode: int) -> dict:
    """Decode tok/s if a token took only a threaded streaming read of its weight bytes (the CPU's bound for a
    memory-bound decode), on the kernels' thread pool; keyed as the decode figures so the summary's ratios hold
    ours / roofline."""
    tok_s = 1.0 / _ext.measure_stream("read", nbytes, 3)
    return {f"tg{decode}": tok_s, f"tg{decode}_pipelined": tok_s}


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench (CPU peer; same file and threads)")
    p.add_argument("--llama-args", default="", help="more llama-bench arguments, e.g. '-ngl 99' for a CUDA build")
    p.add_argument("--llama-label", default="", help="what llama.cpp was built from, recorded as given")
    p.add_argument("--mlx-4bit", action="store_true", help="also MLX's own affine 4-bit model of the same shape")
    p.add_argument("--unstacked", action="store_true",
                   help="also ours without stacked projections (models.load(stack_projections=False))")
    p.add_argument("--unpacked", action="store_true",
                   help="also ours with the Q4_K matrices as the file's blocks, not rows packed for the CPU "
                        "(models.load(pack_rows=False))")
    p.add_argument("--one-pass-head", action="store_true",
                   help="also ours with the output head's x rounded once, as ggml does "
                        "(models.load(precise_head=False))")
    p.add_argument("--unfused-residual", action="store_true",
                   help="also ours with each residual add and its norm as two ops (models/residual.py undone)")
    p.add_argument("--unfused-rope-qkv", action="store_true",
                   help="also ours with mlx-lm's attention call (q, k, v split and rotated by separate ops: "
                        "models/qkv_attention.py undone)")
    p.add_argument("--mlx-lm-cache-update", action="store_true",
                   help="also ours with mlx-lm's KVCache.update_and_fetch (two slice updates and two slices a layer) "
                        "instead of two ops.kv_cache_append nodes (MLX_GGML_EXT_KV_CACHE=0)")
    p.add_argument("--mlx-rope-freqs", action="store_true",
                   help="also ours as it ran a file with rope_freqs (Llama 3.1+) before 2026-11-29: mlx-lm's attention "
                        "call and cache update, the rope mx.fast.rope with freqs (models/rope.py's FactorRoPE)")
    p.add_argument("--checked-ids", action="store_true",
                   help="also ours with the experts' ids evaluated and checked at every projection (check_ids=True: "
                        "a GPU synchronization each; models.load leaves them lazy)")
    p.add_argument("--prompts", default="256,512", help="prefill lengths")
    p.add_argument("--decode", type=int, default=128, help="decode tokens")
    p.add_argument("--context", type=int, default=0,
                   help="decode after a prefill of this many random tokens (the cache's depth; not applied to "
                        "llama-bench, whose tg starts from an empty context)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=mlx_ggml_ext.num_threads())
    p.add_argument("--prefill-reps", type=int, default=None,
                   help="prefills per length and round, their median reported (default: 3 on a GPU, where one "
                        "prefill of 512 tokens takes ~15 ms and single runs moved by 1.5x; 1 on the CPU)")
    args = p.parse_args()
    global CONTEXT
    CONTEXT = args.context
    reps = args.prefill_reps or (3 if mx.default_device() == mx.gpu else 1)
    prompts = [int(v) for v in args.prompts.split(",")]
    mlx_ggml_ext.set_num_threads(args.threads)

    model, _ = models.load(args.model)
    contenders = {"ours": lambda: ours(model, prompts, args.decode, 1, reps)}
    mlx_models = [model]  # every MLX model, warmed up before the rounds
    if args.mlx_4bit:
        # As mlx-lm builds it: one QuantizedLinear per projection (none stacked), its attention call, the residual
        # adds MLX's own ops. (Before 2026-11-29 the stacked q/k/v product of this model stayed ours: its slices
        # kept the GGMLLinear that the conversion replaced.)
        affine = mlx_affine4(load_with(args.model, {"MLX_GGML_EXT_FUSED_RESIDUAL": "0", "MLX_GGML_EXT_ROPE_QKV": "0"},
                                       stack_projections=False))
        contenders["mlx_affine4"] = lambda: ours(affine, prompts, args.decode, 1, reps)
        mlx_models.append(affine)
    if args.unstacked:
        unstacked, _ = models.load(args.model, stack_projections=False)
        contenders["ours_unstacked"] = lambda: ours(unstacked, prompts, args.decode, 1, reps)
        mlx_models.append(unstacked)
    if args.unpacked:
        unpacked, _ = models.load(args.model, pack_rows=False)
        contenders["ours_unpacked"] = lambda: ours(unpacked, prompts, args.decode, 1, reps)
        mlx_models.append(unpacked)
    if args.one_pass_head:
        one_pass, _ = models.load(args.model, precise_head=False)
        contenders["ours_one_pass_head"] = lambda: ours(one_pass, prompts, args.decode, 1, reps)
        mlx_models.append(one_pass)
    if args.unfused_rope_qkv:
        plain_attention = load_with(args.model, {"MLX_GGML_EXT_ROPE_QKV": "0"})
        contenders["ours_mlx_lm_attention"] = lambda: ours(plain_attention, prompts, args.decode, 1, reps)
        mlx_models.append(plain_attention)
    if args.mlx_lm_cache_update:
        plain_cache = load_with(args.model, {"MLX_GGML_EXT_KV_CACHE": "0"})
        contenders["ours_mlx_lm_cache_update"] = lambda: ours(plain_cache, prompts, args.decode, 1, reps)
        mlx_models.append(plain_cache)
    if args.mlx_rope_freqs:
        fast_rope = load_with(args.model, {"MLX_GGML_EXT_ROPE_QKV": "0"})
        for layer in fast_rope.layers:
            r = layer.self_attn.rope
            if getattr(r, "_factors", None) is None:
                raise SystemExit("--mlx-rope-freqs: the file has no rope_freqs.weight")
            layer.self_attn.rope = FactorRoPE(r.dims, r.base, r.traditional, r._factors)
        contenders["ours_mlx_rope_freqs"] = lambda: ours(fast_rope, prompts, args.decode, 1, reps)
        mlx_models.append(fast_rope)
    if args.unfused_residual:
        unfused = load_with(args.model, {"MLX_GGML_EXT_FUSED_RESIDUAL": "0"})
        contenders["ours_unfused_residual"] = lambda: ours(unfused, prompts, args.decode, 1, reps)
        mlx_models.append(unfused)
    if args.checked_ids:
        checked, _ = models.load(args.model)
        for _, module in checked.named_modules():
            if isinstance(module, GGMLSwitchLinear):
                module.check_ids = True
        contenders["ours_checked_ids"] = lambda: ours(checked, prompts, args.decode, 1, reps)
        mlx_models.append(checked)
    weight_bytes = decode_bytes(args.model) if mx.default_device() == mx.cpu else None
    if weight_bytes is not None:
        contenders["read_roofline"] = lambda: read_roofline(weight_bytes, args.decode)
    if args.llama_bench:
        contenders["llama.cpp"] = lambda: llama_bench(args.llama_bench, args.model, prompts, args.decode,
                                                      args.threads, args.llama_args, reps)
    setup = {"model": os.path.basename(args.model), "device": str(mx.default_device()),
             "cpu_isa": mlx_ggml_ext.cpu_isa(), "threads": args.threads, "prefill_reps": reps,
             "llama_label": args.llama_label, "decode_context": args.context,
             "decode_weight_bytes": weight_bytes,
             "mlx": mx.__version__, "version": mlx_ggml_ext.__version__}
    emit({"setup": setup})
    # Warm-up of every MLX model: first-call allocations, kernel loads and page faults of the mapped weights
    # (without it the first round's MLX affine 4-bit prefill on the H100 came out at half speed).
    for warm in mlx_models:
        ours(warm, prompts, 8, 0)
    samples = {name: [] for name in contenders}
    for r in range(args.rounds):
        for name, run in contenders.items():
            with LoadMeter() as load:
                result = run()
            samples[name].append(result)
            emit({"round": r, "contender": name, **{k: round(v, 2) for k, v in result.items()},
                  "others_cores": load.others_cores})
    summary = {name: {k: round(statistics.median(s[k] for s in runs), 2) for k in runs[0]}
               for name, runs in samples.items()}
    # llama-bench's one decode figure is set beside both of ours
    ratios = {f"ours_over_{name}": {k: round(summary["ours"][k] / summary[name].get(k, summary[name].get(
        k.replace("_pipelined", ""))), 3) for k in summary["ours"] if k.replace("_pipelined", "") in summary[name]}
              for name in summary if name != "ours"}
    if "read_roofline" in summary and "llama.cpp" in summary:
        tg = f"tg{args.decode}"
        ratios["llama.cpp_over_read_roofline"] = {tg: round(summary["llama.cpp"][tg] / summary["read_roofline"][tg], 3)}
    emit({"summary": summary, **ratios})


if __name__ == "__main__":
    sys.exit(main())
