"""Explore as a CI gate: known findings recorded in a baseline (keyed by op, class and site),
an op without a backward not a finding, one root cause one finding, and a fork's first run
saying how to record its baseline.

The searches here are a few seconds over one or two ops (`--ops`), on the default ggml or on
the "uncaught" variant that tests/test_explore.py builds already (one build for both files).
"""

import json
import subprocess
import sys

import pytest

from ggml_variants import REACH, UNCAUGHT

from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.declare.case import Case
from pytest_gradgate.explore import findings
from pytest_gradgate.gate.baseline import Baseline
from pytest_gradgate.gate.selection import PACKAGE_DIR

DEFAULT_BASELINE = PACKAGE_DIR / "gate" / "baseline_default.json"
CLAMP_KEY = "clamp ggml-abort ggml.c:7074"    # clamp's backward dies building on the clean default


def _explore(cwd, *args, timeout=240):
    return subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "explore", "--no-database", *args],
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def test_an_op_without_a_backward_is_not_searched_and_not_a_finding(runner):
    """CONCAT has no backward in the default ggml: a draw of it is UNSEARCHED (a line in the
    summary), not a finding that fails the gate. Seen failing with the bug put back: with
    classify's no-backward branch removed it returns (FINDING, ('concat', 'no-backward', ...)),
    which is what made every clean 60 s search exit 1 (concat, gelu, sigmoid, tanh, norm, ...)."""
    result = runner.run(Case(name="cat", graph="concat(a, b, dim=0)", params={"a": [2], "b": [2]}))
    assert result.kind == Diagnosis.NO_BACKWARD, (result.status, result.message)
    assert findings.classify(result, ("concat",)) == (findings.UNSEARCHED, ("concat",))


def _failed(op, kind, consumer="none", producer="none"):
    return Result(case_id="c", name="c", consumer=consumer, loss="sqr", backend="cpu", op=op, producer=producer,
                  status=Status.FAILED, phase=Phase.COMPARE, kind=kind)


def test_one_root_cause_is_one_key_however_the_draw_shows_it():
    """rope's odd head_dim bug (one ROPE backward) showed as rope_ext disagree, rope_multi
    disagree, wrong-positions, each contiguous and behind consumers: six findings of one bug.
    The key names the ggml op and the class's family, and a wrong gradient behind a layout is
    subsumed by the same one on contiguous tensors. Seen failing with the bug put back: with
    classify's key as it was, (table op, kind, ''), the first assert sees four keys; with the
    layout rule taken out of without_subsumed, the laid-out finding is kept beside the other."""
    keys = {findings.classify(_failed(op, kind, consumer))[1]
            for op in ("rope_ext", "rope_multi") for kind in (Diagnosis.DISAGREE, Diagnosis.WRONG_POSITIONS)
            for consumer in ("none",)}     # what the clean default showed at seeds 1, 2 and 3
    assert keys == {("rope", "misread", "contiguous")}
    laid_out = findings.classify(_failed("rope_ext", Diagnosis.DISAGREE, "transpose"))[1]
    assert laid_out == ("rope", "misread", "laid-out")
    held = [findings.Finding(key, {"name": "x", "graph": "rope_ext(a, pos, n_dims=2, mode=0)", "params": {"a": [3, 2]},
                                   "consumers": [c]}, {"status": "failed", "kind": "disagree"}, 1, 0.0)
            for key, c in ((("rope", "misread", "contiguous"), "none"), (laid_out, "transpose"))]
    assert [f.key for f in findings.without_subsumed(held)] == [("rope", "misread", "contiguous")]
    # other bugs stay apart: a wrong sign is not a misread, a crash keeps its site, other ops their name
    assert findings.classify(_failed("rope_ext", Diagnosis.WRONG_SIGN))[1] == ("rope", "wrong-sign", "contiguous")
    assert findings.classify(_failed("scale", Diagnosis.WRONG_SIGN))[1] == ("scale", "wrong-sign", "contiguous")


