"""Builds the Metal emulator (tests/metal_emu) for every kernels/metal/*.metal and runs dispatches on it.

`build(out_dir)` compiles each kernel file, with its generated launchers, against the Metal shim, and
links them with the runtime into one executable. `Emulator.dispatch(...)` runs one dispatch in a
subprocess (an out-of-bounds access ends that process, not pytest) and returns every buffer's contents
after it.
"""

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
METAL_DIR = ROOT / "kernels" / "metal"
sys.path.insert(0, str(HERE))
import gen_launchers  # noqa: E402

CXX = shutil.which("g++")
INCLUDES = [HERE, ROOT]
# The Metal-language check's flags: warnings that matter in MSL are errors here too. Attributes are
# Metal's (unknown to g++) and no contraction: the dequantize kernels must round like the CPU.
# -fexcess-precision=16: half arithmetic rounds to half after every operation, as Metal's does (g++ would
# otherwise compute _Float16 expressions in float).
CHECK_FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-Wno-attributes", "-Wno-unknown-pragmas",
               "-Wno-unused-parameter", "-ffp-contract=off", "-fexcess-precision=16"]


# The kernels' instrumentation (tests/metal_emu/traffic.h): ThreadSanitizer's calls before every access,
# answered by traffic.cpp (libtsan is not linked); aggregate loads kept whole.
# -fcallgraph-info writes each unit's call graph (<unit>.ci) for call_graph_violations.
INSTRUMENT_FLAGS = ["-fsanitize=thread", "-fno-tree-sra", "-fcallgraph-info"]


def metal_sources() -> list[Path]:
    return sorted(METAL_DIR.glob("*.metal"))


def compile_check(metal_file: Path, out_dir: Path) -> subprocess.CompletedProcess:
    """g++ -fsyntax-only on the kernel source with the shim: the Metal-language check."""
    source = gen_launchers.metal_source_for_gcc(metal_file, out_dir)
    cmd = [CXX, *CHECK_FLAGS, *[f"-I{d}" for d in INCLUDES], "-fsyntax-only", "-x", "c++", str(source)]
    return subprocess.run(cmd, capture_output=True, text=True)


CLANG = shutil.which("clang++") or shutil.which("clang++-14")
# The strict check: clang with the shim's METAL_EMU_STRICT, each address space a distinct type qualifier.
STRICT_FLAGS = ["-std=c++17", "-fsyntax-only", "-DMETAL_EMU_STRICT", "-Wall", "-Wextra", "-Werror",
                "-Wno-unknown-attributes", "-Wno-unused-parameter", "-Xclang", "-fnative-half-type", "-Xclang",
                "-fnative-half-arguments-and-returns"]
# clang takes no attributes on an explicit instantiation (Apple's compiler does): the strict copy drops them.
_EXPORT_ATTRIBUTES = re.compile(r'(template)\s*\[\[\s*host_name\s*\([^\]]*\)\s*\]\]\s*\[\[\s*kernel\s*\]\]')


def strict_check(metal_file: Path, out_dir: Path) -> subprocess.CompletedProcess:
    """clang -fsyntax-only with address spaces as types: a device pointer where a threadgroup (or thread)
    one is expected fails, as it does in Apple's compiler."""
    source = gen_launchers.metal_source_for_gcc(metal_file, out_dir)
    strict = out_dir / (metal_file.stem + ".strict.metal")
    strict.write_text(_EXPORT_ATTRIBUTES.sub(r"\1", source.read_text()))
    cmd = [CLANG, *STRICT_FLAGS, *[f"-I{d}" for d in INCLUDES], "-x", "c++", str(strict)]
    return subprocess.run(cmd, capture_output=True, text=True)


# Metal rules g++ cannot see through the shim (its address spaces are erased): a pointer or reference
# declared without an address space, and C++ that MSL lacks. A line-based check of kernels/metal.
_TYPES = r"(?:float|half|uchar|ushort|uint|int|char|short|ulong|long|bool|T|S|block|block_\w+|\w+Args)"
_POINTER_DECL = re.compile(r"(?<![\w.)\]])((?:\w+\s+){0,3})(?:const\s+)?" + _TYPES
                           + r"\s*[*&]\s*(?:const\s+)?(?=[A-Za-z_()])")
_ADDRESS_SPACE = re.compile(r"\b(device|threadgroup|constant|thread)\b")
_NOT_MSL = [(re.compile(r"\bdouble\b"), "double (MSL has no double)"),
            (re.compile(r"\bstd::"), "the C++ standard library"),
            (re.compile(r"\b(printf|malloc|new|delete|throw|try)\b"), "a C++ feature MSL lacks"),
            (re.compile(r"\bkernel\s+void\b"), "the `kernel` keyword (write [[kernel]]: the emulator looks for it)")]


