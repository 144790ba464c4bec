"""A known failure is matched by what it is, not only by its id (gate/baseline.py, kind_of and
changed_kind): a baseline must never hide a new bug behind a known id.

Issue 52 saw it on a fork: upstream SCALE aborts on a non-contiguous gradient (a shipped baseline
entry, crashed), the fork "fixed" the abort by reading the gradient as if it were contiguous, and
`scale[transpose-sqr-cpu]` went wrong at cosine 0.19 while the run stayed green (XFAIL, with
"this run: failed: ..." appended to the reason). Before kinds were recorded the test below saw
that green run (rc 0, three xfails); with changed_kind returning None it sees it again.
"""

from pathlib import Path

import pytest

import pytest_gradgate.gate
from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.gate import baseline

SHIPPED = Path(pytest_gradgate.gate.__file__).parent / "baseline_default.json"


def result(status, kind, diagnosis):
    r = Result("c[none-sqr-cpu]", "c", "none", "sqr", "cpu")
    r.status, r.kind, r.diagnosis, r.phase = status, kind, diagnosis, Phase.COMPUTE
    return r


def test_a_kind_is_status_family_and_the_assert_without_its_line():
    abort = result(Status.CRASHED, Diagnosis.GGML_ABORT,
                   "ggml aborted in phase build-backward: ggml.c:3352: GGML_ASSERT(ggml_is_padded_1d(a)) failed")
    assert baseline.kind_of(abort) == "crashed ggml-abort GGML_ASSERT(ggml_is_padded_1d(a)) failed"
    # one misreading backward shows as any of these, by the draw: one kind
    for kind in (Diagnosis.DISAGREE, Diagnosis.WRONG_POSITIONS, Diagnosis.CONCENTRATED):
        assert baseline.kind_of(result(Status.FAILED, kind, "")) == "failed misread"
    assert baseline.kind_of(result(Status.FAILED, Diagnosis.WRONG_SCALE, "")) == "failed wrong-scale"


def test_moved_lines_are_not_news_and_another_assert_is():
    recorded = {"status": "crashed", "kind": "crashed ggml-abort GGML_ASSERT(ggml_is_padded_1d(a)) failed",
                "reason": "ggml aborted in phase build-backward: ggml.c:3352: GGML_ASSERT(ggml_is_padded_1d(a)) failed"}
    moved = result(Status.CRASHED, Diagnosis.GGML_ABORT,
                   "ggml aborted in phase build-backward: ggml.c:3390: GGML_ASSERT(ggml_is_padded_1d(a)) failed")
    assert baseline.changed_kind("k", recorded, moved, "b.json") is None
    assert "this run" not in baseline.xfail_reason(recorded, moved)
    other = result(Status.CRASHED, Diagnosis.GGML_ABORT,
                   "ggml aborted in phase compute: ops.cpp:4495: GGML_ASSERT(ggml_is_contiguous(src0)) failed")
    assert "now fails another way" in baseline.changed_kind("k", recorded, other, "b.json")
    # an entry recorded before kinds were is matched by its status
    old = {"status": "crashed", "reason": recorded["reason"]}
    assert baseline.changed_kind("k", old, other, "b.json") is None
    wrong = result(Status.FAILED, Diagnosis.WRONG_POSITIONS, "a: right values at wrong positions")
    assert "records crashed (" in baseline.changed_kind("k", old, wrong, "b.json")


def test_measured_figures_are_not_news_and_other_words_are():
    """SILU's transposed misread reads memory it does not own: each run measures another cosine and
    norm ratio, and every run's xfail said "this run: ..." for the same failure."""
    recorded = {"status": "failed", "kind": "failed disagree",
                "reason": "a: values disagree (cosine 0.410, norm ratio 0.773); the gradient reaches the op"}
    again = result(Status.FAILED, Diagnosis.DISAGREE,
                   "a: values disagree (cosine 0.369, norm ratio 3.24e+37); the gradient reaches the op")
    assert "this run" not in baseline.xfail_reason(recorded, again)
    worded = result(Status.FAILED, Diagnosis.DISAGREE, "a: values disagree (cosine 0.369); b reaches the op")
    assert "this run: failed: a: values disagree (cosine 0.369); b reaches" in baseline.xfail_reason(recorded, worded)


def test_every_shipped_entry_records_its_kind():
    import json
    for name in ("baseline_default.json", "baseline_ggml-0.26.0.json"):
        entries = json.loads((SHIPPED.parent / name).read_text())["entries"]
        assert all(e.get("kind", "").startswith(e["status"] + " ") for e in entries.values()), name


@pytest.mark.slow
def test_a_known_abort_fixed_into_a_wrong_gradient_is_red(pytester, ggml_variant):
    """The fork's SCALE reads a laid-out gradient as contiguous: the three shipped crashed entries of
    scale behind a non-contiguous consumer now fail with wrong values, and the run is red, each item
    saying what was recorded and what this run found."""
    root, _ = ggml_variant("scale-reads-contiguous")
    run = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", f"--gradgate-baseline={SHIPPED}",
                                        "-k", "scale and not residual and not shared and not sum", "-p", "no:cacheprovider")
    assert run.ret == pytest.ExitCode.TESTS_FAILED, run.stdout.str()[-3000:]
    out = run.stdout.str()
    for consumer in ("transpose", "permute_0213_transpose", "permute_1203"):
        assert (f"scale[{consumer}-sqr-cpu]: a known failure that now fails another way: the baseline "
                f"{SHIPPED} records crashed ggml-abort GGML_ASSERT(ggml_is_padded_1d(a)) failed") in out, out[-3000:]
    assert "this run failed misread" in out