def test_a_recorded_finding_is_known_in_a_later_search_of_another_seed(tmp_path):
    """`gradgate explore --update-baseline` records the findings by key; a later run with
    another seed finds the same failure in another draw and matches it. Seen failing
    with the bug put back: with KnownFailures ignoring the baseline's `explore` section, the
    second run marks clamp [NEW] and exits 1."""
    baseline = tmp_path / "b.json"
    plain = tmp_path / "plain.json"       # a baseline with no entries: nothing is known from the suite
    plain.write_text(json.dumps({"schema": 2, "entries": {}}))
    first = _explore(tmp_path, "--ops", "clamp", "--budget", "2s", "--seed", "1", "--baseline", str(plain))
    assert first.returncode == 1 and f"{CLAMP_KEY}  [NEW]" in first.stdout, first.stdout + first.stderr
    recorded = _explore(tmp_path, "--ops", "clamp", "--budget", "2s", "--seed", "1", "--baseline", str(baseline),
                        "--update-baseline")
    assert recorded.returncode == 0, recorded.stderr
    entry = Baseline.load(baseline).explore[CLAMP_KEY]
    assert entry["status"] == "crashed" and "ggml.c:7074" in entry["reason"] and entry["case"]["graph"]
    # another seed draws other cases (it may meet clamp's other failures too, new to this file)
    again = _explore(tmp_path, "--ops", "clamp", "--budget", "2s", "--seed", "2", "--baseline", str(baseline))
    assert f"{CLAMP_KEY}  [known: explore: {CLAMP_KEY}]" in again.stdout, again.stdout + again.stderr
    assert f"{CLAMP_KEY}  [NEW]" not in again.stdout


def test_a_chain_or_a_layout_is_known_through_the_op_that_fails_alone():
    """The clean default's seed-1 search found sqr(rope_multi(a)) wrong behind producer
    view_gap (rope's odd head_dim: a = [3, 3]) and permute(get_rows(a)) dying at get_rows's
    ops.cpp:5142, and reported both NEW although the shipped baseline records rope's misread and
    get_rows's death. Seen failing with the bug put back: with mark_known calling match() on the
    finding's own key alone, the get_rows assert below sees None. Since the memory checks, rope's
    odd head_dim is a write past ROPE's output that the run names, keyed by ROPE whatever the
    chain (explore/findings.py): the chain's finding is known through its own key."""
    baseline = Baseline.load(DEFAULT_BASELINE)
    known = findings.KnownFailures(baseline)
    rope = {"name": "x", "graph": "sqr(rope_multi(a, pos, n_dims=2, sections=[1, 0, 0, 0], mode=40))",
            "params": {"a": [3, 3]}, "consumers": ["none"], "producers": ["view_gap"]}
    rows = {"name": "y", "graph": "permute(get_rows(a, rows), axes=[0, 1, 2, 3])", "params": {"a": [1]},
            "consumers": ["permute_2013"]}
    found = [findings.Finding(("rope", "out-of-bounds-write", "memory"), rope, {"status": "failed"}, 1, 0.0),
             findings.Finding(("permute", "ggml-abort", "ops.cpp:5142"), rows, {"status": "crashed"}, 1, 0.0)]
    sqr_rope, permute_rows = findings.mark_known(found, baseline)
    assert sqr_rope.known and sqr_rope.known["node"] == "explore: rope out-of-bounds-write memory"
    assert permute_rows.known and "get_rows" in permute_rows.known["node"]
    # ... and not a different bug of the outer op: a wrong sign of sqr stays new
    assert known.match_finding(("sqr", "wrong-sign", "laid-out"), "failed", rope) is None


def test_pytest_explore_records_its_findings_and_then_xfails_them(pytester):
    """`pytest --gradgate-explore ... --gradgate-update-baseline` writes the explore section with
    the suite's file; the next run shows the finding as xfail and exits 0. Seen failing with the
    bug put back: without the recording in gate/explore.py the second run fails clamp's item."""
    args = ("--gradgate-explore-ops=clamp", "--gradgate-baseline=b.json", "-p", "no:cacheprovider", "-rx")
    # the same seed draws the same cases in the same order: a shorter second search meets only
    # what the first one recorded, however fast the machine is (with one budget for both, a
    # loaded machine's first search stopped before a finding its second one reached)
    first = pytester.runpytest_subprocess("--gradgate-explore=4s", *args, "--gradgate-update-baseline")
    assert first.ret == 0, first.stdout.str()
    assert CLAMP_KEY in Baseline.load(pytester.path / "b.json").explore
    # once clamp's abort is known it is no longer shrunk, and the budget it freed reaches clamp's
    # forward through a producer (forward-wrong-on-layout): record again, as a fork's baseline grows
    pytester.runpytest_subprocess("--gradgate-explore=4s", *args, "--gradgate-update-baseline")
    again = pytester.runpytest_subprocess("--gradgate-explore=1s", *args)
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines([f"XFAIL explore::explore_clamp_ggml-abort_ggml.c-7074*known failure (baseline "
                                f"explore: {CLAMP_KEY})*"])


