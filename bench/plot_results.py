"""Plots of the canonical results in bench/results/ for docs/performance.md.

    python bench/plot_results.py            # writes docs/img/*.png (needs matplotlib)

Every number plotted is read from a result file (JSON lines; a line that is not JSON is skipped); nothing
is measured here. The file each plot comes from is printed in its title.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HEADLINE_TYPES = ["Q4_0", "Q4_K", "Q6_K", "Q8_0"]
COLORS = {"Q4_0": "tab:blue", "Q4_K": "tab:orange", "Q6_K": "tab:green", "Q8_0": "tab:red", "Q5_K": "tab:purple",
          "MXFP4": "tab:brown", "Q4_1": "tab:pink"}
# Bytes per block and elements per block (ggml's layouts, docs/formats.md), for the weight's size.
BLOCK = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32), "Q4_K": (144, 256), "Q5_K": (176, 256),
         "Q6_K": (210, 256), "MXFP4": (17, 32)}
SHAPES = [(14336, 4096), (4096, 14336)]


def read_lines(name: str) -> list[dict]:
    rows = []
    for line in (RESULTS / name).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def weight_bytes(ggml_type: str, n: int, k: int) -> int:
    size, elems = BLOCK[ggml_type]
    return n * k // elems * size


def kernel_cases(rows: list[dict]) -> dict[str, list[float]]:
    """case name (without a [VARIANT] suffix) -> the kernel times (us) measured for it in the run."""
    cases: dict[str, list[float]] = {}
    for r in rows:
        if r.get("bench") == "kernel_time":
            name = re.sub(r"\s*\[.*\]$", "", r["case"])
            cases.setdefault(name, []).append(r["gpu_us"])
    return cases


def plot_gpu_decode(name: str, out: Path) -> None:
    rows = read_lines(name)
    cases = kernel_cases(rows)
    copy_gbs = next(r["median_gbs"] for r in rows if r.get("bench") == "copy_baseline")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (n, k) in zip(axes, SHAPES):
        for t in HEADLINE_TYPES:
            ms = [m for m in range(1, 9) if f"{t} {n}x{k} m={m}" in cases]
            times = [sum(cases[f"{t} {n}x{k} m={m}"]) / len(cases[f"{t} {n}x{k} m={m}"]) for m in ms]
            ax.plot(ms, times, "o-", color=COLORS[t], label=t)
            roof = weight_bytes(t, n, k) / (copy_gbs * 1e3)  # us to read the weight at the copy's rate
            ax.axhline(roof, color=COLORS[t], ls=":", lw=1)
        mlx = [(m, cases[f"mlx affine4 {n}x{k} m={m}"][0]) for m in (1, 8) if f"mlx affine4 {n}x{k} m={m}" in cases]
        if mlx:
            ax.plot(*zip(*mlx), "k^--", label="MLX affine 4-bit")
        ax.set_title(f"weight {n}x{k}")
        ax.set_xlabel("rows of x (m)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("kernel time, us")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"H100 decode, kernel time vs rows of x; dotted: the weight's bytes at the median MLX copy "
                 f"rate ({name})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_prefill(files: dict[str, str], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    width = 0.8 / (2 * len(files))
    for ax, (n, k) in zip(axes, SHAPES):
        bar = 0
        for gpu, name in files.items():
            rows = read_lines(name)
            tflops = {r["case"]: r["tflops"] for r in rows if r.get("bench") == "kernel_time" and "tflops" in r}
            for route, suffix, hatch in (("dense route", "", None), ("tiles on the blocks", " blocks", "//")):
                xs, ys = [], []
                for i, t in enumerate(HEADLINE_TYPES):
                    case = f"{t} {n}x{k} m=512{suffix}"
                    if case in tflops:
                        xs.append(i + (bar - len(files) + 0.5) * width)
                        ys.append(tflops[case])
                ax.bar(xs, ys, width, hatch=hatch, label=f"{gpu} {route}", alpha=0.85)
                bar += 1
            peer = tflops.get(f"mlx fp16 matmul {n}x{k} m=512")
            if peer:
                ax.axhline(peer, ls="--" if gpu == "H100" else ":", lw=1, color="black",
                           label=f"MLX fp16 matmul, {gpu}")
        ax.set_xticks(range(len(HEADLINE_TYPES)), HEADLINE_TYPES)
        ax.set_title(f"weight {n}x{k}, m=512")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (kernel time)")
    axes[0].set_ylim(0, 950)
    axes[0].legend(fontsize=7, loc="upper left", ncol=3)
    fig.suptitle("Prefill, float16 x: " + ", ".join(files.values()), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_cpu_decode(name: str, out: Path) -> None:
    rows = [r for r in read_lines(name) if r.get("bench") == "quantized_matmul_decode"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (n, k) in zip(axes, SHAPES):
        for t in sorted({r["type"] for r in rows}, key=lambda t: (t not in HEADLINE_TYPES, t)):
            pts = sorted((r["m"], r["time_us"] / 1e3) for r in rows if r["type"] == t and tuple(r["shape"]) == (n, k))
            if not pts or t not in BLOCK:
                continue
            ax.plot(*zip(*pts), "o-", color=COLORS.get(t), label=t)
            roofline = [r["read_roofline_gbs"] for r in rows if r["type"] == t and r["m"] == 1
                        and tuple(r["shape"]) == (n, k)]
            if roofline:
                ax.axhline(weight_bytes(t, n, k) / (roofline[0] * 1e6), color=COLORS.get(t), ls=":", lw=1)
        ax.set_title(f"weight {n}x{k}")
        ax.set_xlabel("rows of x (m)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("time per product, ms")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"CPU decode, 2 threads; dotted: the weight's bytes at the read roofline ({name})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plot_gpu_decode("h100-2026-11-26-decode-kernel-times.json", args.out / "h100-decode.png")
    plot_prefill({"H100": "h100-2026-11-26-prefill-kernel-times.json", "H200": "h200-2026-11-25-kernel-times.json"},
                 args.out / "gpu-prefill.png")
    plot_cpu_decode("cpu-zen3-avx2-2026-11-26-matmul.json", args.out / "cpu-zen3-avx2-decode.png")
    plot_cpu_decode("cpu-zen4-avx512-2026-11-25-matmul.json", args.out / "cpu-zen4-avx512-decode.png")
    print("wrote", ", ".join(sorted(p.name for p in args.out.glob("*.png"))))


if __name__ == "__main__":
    main()
