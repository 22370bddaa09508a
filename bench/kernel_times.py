"""Kernel-only times on the GPU, through Nsight Compute: what the GPU spends in each of our kernels and in MLX's
own for the same work, without MLX's per-op encoding overhead (which bench_cuda.py's per-op times include).

  ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      python3 kernel_times.py > ncu.csv          # profiles every kernel of one evaluation per case
  python3 kernel_times.py --parse ncu.csv         # JSON lines: per case, each kernel's time and DRAM GB/s

MLX's copy of 4096x4096 float16 (x + 0), the bandwidth baseline, is measured 10 times through the run: on one
H100 in one run it took 22.4-30.9 us with the same DRAM traffic (46.5 MB of its 67 MB: the rest of its writes
stay in L2), so one copy is no baseline. --parse prints their median as "copy_baseline" and each bandwidth case's
"of_copy": its counted bytes per second over the median copy's.

ncu flushes the caches before each kernel (its default), so the weights and inputs come from DRAM. Each case
is evaluated once after a warm-up evaluation, inside a profiler range (ncu --profile-from-start off) that
starts with a marker kernel (a small MLX cumsum, used by no case) so the parser can attribute kernels to cases.
The run was made with the Nsight Compute of the GPU machine; without it this script has nothing to do."""

import argparse
import contextlib
import csv
import itertools
import json
import re
import statistics
import sys




def cases():
    """Every case, or those whose name matches the regular expression in KERNEL_TIMES_CASES (the profiling run
    and the parsing run must see the same value)."""
    import os

    wanted = re.compile(os.environ.get("KERNEL_TIMES_CASES", ""))
    return [c for c in all_cases() if wanted.search(c[0])]