def msl_rule_violations(path: Path) -> list[str]:
    """Lines of a kernel source that break a Metal rule the g++ check cannot enforce."""
    text = re.sub(r"//[^\n]*", "", path.read_text())
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("#") and "define" not in line:
            continue
        for m in _POINTER_DECL.finditer(line):
            if not _ADDRESS_SPACE.search(m.group(1)) and not _ADDRESS_SPACE.search(line[:m.start()].split("(")[-1]):
                found.append(f"{path.name}:{number}: pointer/reference without an address space: {line.strip()}")
        for pattern, what in _NOT_MSL:
            if pattern.search(line):
                found.append(f"{path.name}:{number}: {what}: {line.strip()}")
    return found


# What MSL forbids in kernel code and a compiler accepts: recursion, calls through a pointer (function
# pointers, virtual calls), dynamic allocation. Read from g++'s call graph of the compiled kernels.
_ALLOCATORS = re.compile(r"operator (new|delete)|\b(malloc|calloc|realloc|free|aligned_alloc)\b")


def call_graph_violations(ci_file: Path) -> list[str]:
    """Recursion, indirect calls and allocation in the functions defined in kernels/ (a -fcallgraph-info
    file of a kernel unit)."""
    nodes, edges = {}, []
    for line in ci_file.read_text().splitlines():
        m = re.match(r'node: \{ title: "([^"]+)" label: "([^"]*)"', line)
        if m:
            nodes[m.group(1)] = m.group(2).replace("\\n", " ")
        m = re.match(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"', line)
        if m:
            edges.append((m.group(1), m.group(2)))
    ours = {n for n, label in nodes.items() if "/kernels/" in label}
    found = []
    calls = {}
    for src, dst in edges:
        if src not in ours:
            continue
        calls.setdefault(src, set()).add(dst)
        if dst == "__indirect_call":
            found.append(f"indirect call (function pointer or virtual) in {nodes[src]}")
        elif _ALLOCATORS.search(nodes.get(dst, dst)):
            found.append(f"dynamic allocation ({nodes.get(dst, dst)}) in {nodes[src]}")
    # Recursion: a cycle among our functions (depth-first search, colours 1 = on the path, 2 = done).
    colour = {}

    def visit(n, path):
        colour[n] = 1
        for d in calls.get(n, ()):
            if d not in ours:
                continue
            if colour.get(d) == 1:
                found.append("recursion: " + " -> ".join(nodes[p] for p in path[path.index(d):] + [d]))
            elif d not in colour:
                visit(d, path + [d])
        colour[n] = 2

    for n in sorted(ours):
        if n not in colour:
            visit(n, [n])
    return found


class Emulator:
    def __init__(self, binary: Path, kernels: list[str], work_dir: Path, planner: Path | None = None):
        self.binary = binary
        self.kernels = set(kernels)
        self.work_dir = work_dir
        self.planner = planner
        self._count = 0
        self.traffic = None

    def plan(self, op: str, **fields) -> dict:
        """The launch plan csrc/backend/metal encodes for `op` (launch_plans.h): kernel, groups, threads,
        threadgroup_bytes, args (the argument block's bytes)."""
        argv = [str(self.planner), f"op={op}"] + [f"{k}={v:.9g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in fields.items()]
        plan = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
        plan["args"] = bytes.fromhex(plan["args"])
        if plan.get("group"):  # mul_mat_id's grouping dispatch, which runs first
            plan["group"]["args"] = bytes.fromhex(plan["group"]["args"])
        return plan

    def dispatch_plan(self, plan: dict, buffers: dict, args_index: int, seed: int = 0, aliases: dict | None = None,
                      traffic: bool = False):
        """Runs a plan from `plan` with its argument block bound at [[buffer(args_index)]]."""
        tg = {0: plan["threadgroup_bytes"]} if plan["threadgroup_bytes"] else {}
        return self.dispatch(plan["kernel"], plan["groups"], (plan["threads"],), {**buffers, args_index: plan["args"]},
                             threadgroup=tg, seed=seed, aliases=aliases, traffic=traffic)

    def dispatch(self, kernel: str, groups, threads, buffers: dict, threadgroup: dict | None = None,
                 seed: int = 0, expect_failure: bool = False, aliases: dict | None = None, traffic: bool = False):
        """Runs `kernel` on a grid of `groups` threadgroups of `threads` threads. buffers: index -> numpy
        array (or bytes); threadgroup: index -> bytes of threadgroup memory; aliases: index -> index of a
        buffer bound there too (in-place outputs). Returns index -> uint8 array of each buffer after the
        dispatch (or, with expect_failure, the emulator's error message)."""
        assert kernel in self.kernels, f"{kernel} is not a kernel of kernels/metal"
        self._count += 1
        d = self.work_dir / f"dispatch{self._count}"
        d.mkdir()
        pad = lambda v: tuple(v) + (1,) * (3 - len(tuple(v)))  # noqa: E731
        lines = [f"kernel {kernel}", "groups %d %d %d" % pad(groups), "threads %d %d %d" % pad(threads),
                 f"seed {seed}"]
        for index, data in buffers.items():
            path = d / f"buffer{index}.bin"
            path.write_bytes(data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes())
            lines.append(f"buffer {index} {path}")
        for index, size in (threadgroup or {}).items():
            lines.append(f"threadgroup {index} {size}")
        for index, other in (aliases or {}).items():
            lines.append(f"alias {index} {other}")
        if traffic:
            lines.append(f"traffic {d / 'traffic.json'}")
        job = d / "job.txt"
        job.write_text("\n".join(lines) + "\n")
        result = subprocess.run([str(self.binary), str(job)], capture_output=True, text=True, timeout=120)
        if expect_failure:
            assert result.returncode != 0, f"{kernel}: the emulator found nothing wrong"
            return result.stderr
        assert result.returncode == 0, f"{kernel}: emulator failed ({result.returncode}): {result.stderr}"
        out = {i: np.fromfile(d / f"buffer{i}.bin.out", dtype=np.uint8) for i in buffers}
        self.traffic = {int(k): v for k, v in json.loads((d / "traffic.json").read_text()).items()} if traffic else None
        shutil.rmtree(d)
        return out


def build(out_dir: Path, sources: list[Path] | None = None) -> Emulator:
    """Compiles the kernel files (every kernels/metal/*.metal by default) with their launchers, and the
    runtime, into one executable."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = []
    units = []
    for metal_file in sources or metal_sources():
        cpp = out_dir / f"{metal_file.stem}_launchers.cpp"
        kernels += gen_launchers.generate(metal_file, cpp, CXX, INCLUDES)
        units.append(cpp)
    units += [HERE / "runtime.cpp", HERE / "traffic.cpp"]

    def compile_unit(cpp: Path) -> Path:
        obj = out_dir / (cpp.stem + ".o")
        # The kernels' units call the traffic model's hooks before every memory access (traffic.h).
        hooks = INSTRUMENT_FLAGS if cpp.parent == out_dir else []
        subprocess.run([CXX, *CHECK_FLAGS, "-O1", *hooks, *[f"-I{d}" for d in INCLUDES], "-c", str(cpp), "-o",
                        str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(max_workers=2) as pool:
        objects = list(pool.map(compile_unit, units))
    binary = out_dir / "metal_emu"
    subprocess.run([CXX, *map(str, objects), "-o", str(binary)], check=True)
    planner = out_dir / "metal_plan"
    subprocess.run([CXX, "-std=c++20", "-O1", "-Wall", "-Werror", f"-I{ROOT}", str(HERE / "plan.cpp"), "-o",
                    str(planner)], check=True)
    return Emulator(binary, kernels, out_dir, planner)


# --- conversions for the tests ----------------------------------------------------------------------

def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (as the kernels store)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f16_rounded(x: np.ndarray) -> np.ndarray:
    """float32 -> float16, round to nearest even, overflowing to inf as the kernels' stores do."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# name -> (numpy storage dtype, to storage, to float32)
DTYPES = {
    "f32": (np.float32, lambda a: np.asarray(a, np.float32), lambda b: b.view(np.float32)),
    "f16": (np.float16, f16_rounded, lambda b: b.view(np.float16).astype(np.float32)),
    "bf16": (np.uint16, bf16_bits, lambda b: bf16_to_f32(b.view(np.uint16))),
}


# --- the traffic figures (tests/metal_emu/traffic.h) -------------------------------------------------

LINE_BYTES = 128


def traffic_figures(kernel: str, case: str, traffic: dict, weight_index: int | None, weight_bytes: int,
                    ignore: tuple = (), threadgroup_bytes: int = 0) -> dict:
    """One kernel launch's figures from the emulator's per-buffer totals. bytes_per_weight_byte: the bytes
    the launch requests from the weight buffer (128-byte lines touched per simdgroup load, no cache)
    over its size; other_bytes_per_weight_byte: the same for the other inputs (x), over the weight's
    size; coalesced_share: the share of simdgroup load instructions that read adjacent aligned 4/8/16-byte
    words (of every buffer but `ignore`, the argument blocks). Proxies, not speeds. For kernels without a
    weight (weight_index None), the first figure is over the bytes of buffer 0 (the input)."""
    loads = {i: t for i, t in traffic.items() if i not in ignore}
    instructions = sum(t["instructions"] for t in loads.values())
    main = weight_index if weight_index is not None else 0
    figures = {
        "kernel": kernel,
        "case": case,
        "bytes_per_weight_byte": round(loads.get(main, {}).get("lines", 0) * LINE_BYTES / weight_bytes, 3),
        "other_bytes_per_weight_byte": round(sum(t["lines"] for i, t in loads.items() if i != main) * LINE_BYTES
                                             / weight_bytes, 3),
        "coalesced_share": round(sum(t["coalesced"] for t in loads.values()) / max(instructions, 1), 3),
        "narrow_loads": sum(t["narrow"] for t in loads.values()),
        "misaligned_loads": sum(t["misaligned"] for t in loads.values()),
        "threadgroup_bytes": threadgroup_bytes,
    }
    print(json.dumps(figures))
    return figures
