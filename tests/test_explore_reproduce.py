"""A finding's case is run again before explore prints it as a case to paste (issue 47 item 4: a
pasted finding passed in 1 of 8 identical runs).

The flaky verdict is real: tests/ggml_variants.py's flaky-scale variant makes the CPU SCALE kernel
wrong, in a process that runs it on several threads, by a schedule the test sets (a pattern and
a counter file in the environment, which the workers inherit): with "FFFFP", any 5 runs of a case
in fresh children fail exactly 4 times. A reproducible finding (5 of 5) is in
tests/test_explore_declared.py.
"""

import json
import subprocess
import sys

import pytest

from pytest_gradgate.gate.selection import PACKAGE_DIR
from pytest_gradgate.library.cache import cache_root

DEFAULT_BASELINE = str(PACKAGE_DIR / "gate" / "baseline_default.json")


@pytest.mark.slow
def test_a_flaky_finding_is_printed_as_flaky_with_how_many_runs_failed_not_as_a_case_to_paste(
        tmp_path, ggml_variant, monkeypatch):
    """Every new finding over the flaky SCALE is FLAKY, failed 4 of 5, with no paste line and no
    id to paste; the JSON says the same. Seen failing with the re-runs taken out of search.explore
    (reproduce.recheck not called): each was printed as `case, item ... (paste under cases: ...)`."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    root, _ = ggml_variant("flaky-scale")
    env = dict(__import__("os").environ, GRADGATE_TEST_FLAKY_PATTERN="FFFFP",
               GRADGATE_TEST_FLAKY_COUNTER=str(tmp_path / "counter"))
    out = tmp_path / "found.yaml"
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "explore", "--ggml-src", str(root),
                           "--ops", "scale", "--consumers", "none", "--budget", "5s", "--seed", "0", "--no-database",
                           "--baseline", DEFAULT_BASELINE, "--out", str(out)],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr       # a flaky finding is still a finding: the gate stays red
    new = [f for f in json.loads(out.with_suffix(".json").read_text())["findings"] if f["known"] is None]
    assert any(f["op"] == "scale" for f in new), new
    for f in new:
        assert f["flaky"] and (f["reproduced"]["runs"], f["reproduced"]["failed"]) == (5, 4), f
    assert proc.stdout.count("FLAKY: its case failed 4 of 5 identical runs") == len(new), proc.stdout
    assert "paste under" not in proc.stdout, proc.stdout
    assert "(flaky: failed 4 of 5 identical runs)" in out.read_text()     # the case file's comment says so