def test_update_baseline_needs_a_file_to_write():
    proc = _explore(".", "--update-baseline", "--budget", "1s")
    assert proc.returncode == 2 and "--update-baseline: name the file" in proc.stderr, proc.stderr


def test_the_shipped_baseline_records_the_clean_defaults_explore_findings(tmp_path):
    """On the pinned default with its shipped baseline, a short search of ops whose upstream
    failures explore alone reaches (clamp's build assert, rope's odd head_dim, neg's kernel
    assert) exits 0. Seen failing with the baseline as it was shipped before (no `explore`
    section): exit 1 with clamp and rope [NEW]."""
    proc = _explore(tmp_path, "--ops", "clamp", "neg", "rope_ext", "--budget", "4s", "--seed", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[NEW]" not in proc.stdout


@pytest.fixture(scope="module")
def uncaught(ggml_variant):
    return ggml_variant(UNCAUGHT)[0]


@pytest.mark.slow
def test_a_planted_bug_still_fails_the_gate_with_a_shrunk_case(tmp_path, uncaught):
    """With the shipped baseline extended, SCALE's planted wrong sign (the uncaught variant) is
    still new: exit 1, and its case is shrunk to one op."""
    out = tmp_path / "found.yaml"
    proc = _explore(tmp_path, "--ggml-src", str(uncaught), "--ops", "scale", "--budget", "3s", "--seed", "0",
                    "--baseline", str(DEFAULT_BASELINE), "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    wrong = [f for f in json.loads(out.with_suffix(".json").read_text())["findings"]
             if f["known"] is None and f["class"] == "wrong-sign"]
    assert len(wrong) == 1 and wrong[0]["case"]["graph"].count("(") == 1, wrong
    assert "scale wrong-sign contiguous  [NEW]" in proc.stdout


@pytest.mark.slow
def test_a_forks_first_run_says_once_how_to_record_its_baseline(pytester, tmp_path, uncaught):
    """A tree that is not a pinned source (here a patched copy of the default) but says it is ggml
    0.15.3 starts from upstream 0.15.3's shipped baseline (tests/test_fork_baseline.py): its
    upstream failures xfail, and no note is needed; recording its baseline keeps them upstream's.
    Explore (cli/explore.py) starts from upstream's known failures too, and each finding known from
    them is run on upstream as well: clamp's build-time assert, upstream's, stays known (exit 0,
    no note of a first run). Seen failing before explore started from upstream: exit 1, clamp
    [NEW] and the note of a tree with no baseline."""
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={uncaught}", "-k", "add1_vector",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["gradgate: baseline: upstream ggml-0.15.3's known failures (*"])
    assert "is not a pinned source" not in result.stdout.str()
    recorded = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={uncaught}", "-k", "add1_vector",
                                             "--gradgate-update-baseline", "--gradgate-baseline=gradgate-baseline.json",
                                             "-p", "no:cacheprovider")
    assert recorded.ret == 0
    recorded.stdout.fnmatch_lines(["*of them upstream ggml-0.15.3's known failures; 0 the fork's own*"])
    gated = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={uncaught}", "-k", "add1_vector",
                                          "--gradgate-baseline=gradgate-baseline.json", "-p", "no:cacheprovider")
    assert gated.ret == 0 and "is not a pinned source" not in gated.stdout.str()

    proc = _explore(tmp_path, "--ggml-src", str(uncaught), "--ops", "clamp", "--budget", "2s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "baseline: upstream ggml-0.15.3's known failures" in proc.stderr
    assert "finding(s) on upstream ggml-0.15.3 too" in proc.stderr
    assert f"{CLAMP_KEY}  [known: explore: {CLAMP_KEY}]" in proc.stdout and "[NEW]" not in proc.stdout
    assert "is not a pinned source" not in proc.stdout
    # recorded into a baseline of the fork's own: upstream's, since its case fails the same way there
    mine = tmp_path / "explore-baseline.json"
    recorded = _explore(tmp_path, "--ggml-src", str(uncaught), "--ops", "clamp", "--budget", "2s", "--baseline",
                        str(mine), "--update-baseline")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    entry = Baseline.load(mine).explore[CLAMP_KEY]
    assert entry.get("upstream") == "ggml-0.15.3" and "own" not in entry, entry


def _found_on(library, mapping):
    """The Finding a search would make of `mapping`'s case run on `library`."""
    from pytest_gradgate.explore import space
    from pytest_gradgate.isolation.parent import Runner
    (case,) = space.to_cases(mapping)
    runner = Runner(library, isolate="case")
    try:
        result = runner.run(case)
    finally:
        runner.close()
    outcome, key = findings.classify(result, findings.ops_of(mapping))
    assert outcome == findings.FINDING, (outcome, key, result.status, result.diagnosis)
    return findings.Finding(key, mapping, result.to_dict(), 0, 0.0)


@pytest.mark.slow
def test_a_new_bug_under_a_known_key_is_the_forks_own(ggml_variant, default_build):
    """Issue 52: a fork's new max-pool bug (the gradient of a window whose values are all negative
    is lost: tests/ggml_variants.py pool-max-negative) has the key of upstream's recorded max-pool
    finding (finite differences across the max's kink), so a key match marked it known and explore
    exited 0. Now a known finding on a fork is run on the pinned upstream too, and stays known only
    if upstream fails that very case the same way. The case is the shipped baseline's own (upstream
    fails it), so the key matches on both forks: on a fork whose pool code is upstream's (the
    uncaught variant) it stays known; on the buggy fork it is the fork's own, with the element that
    differs. Seen failing with the bug put back (upstream_check.applies returning False: the
    buggy fork's finding stays known)."""
    from pytest_gradgate.explore.upstream_check import confirm
    baseline = Baseline.load(DEFAULT_BASELINE)
    recorded = baseline.explore["pool_2d misread contiguous"]["case"]
    upstream = default_build.library
    same_pool = _found_on(ggml_variant(UNCAUGHT)[1].library, recorded)
    new_bug = _found_on(ggml_variant(REACH)[1].library, recorded)      # the pool-max-negative bug, among others
    assert same_pool.key == new_bug.key == ("pool_2d", "misread", "contiguous")
    findings.mark_known([same_pool, new_bug], baseline)
    assert same_pool.known and new_bug.known          # by key alone, both look like upstream's
    assert confirm([same_pool], ggml_variant(UNCAUGHT)[1].library, upstream, "ggml-0.15.3") == 1
    assert confirm([new_bug], ggml_variant(REACH)[1].library, upstream, "ggml-0.15.3") == 1
    assert same_pool.known and same_pool.not_upstream is None
    assert new_bug.known is None, new_bug.known
    assert new_bug.not_upstream.startswith("upstream ggml-0.15.3 gives other gradients on this case"), new_bug.not_upstream
    assert " here" in new_bug.not_upstream and "there (numeric" in new_bug.not_upstream
    # a finding no entry knows: upstream's when upstream fails its case the same way (known by the
    # run), the fork's own otherwise, with the difference said either way
    unrecorded = [_found_on(ggml_variant(name)[1].library, recorded) for name in (UNCAUGHT, REACH)]
    assert [f.known for f in unrecorded] == [None, None]
    for f, name in zip(unrecorded, (UNCAUGHT, REACH)):
        confirm([f], ggml_variant(name)[1].library, upstream, "ggml-0.15.3")
    upstreams, own = unrecorded
    assert upstreams.known["node"] == "upstream ggml-0.15.3 (its case fails there the same way)"
    assert upstreams.known["upstream"] == "ggml-0.15.3" and upstreams.not_upstream is None
    assert own.known is None and own.not_upstream.startswith("upstream ggml-0.15.3 gives other gradients")


@pytest.mark.slow
def test_a_finding_that_passes_when_run_again_is_not_made_upstreams(tmp_path, ggml_variant, default_build, monkeypatch):
    """A flaky finding whose case passes when upstream_check runs it again on the fork has nothing to
    compare with upstream's run. Before: both runs passed, differs() saw no difference, and the
    finding was called upstream's ("its case fails there the same way"), which no run showed;
    seen under load in tests/test_explore_reproduce.py. The flaky-scale fork with the schedule
    "P" passes every run here."""
    from pytest_gradgate.explore.upstream_check import confirm
    monkeypatch.setenv("GRADGATE_TEST_FLAKY_PATTERN", "P")
    monkeypatch.setenv("GRADGATE_TEST_FLAKY_COUNTER", str(tmp_path / "counter"))
    mapping = {"name": "explore_scale", "params": {"a": [4, 3]}, "graph": "scale(a, s=0.7)", "consumers": ["none"]}
    f = findings.Finding(("scale", "misread", "contiguous"), mapping, {"status": "failed", "message": "x"}, 0, 0.0)
    assert confirm([f], ggml_variant("flaky-scale")[1].library, default_build.library, "ggml-0.15.3") == 1
    assert f.known is None and f.not_upstream is None
