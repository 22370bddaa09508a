"""CI's share of the GGUF fuzzer (tests/fuzz_gguf.py): 2,000 mutated files, each loading or raising a clean
exception, none crashing the process. Longer runs: python tests/fuzz_gguf.py --cases 100000."""

import json
import os
import subprocess
import sys
from pathlib import Path

FUZZER = Path(__file__).with_name("fuzz_gguf.py")


def test_mutated_gguf_files_load_or_raise_cleanly(tmp_path):
    out = tmp_path / "fuzz.json"
    run = subprocess.run([sys.executable, str(FUZZER), "--cases", "2000", "--out", str(out)], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.exists(), run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["crashes"] == [] and summary["unclean"] == {}, summary
    counted = summary["loaded"] + sum(summary["exceptions"].values())
    assert counted == 2000 and summary["exceptions"].get("GGUFFormatError", 0) > 1000, summary
    assert run.returncode == 0, run.stderr[-3000:]
