"""Fuzzes gguf.load with mutated valid GGUF files: every case must load or raise a clean Python exception.

    python tests/fuzz_gguf.py [--cases N] [--seed S] [--out results.json]

Seed files are written with gguf.save (metadata of every value type, nested and string arrays, tensors of
several ggml types); each case applies 1 to 4 random mutations (bit flips, bytes set to edge values such as
0, 2^31, 2^63 or the file length at the header's length and count fields, truncation, inserted or deleted
bytes, a repeated span), writes the file and loads it; a file that loads has each small tensor dequantized,
so the kernels meet whatever shapes and types the header now claims. The cases run in a worker process in
a fast loop; a crash (a signal, an abort) ends the worker, is recorded with its case number, and a new worker
goes on from the next case. Reports cases, loads, GGUFFormatError, other exceptions by type, crashes, the
slowest case and the worker's peak RSS. Exit status 1 if any case crashed or raised something other than
GGUFFormatError, ValueError or TypeError (a file the reader itself cannot map raises OSError: also clean).
CI runs the default, 2,000 cases (tests/test_fuzz_gguf.py).
"""

import argparse
import json
import mmap
import os
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import mlx_ggml_ext  # noqa: F401
except ImportError:  # run from a source checkout: the package is the folder above tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLEAN = ("GGUFFormatError", "ValueError", "TypeError", "OSError", "FileNotFoundError", "PermissionError")
EDGE_U64 = [0, 1, 2, 3, 4, 7, 8, 12, 13, 24, 31, 32, 255, 256, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
            2**32, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def seed_files(directory: Path) -> list:
    """A few valid GGUF files (bytes) covering the format's value types and some tensor types."""
    import mlx.core as mx
    from mlx_ggml_ext import GGMLTensor, GGMLType, gguf, ops
    from mlx_ggml_ext.gguf import Value, ValueType
    rng = np.random.default_rng(0)
    w = mx.array(rng.standard_normal((4, 64)).astype(np.float32))
    tensors = {"f32": np.arange(8, dtype=np.float32), "f16": np.ones((2, 32), np.float16),
               **{t.name.lower(): GGMLTensor(ops.quantize(w[:, :64] if t.block_size <= 64 else mx.tile(w, (1, 4)), t,
                                                      stream=mx.cpu),
                                             t, (4, 64 if t.block_size <= 64 else 256))
                  for t in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.MXFP4)}}
    metadata = {"general.architecture": "fuzz", "general.name": "seed", "u8": Value(7, ValueType.UINT8),
                "i16": Value(-3, ValueType.INT16), "f64": Value(0.5, ValueType.FLOAT64), "flag": True,
                "u64": Value(2**40, ValueType.UINT64), "tokens": ["<s>", "</s>", "a", "bc", ""],
                "scores": np.linspace(0, 1, 5, dtype=np.float32), "nested": [[1, 2], [3], np.zeros(0, np.int16)],
                "bools": np.array([True, False, True])}
    files = []
    for i, (meta, tens, align) in enumerate([(metadata, tensors, None), ({"a": 1}, {"t": tensors["q4_0"]}, 64),
                                            (metadata, {}, None), ({}, {k: tensors[k] for k in ("f32", "q4_k")}, 32)]):
        path = directory / f"seed{i}.gguf"
        gguf.save(path, meta, tens, alignment=align)
        files.append(path.read_bytes())
    return files


def header_length(data: bytes) -> int:
    """Where the tensor data starts (mutations mostly aim before it: the data bytes are not parsed)."""
    from mlx_ggml_ext import gguf
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        return gguf.load(f.name).data_offset


