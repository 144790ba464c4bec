"""The benchmark scripts run on demand, not in CI: here each one at least imports what it
uses and parses its options (`--help`), so that a moved module cannot break one unseen, as
moving result.ggml_message to isolation/crash.py broke bench/op_table.py once."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "reference.py")   # reference.py: a module


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script):
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_reference_module_imports():
    proc = subprocess.run([sys.executable, "-c", "import reference"], cwd=BENCH, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
