"""Writes the emulator's launchers for one .metal file: for every kernel it exports (an explicit
instantiation `template [[host_name("...")]] [[kernel]] void f<...>(...);` or a plain
`[[kernel]] void f(...) {`), a C++ function that calls it with each parameter bound from its attribute
([[buffer(i)]], [[threadgroup(i)]], [[thread_position_in_grid]], ...), registered under the host name.

The kernel source is read after the preprocessor (with the Metal shim), so parameter lists written once
as macros, as the kernels do, are seen expanded. One rewrite precedes it (`metal_source_for_gcc`): the
attribute [[threadgroup(i)]] is renamed, since the shim's empty `threadgroup` macro would erase its name.
A parameter without an attribute, or with one the emulator does not know, is an error: Metal would bind
it by rules this emulator does not model.
"""

import re
import subprocess
from pathlib import Path

BUILTINS = {
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "thread_index_in_threadgroup", "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup", "threads_per_simdgroup",
}

_INSTANTIATION = re.compile(
    r'template\s*\[\[\s*host_name\s*\(\s*((?:"[^"]*"\s*)+)\)\s*\]\]\s*'
    r'\[\[\s*kernel\s*\]\]\s*void\s+([\w:]+\s*<[^;{(]*>)\s*\(')
_PLAIN = re.compile(r'\[\[\s*kernel\s*\]\]\s*void\s+(\w+)\s*\(')
_ATTRIBUTE = re.compile(r'^(.*?)\s*\[\[\s*(\w+)\s*(?:\(\s*(\w+)\s*\))?\s*\]\]\s*$', re.S)
_DECL = re.compile(r'^(.*?)\b(\w+)\s*$', re.S)


def _balanced(text: str, open_index: int) -> tuple[str, int]:
    """The text inside the parentheses opening at open_index, and the index after the closing one."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_index + 1:i], i + 1
    raise ValueError("unbalanced parentheses in a kernel signature")


def _split_params(params: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, c in enumerate(params):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(params[start:i])
            start = i + 1
    if params.strip():
        out.append(params[start:])
    return [p.strip() for p in out]


def _binding(param: str, kernel: str) -> str:
    m = _ATTRIBUTE.match(param)
    if not m:
        raise ValueError(f"{kernel}: parameter `{param}` has no attribute")
    attribute, index = m.group(2), m.group(3)
    if attribute in ("buffer", "threadgroup_binding"):
        kind = "buffer" if attribute == "buffer" else "threadgroup_memory"
        return f"{{metal_emu::Attr::{kind}, {int(index)}}}"
    if attribute in BUILTINS:
        return f"{{metal_emu::Attr::{attribute}, 0}}"
    raise ValueError(f"{kernel}: attribute [[{attribute}]] is not emulated")


def kernels(preprocessed: str) -> list[tuple[str, str, list[str]]]:
    """(host name, function to call, parameter bindings) for every kernel the source exports."""
    found = []
    for m in _INSTANTIATION.finditer(preprocessed):
        params, _ = _balanced(preprocessed, m.end() - 1)
        host = "".join(re.findall(r'"([^"]*)"', m.group(1)))
        found.append((host, m.group(2), [_binding(p, host) for p in _split_params(params)]))
    for m in _PLAIN.finditer(preprocessed):
        params, after = _balanced(preprocessed, m.end() - 1)
        if not preprocessed[after:].lstrip().startswith("{"):
            continue  # a declaration
        if preprocessed[:m.start()].rstrip().endswith(">"):
            continue  # a template: exported through its instantiations
        name = m.group(1)
        found.append((name, name, [_binding(p, name) for p in _split_params(params)]))
    return found


def metal_source_for_gcc(metal_file: Path, out_dir: Path) -> Path:
    """A copy of the kernel source that g++ reads with the shim: [[threadgroup(i)]] renamed (the shim's
    empty `threadgroup` macro would erase the attribute's name), line numbers kept."""
    text = metal_file.read_text().replace("[[threadgroup(", "[[threadgroup_binding(")
    copy = out_dir / (metal_file.stem + ".gcc.metal")
    copy.write_text(f'#line 1 "{metal_file.resolve()}"\n' + text)
    return copy


def generate(metal_file: Path, out_cpp: Path, cxx: str, include_dirs: list[Path]) -> list[str]:
    """Writes out_cpp (the kernel source plus its launchers) and returns the host names it registers."""
    includes = [f"-I{d}" for d in include_dirs]
    source = metal_source_for_gcc(metal_file, out_cpp.parent)
    pre = subprocess.run([cxx, "-E", "-P", "-std=c++17", *includes, "-x", "c++", str(source)],
                         check=True, capture_output=True, text=True).stdout
    found = kernels(pre)
    lines = [f"// Generated by tests/metal_emu/gen_launchers.py from {metal_file.name}; do not edit.",
             "#include <metal_stdlib>", f'#include "{source.resolve()}"', '#include "launch_support.h"',
             "namespace {"]
    for i, (host, function, bindings) in enumerate(found):
        lines += [f"const metal_emu::ParamBinding bindings_{i}[] = {{{', '.join(bindings)}}};",
                  f"void launch_{i}(const metal_emu::Invocation& inv) {{",
                  f'  metal_emu::call_kernel(&{function}, inv, bindings_{i}, "{host}");', "}",
                  f'const metal_emu::Registration registration_{i}("{host}", launch_{i});']
    lines.append("}  // namespace")
    out_cpp.write_text("\n".join(lines) + "\n")
    return [host for host, _, _ in found]