def mutate(data: bytes, header: int, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not b:
            break
        where = rng.randrange(min(len(b), header) if rng.random() < 0.85 else len(b))
        op = rng.randrange(8)
        if op == 0:
            b[where] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[where] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op in (2, 3):  # a length/count field: 8 bytes (or 4) at an 4-byte-aligned-ish spot
            size = 8 if op == 2 else 4
            value = rng.choice(EDGE_U64 + [len(b), len(b) - where, rng.randrange(2**64)]) % (2**(8 * size))
            b[where:where + size] = value.to_bytes(size, "little")[:max(0, len(b) - where)]
        elif op == 4:
            del b[rng.randrange(len(b)):]
        elif op == 5:
            b[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 6:
            del b[where:where + rng.randint(1, 16)]
        else:
            n = rng.randint(1, 64)
            b[where:where] = b[max(0, where - n):where] * rng.randint(1, 8)
    return bytes(b)


def exercise(f) -> None:
    """Uses what loaded: metadata as plain values, small tensors dequantized."""
    import mlx.core as mx
    from mlx_ggml_ext import ops
    for t in f.tensors.values():
        if 0 < t.data.nbytes <= 1 << 16:
            mx.eval(ops.dequantize(t.data, t.ggml_type, t.shape))


def worker(args) -> None:
    """Runs cases [start, stop), writing the current case number into the progress file before each."""
    from mlx_ggml_ext import gguf  # noqa: F401  (imported before timing)
    directory = Path(args.dir)
    seeds = seed_files(directory)
    headers = [header_length(s) for s in seeds]
    progress = open(args.progress, "r+b")
    mark = mmap.mmap(progress.fileno(), 8)
    counts = {"loaded": 0, "exceptions": {}}
    examples = {}
    slowest = (0.0, -1)
    path = directory / "case.gguf"
    for case in range(args.start, args.stop):
        mark[:8] = struct.pack("<q", case)
        rng = random.Random(args.seed * 1_000_003 + case)
        k = rng.randrange(len(seeds))
        path.write_bytes(mutate(seeds[k], headers[k], rng))
        t0 = time.perf_counter()
        try:
            exercise(gguf.load(path))
            counts["loaded"] += 1
        except Exception as e:  # noqa: BLE001  (classified by type below)
            name = type(e).__name__
            counts["exceptions"][name] = counts["exceptions"].get(name, 0) + 1
            if name not in ("GGUFFormatError",) and len(examples.setdefault(name, [])) < 5:
                examples[name].append((case, str(e)[:300]))
        elapsed = time.perf_counter() - t0
        if elapsed > slowest[0]:
            slowest = (elapsed, case)
    mark[:8] = struct.pack("<q", args.stop)
    print(json.dumps({"counts": counts, "examples": examples, "slowest_s": slowest[0], "slowest_case": slowest[1],
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--out", help="write the summary here as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    t0 = time.perf_counter()
    total = {"cases": args.cases, "loaded": 0, "exceptions": {}, "crashes": [], "examples": {},
             "slowest_s": 0.0, "slowest_case": -1, "peak_rss_mib": 0.0, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="fuzz_gguf_") as tmp:
        progress = Path(tmp) / "progress"

        def run(start: int, stop: int):
            """A worker over [start, stop): its summary, or None and the case it crashed on."""
            progress.write_bytes(struct.pack("<q", -1))
            child = subprocess.run([sys.executable, __file__, "--worker", "--start", str(start), "--stop", str(stop),
                                    "--seed", str(args.seed), "--dir", tmp, "--progress", str(progress)],
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            if child.returncode == 0:
                return json.loads(child.stdout.strip().splitlines()[-1]), None
            reached = struct.unpack("<q", progress.read_bytes()[:8])[0]
            if reached < 0:
                raise RuntimeError(f"the fuzz worker failed before its first case:\n{child.stderr[-3000:]}")
            return None, {"case": reached, "returncode": child.returncode, "stderr": child.stderr[-2000:]}

        def add(part) -> None:
            total["loaded"] += part["counts"]["loaded"]
            for name, n in part["counts"]["exceptions"].items():
                total["exceptions"][name] = total["exceptions"].get(name, 0) + n
            for name, ex in part["examples"].items():
                total["examples"].setdefault(name, []).extend(ex)
            if part["slowest_s"] > total["slowest_s"]:
                total["slowest_s"], total["slowest_case"] = part["slowest_s"], part["slowest_case"]
            total["peak_rss_mib"] = max(total["peak_rss_mib"], part["peak_rss_mib"])

        start = 0
        while start < args.cases:  # chunks of 20,000 cases, a fresh worker each
            stop = min(args.cases, start + 20_000)
            part, crash = run(start, stop)
            if crash is None:
                add(part)
                start = stop
                continue
            total["crashes"].append(crash)
            if crash["case"] > start:  # the cases before the crash again (deterministic), for their counts
                part, again = run(start, crash["case"])
                if again is None:
                    add(part)
                else:
                    total["crashes"].append(again)
            start = crash["case"] + 1
    total["unclean"] = {k: v for k, v in total["exceptions"].items() if k not in CLEAN}
    total["wall_s"] = round(time.perf_counter() - t0, 1)
    summary = json.dumps(total, indent=1)
    print(summary)
    if args.out:
        Path(args.out).write_text(summary + "\n")
    return 1 if total["crashes"] or total["unclean"] else 0


if __name__ == "__main__":
    sys.exit(main())