def all_cases():
    import mlx.core as mx
    import numpy as np

    from mlx_ggml_ext import GGMLTensor, GGMLType, ops, reference

    import os

    # the weight types of the quantized_matmul cases: KERNEL_TIMES_TYPES (comma-separated names) or these four
    types = [GGMLType[name] for name in os.environ.get("KERNEL_TIMES_TYPES", "Q4_0,Q4_K,Q6_K,Q8_0").split(",")]
    # Decode cases (m <= 8) once per variant: KERNEL_TIMES_VARIANTS, '|'-separated lists of NAME=VALUE settings
    # (comma-separated) in force while the case is evaluated, e.g. the kernel choices of a -DGGML_EXT_TUNING build
    # ("GGML_EXT_STAGED=nostream|" : that variant and the default, interleaved case by case in one run).
    variants = os.environ.get("KERNEL_TIMES_VARIANTS", "").split("|")
    rng = np.random.default_rng(0)
    x = mx.random.normal((4096, 4096)).astype(mx.float16)
    w = mx.random.normal((4096,)).astype(mx.float16)
    r = mx.random.normal((1, 2048, 32, 128)).astype(mx.float16)
    r_mlx = mx.contiguous(r.transpose(0, 2, 1, 3))
    pos = mx.arange(2048, dtype=mx.int32)
    mx.eval(x, w, r, r_mlx, pos)
    # MLX's copy, the bandwidth baseline, is measured several times through the run (before each weight type and
    # at the end): it moved by up to 30% within one run, so parse() states ratios against the median of this run's.
    copies = itertools.count()

    def copy_case():
        return (f"{COPY} #{next(copies)}", 2 * x.nbytes, lambda: x + 0)

    out = [
        copy_case(),
        ("rms_norm ours 4096x4096 f16", 2 * x.nbytes, lambda: ops.rms_norm(x, w, 1e-6)),
        ("rms_norm mx.fast 4096x4096 f16", 2 * x.nbytes, lambda: mx.fast.rms_norm(x, w, 1e-6)),
        ("rope normal ours 1x2048x32x128 f16", 2 * r.nbytes, lambda: ops.rope(r, pos, 128, "normal", 10000.0)),
        ("rope normal mx.fast", 2 * r.nbytes,
         lambda: mx.fast.rope(r_mlx, 128, traditional=True, base=10000.0, scale=1.0, offset=0)),
        ("rope neox ours 1x2048x32x128 f16", 2 * r.nbytes, lambda: ops.rope(r, pos, 128, "neox", 10000.0)),
        ("rope neox mx.fast", 2 * r.nbytes,
         lambda: mx.fast.rope(r_mlx, 128, traditional=False, base=10000.0, scale=1.0, offset=0)),
    ]
    # weight shapes NxK: KERNEL_TIMES_SHAPES (comma-separated) or the two
    shapes = [tuple(int(d) for d in shape.split("x"))
              for shape in os.environ.get("KERNEL_TIMES_SHAPES", "14336x4096,4096x14336").split(",")]
    for n, k in shapes:
        w16 = (mx.random.normal((n, k)) * 0.02).astype(mx.float16)
        q, s, b = mx.quantize(w16, group_size=64, bits=4)
        mx.eval(w16, q, s, b)
        for m in (1, 8):
            xm = mx.random.normal((m, k)).astype(mx.float16)
            mx.eval(xm)
            out.append((f"mlx affine4 {n}x{k} m={m}", q.nbytes + s.nbytes + b.nbytes,
                        lambda xm=xm, q=q, s=s, b=b: mx.quantized_matmul(xm, q, s, b, transpose=True,
                                                                      group_size=64, bits=4)))
        for t in types:
            out.append(copy_case())
            blocks = mx.array(reference.random_blocks(rng, t.name, n, k))
            mx.eval(blocks)
            # 3, 5, 6: where the decode routing changes; from 16 rows on both prefill routes (the default
            # MLX_GGML_EXT_CUDA_DENSE_ROWS, and "blocks": the primitive's tiles on the blocks)
            for m in (1, 2, 3, 4, 5, 6, 8, 16, 32, 64, 128, 256, 512):
                xm = mx.random.normal((m, k)).astype(mx.float16)
                mx.eval(xm)
                moved = blocks.nbytes if m <= 8 else 2 * m * n * k  # bytes, or flops for prefill
                for variant in (variants if m <= 8 else [""]):
                    out.append((f"{t.name} {n}x{k} m={m}" + (f" [{variant}]" if variant else ""), moved,
                                lambda xm=xm, blocks=blocks, t=t, variant=variant: with_environment(
                                    variant, lambda: ops.quantized_matmul(xm, blocks, t))))
                if m > 8:
                    out.append((f"{t.name} {n}x{k} m={m} blocks", moved,
                                lambda xm=xm, blocks=blocks, t=t: with_dense_rows(
                                    "0", lambda: ops.quantized_matmul(xm, blocks, t))))
            if t == GGMLType.Q4_K:  # x's gradient (the transposed product) at 512 rows, both routes
                g = mx.random.normal((512, n)).astype(mx.float16)
                x512 = mx.random.normal((512, k)).astype(mx.float16)
                mx.eval(g, x512)
                for route, rows in (("", None), (" blocks", "0")):
                    out.append((f"{t.name} {n}x{k} m=512 x_grad{route}", 2 * 512 * n * k,
                                lambda g=g, x512=x512, blocks=blocks, t=t, rows=rows: with_dense_rows(
                                    rows, lambda: mx.vjp(lambda v: ops.quantized_matmul(v, blocks, t),
                                                         [x512], [g])[1][0])))
        x512 = mx.random.normal((512, k)).astype(mx.float16)
        mx.eval(x512)
        out.append((f"mlx fp16 matmul {n}x{k} m=512", 2 * 512 * n * k, lambda x512=x512, w16=w16: x512 @ w16.T))
    # mul_mat_id on qwen3-30b-a3b's experts (128 of 768 x 2048, 8 used per token, x float32 as test-backend-ops
    # has it) at 1, 8 and 512 tokens: KERNEL_TIMES_MMID=1
    if os.environ.get("KERNEL_TIMES_MMID") == "1":
        for t in types:
            experts = GGMLTensor(mx.array(reference.random_blocks(rng, t.name, 128 * 768, 2048)), t, (128, 768, 2048))
            mx.eval(experts.data)
            for tokens in (1, 8, 512):
                # + 0: the ids in memory an MLX kernel wrote (a router's are), not an array made from the host's
                ids = mx.array(np.stack([rng.permutation(128)[:8] for _ in range(tokens)]).astype(np.int32)) + 0
                xt = mx.random.normal((tokens, 1, 2048))
                mx.eval(ids, xt)
                moved = experts.data.nbytes * min(128, 8 * tokens) // 128 if tokens <= 8 else 2 * tokens * 8 * 768 * 2048
                out.append((f"mul_mat_id {t.name} 128x768x2048 tokens={tokens}" + (" m=512" if tokens > 8 else ""),
                            moved, lambda xt=xt, experts=experts, ids=ids, t=t: ops.mul_mat_id(experts, xt, ids)))
    out.append(copy_case())
    return out


