"""A fork's first day (issue 52, false green 2): the documented flow must not record the fork's own
bugs as known.

A tree that is not a pinned source but says it is a pinned version (its CMakeLists) starts from
upstream's shipped baseline: upstream's known failures xfail, and a failure upstream does not have
is red as the fork's own. Recording a baseline of the fork splits its entries into upstream's and
the fork's own; an own entry stays red until the user gives it an "accepted" reason. Before this,
the story's fork recorded 276 known failures (its CONCAT bug among them) and the next run was green:
with gate/baseline.py's Baseline.known returning every entry, the third run below is green again.
"""

import json

import pytest

SELECT = ("-k", "concat_dim1 and permute_0213 or acc and transpose and not residual")


@pytest.mark.slow
def test_a_fork_starts_from_upstream_and_its_own_bug_stays_red_until_accepted(pytester, ggml_variant):
    root, _ = ggml_variant("concat-buggy")      # the story's fork: ggml 0.15.3 with a CONCAT backward bug
    common = ("--gradgate", f"--gradgate-ggml-src={root}", *SELECT, "-p", "no:cacheprovider")

    first = pytester.runpytest_subprocess(*common)
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    first.stdout.fnmatch_lines(["gradgate: baseline: upstream ggml-0.15.3's known failures (*",
                                "*concat_dim1[[]permute_0213_transpose-sqr-cpu[]]: not in upstream ggml-0.15.3's known "
                                "failures (*): the fork's own failure: MAA *"])
    outcomes = first.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["xfailed"] >= 2, outcomes    # acc's laid-out items are upstream's
    n_upstream = outcomes["xfailed"]

    recorded = pytester.runpytest_subprocess(*common, "--gradgate-update-baseline", "--gradgate-baseline=fork.json")
    recorded.stdout.fnmatch_lines([f"gradgate: baseline written to *fork.json: {n_upstream + 1} entries, {n_upstream} of "
                                   "them upstream ggml-0.15.3's known failures; 1 the fork's own, not accepted*",
                                   "  the fork's own: *concat_dim1[[]permute_0213_transpose-sqr-cpu[]]: *"])

    again = pytester.runpytest_subprocess(*common, "--gradgate-baseline=fork.json")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines(["*the fork's own failure (not in upstream ggml-0.15.3's known failures), recorded in "
                                "*fork.json without an \"accepted\" reason*"])

    data = json.loads((pytester.path / "fork.json").read_text())
    for entry in data["entries"].values():
        if entry.get("own"):
            entry["accepted"] = "the story's CONCAT bug, fixed in the next release"
    (pytester.path / "fork.json").write_text(json.dumps(data))
    accepted = pytester.runpytest_subprocess(*common, "--gradgate-baseline=fork.json")
    assert accepted.ret == pytest.ExitCode.OK, accepted.stdout.str()[-2000:]
    accepted.assert_outcomes(xfailed=n_upstream + 1)


@pytest.mark.slow
def test_a_search_on_a_fork_neither_takes_nor_records_its_own_bug_as_known(tmp_path, ggml_variant):
    """docs/fork.md step 6 after step 3: explore given the fork's baseline matched the CONCAT misread
    to the fork's own suite entry, which nobody accepted, and said "known"; --update-baseline then
    recorded it as a known explore finding, and the nightly search was green over the fork's own
    bug. Now an unaccepted own entry is known to no one, and a finding upstream's shipped baseline
    lacks is recorded as the fork's own, a new finding until accepted."""
    import subprocess
    import sys
    pytest.importorskip("hypothesis")
    root, _ = ggml_variant("concat-buggy")
    baseline = tmp_path / "fork.json"
    common = ["--no-database", "--ggml-src", str(root), "--ops", "concat", "--consumers", "transpose", "--budget", "8s",
              "--baseline", str(baseline)]

    def explore(*args):
        return subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "explore", *common, *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    recorded = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", f"--gradgate-ggml-src={root}",
                               *SELECT, "-p", "no:cacheprovider", "--gradgate-update-baseline",
                               f"--gradgate-baseline={baseline}"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
    assert any(e.get("own") for e in json.loads(baseline.read_text())["entries"].values()), recorded.stdout[-2000:]

    first = explore("--seed", "1")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "concat misread" in first.stdout and "known" not in first.stdout.split("concat misread")[1].split("\n")[0]

    written = explore("--seed", "1", "--update-baseline")
    assert written.returncode == 0, written.stderr
    assert "of them the fork's own, not in upstream ggml-0.15.3's known failures" in written.stderr
    explore_entries = json.loads(baseline.read_text())["explore"]
    assert explore_entries and all(e["own"] == "ggml-0.15.3" for e in explore_entries.values())
    assert explore("--seed", "2").returncode == 1        # still new: nobody accepted it

    data = json.loads(baseline.read_text())
    for entry in [*data["entries"].values(), *data["explore"].values()]:
        if entry.get("own"):
            entry["accepted"] = "the story's CONCAT bug, fixed in the next release"
    baseline.write_text(json.dumps(data))
    accepted = explore("--seed", "2")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