@contextlib.contextmanager
def environment(settings):
    """The environment variables of the dict `settings` set for the duration of a with-block, then restored."""
    import os

    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def with_environment(settings, build):
    """The graph `build` makes, evaluated with the environment variables of `settings` ("A=1,B=2"; "" for none)
    set: the kernels are chosen when the graph is evaluated."""
    import mlx.core as mx

    with environment(dict(item.split("=", 1) for item in settings.split(",") if item)):
        y = build()
        mx.eval(y)
        return y


def with_dense_rows(rows, build):
    """The graph `build` makes with MLX_GGML_EXT_CUDA_DENSE_ROWS set to `rows` (None: as the environment has it);
    the route is chosen when the graph is built."""
    with environment({} if rows is None else {"MLX_GGML_EXT_CUDA_DENSE_ROWS": rows}):
        return build()


MARK = re.compile(r"scan", re.IGNORECASE)
COPY = "copy x+0 (MLX) 4096x4096 f16"


def profiler():
    import ctypes
    import glob
    import os

    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for site in sys.path:
        names += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("no CUDA runtime library found for cudaProfilerStart")


def run_cases():
    import mlx.core as mx

    cuda = profiler()
    marker = mx.ones((1000,))
    mx.eval(marker)
    for name, _, make in cases():
        mx.eval(make())  # warm-up: first-use costs stay outside the profiled range
        mx.eval(mx.cumsum(marker))
        mx.synchronize()
        cuda.cudaProfilerStart()
        mx.eval(mx.cumsum(marker))
        mx.synchronize()
        mx.eval(make())
        mx.synchronize()
        cuda.cudaProfilerStop()
        print(f"profiled: {name}", file=sys.stderr, flush=True)


PREFILL = re.compile(r"m=(\d{2,})")  # more than 8 rows: flops, not bytes

SCALE = {"ns": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "nsecond": 1,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


# Metrics kept per kernel where the ncu run asked for them (device_session.sh's NCU_METRICS): why a kernel takes
# what it takes (registers, achieved occupancy, L1 and DRAM throughput).
EXTRA = ("launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
         "l1tex__throughput.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed")


def number(text):
    return float(text.replace(",", ""))  # ncu writes thousands separators


def parse(path):
    """One JSON line per case: its kernels (those after its marker), their summed time and DRAM traffic."""
    names = [(n, moved) for n, moved, _ in cases()]
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    groups, units = [], None
    for row in csv.DictReader(lines):
        if units is None:  # the first row holds each column's unit
            units = {k: SCALE.get(v, 1) for k, v in row.items()}
            continue
        kernel = row["Kernel Name"]
        ns = number(row["gpu__time_duration.sum"]) * units["gpu__time_duration.sum"]
        nbytes = (number(row["dram__bytes_read.sum"]) * units["dram__bytes_read.sum"] +
                  number(row["dram__bytes_write.sum"]) * units["dram__bytes_write.sum"])
        extra = {k: number(row[k]) for k in EXTRA if row.get(k)}
        if MARK.search(kernel):
            groups.append([])
        elif groups:
            groups[-1].append((kernel, ns, nbytes, extra))
    if len(groups) != len(names):
        print(json.dumps({"bench": "kernel_time", "error": f"{len(groups)} marked ranges for {len(names)} cases"}))
    copy_gbs = [moved / sum(g[1] for g in group) for (name, moved), group in zip(names, groups)
                if name.startswith(COPY) and group]
    baseline = statistics.median(copy_gbs) if copy_gbs else None
    if baseline:
        print(json.dumps({"bench": "copy_baseline", "copies": len(copy_gbs), "median_gbs": baseline,
                          "min_gbs": min(copy_gbs), "max_gbs": max(copy_gbs)}))
    for (name, moved), group in zip(names, groups):
        ns = sum(g[1] for g in group)
        nbytes = sum(g[2] for g in group)
        rec = {"bench": "kernel_time", "case": name, "kernels": [g[0][:80] for g in group], "gpu_us": ns / 1e3,
               "kernel_us": [g[1] / 1e3 for g in group], "dram_gbs": nbytes / ns if ns else None}
        if any(g[3] for g in group):
            rec["kernel_metrics"] = [g[3] for g in group]
        if PREFILL.search(name):
            rec["tflops"] = moved / ns / 1e3 if ns else None
        else:
            rec["required_bytes_gbs"] = moved / ns if ns else None
            if baseline and ns:  # of the run's median copy bandwidth
                rec["of_copy"] = moved / ns / baseline
        print(json.dumps(rec))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parse", metavar="NCU_CSV")
    a = p.parse_args()
    if a.parse:
        parse(a.parse)
    else:
        run_cases()
