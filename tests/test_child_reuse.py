"""isolate=case's child reuse (isolation/worker.py): a child that reached a verdict takes the
next case, and only its "passed" stands; any other verdict is reached again in a fresh child.

Real children of a real worker on two real ggml builds: the default, and the "deaths" variant
(ggml_variants.py) whose SCALE kernel segfaults on s=13, hangs on s=17, and computes s=23
wrongly in a process that computed s=29 before: a leak from one case into the next.

How these tests were seen to fail with the bug put back:
- the worker trusting every verdict of a reused child (`stands = True` in ForkingRunner._child):
  the s=23 case after the s=29 case is reported failed, failing
  test_a_red_verdict_of_a_reused_child_is_reached_again_in_a_fresh_one and the known-failure test;
- the hint for known failures dropped (Ahead calling runner.run(case) without fresh=):
  the baselined failure's JSON record says rerun, failing
  test_known_failures_start_in_a_fresh_child_and_others_are_rerun_there;
- MAX_CASES_PER_CHILD not checked: test_a_child_serves_at_most_max_cases_then_a_fresh_one_takes_over;
- Runner.run not sending long cases to a fresh child: test_a_long_case_starts_in_a_fresh_child;
- no warning for a case that passed only in a fresh child: the known-failure test again;
- no fresh start after a surprising red (Runner._after_surprise): the test of that name;
- the worker's warm-up not diagnosing a made-up failure (metrics.warm_up_diagnosis):
  a fresh child imports numpy.ma for a real failure's diagnosis, failing
  test_a_fresh_child_diagnoses_a_failure_with_nothing_left_to_import.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.check.outcome import Status
from pytest_gradgate.declare.case import Case
from pytest_gradgate.isolation import worker
from pytest_gradgate.isolation.parent import Runner


def scale(s, name=None):
    return Case(name=name or f"scale_{s}", graph=f"scale(a, s={s})", params={"a": [4, 3]}, consumer="none")


ADD = Case(name="add_ok", graph="add(a, b)", params={"a": [4, 3], "b": [4, 3]}, consumer="none")
MUL = Case(name="mul_ok", graph="mul(a, b)", params={"a": [4, 3], "b": [4, 3]}, consumer="none")
ADD_T = Case(name="add_transposed", graph="add(a, b)", params={"a": [4, 3], "b": [4, 3]}, consumer="transpose")


@pytest.fixture(scope="module")
def deaths_library(ggml_variant):
    return ggml_variant("deaths")[1].library


def gate_args(ggml_root, cases):
    """A pytest --gradgate run of `cases` alone, one case at a time, with a JSON report."""
    return ["--gradgate", "--gradgate-no-builtin", "--gradgate-ggml-src", str(ggml_root), "--gradgate-cases",
            str(cases), "--gradgate-jobs", "1", "--gradgate-json", "report.json", "-p", "no:cacheprovider"]


def run_all(library, cases, isolate="case", **options):
    runner = Runner(library, isolate=isolate, **options)
    try:
        return [runner.run(case) for case in cases]
    finally:
        runner.close()


def test_passing_cases_share_a_child_and_isolate_fresh_gives_each_its_own(default_build):
    cases = [ADD, MUL, scale(2), ADD_T]
    reused = run_all(default_build.library, cases)
    assert [r.status for r in reused] == [Status.PASSED] * 4
    assert [r.earlier_in_child for r in reused] == [0, 1, 2, 3]
    fresh = run_all(default_build.library, cases, isolate="fresh")
    assert [r.earlier_in_child for r in fresh] == [0, 0, 0, 0]
    # the same verdicts, to the bit
    assert [(r.status, r.maa, r.loss_value) for r in reused] == [(r.status, r.maa, r.loss_value) for r in fresh]


def test_a_red_verdict_of_a_reused_child_is_reached_again_in_a_fresh_one(deaths_library):
    # in a fresh child s=23 is right; after s=29 in the same process it is wrong
    leaky = scale(23, "after_the_leak")
    results = run_all(deaths_library, [ADD, scale(29), leaky, MUL])
    by_name = {r.name: r for r in results}
    assert all(r.status == Status.PASSED for r in results), [(r.name, r.status, r.message) for r in results]
    assert by_name["after_the_leak"].rerun and by_name["after_the_leak"].earlier_in_child == 0
    assert not by_name["scale_29"].rerun and by_name["scale_29"].earlier_in_child == 1
    # the leak is real: the same two cases in one process, without isolation, fail the second
    alone = run_all(deaths_library, [scale(29), leaky], isolate="worker")
    assert [r.status for r in alone] == [Status.PASSED, Status.FAILED]


def test_a_crash_and_a_hang_in_a_reused_child_are_a_fresh_childs_verdicts(deaths_library):
    cases = [ADD, scale(13, "segfault"), MUL, scale(17, "hang"), scale(2, "after_hang")]
    results = run_all(deaths_library, cases, timeout=2)
    assert [r.status for r in results] == [Status.PASSED, Status.CRASHED, Status.PASSED, Status.TIMEOUT,
                                           Status.PASSED]
    crash, hang = results[1], results[3]
    assert crash.signal == "SIGSEGV" and "phase compute" in crash.message, crash.message
    assert "timed out after 2 s" in hang.message, hang.message
    # the case after a death starts a child again; the one after it shares that child
    assert results[2].earlier_in_child == 0 and results[4].earlier_in_child == 0


def test_a_case_expected_red_goes_to_a_fresh_child_at_once(deaths_library):
    runner = Runner(deaths_library, isolate="case")
    try:
        runner.run(ADD)
        runner.run(scale(29))
        hinted = runner.run(scale(23, "hinted"), fresh=True)
        after = runner.run(MUL)
    finally:
        runner.close()
    assert hinted.status == Status.PASSED and hinted.earlier_in_child == 0 and not hinted.rerun
    assert after.earlier_in_child == 2      # the child of ADD and s=29 kept serving


def test_a_child_serves_at_most_max_cases_then_a_fresh_one_takes_over(default_build):
    n = worker.MAX_CASES_PER_CHILD
    results = run_all(default_build.library, [scale(2 + i % 3) for i in range(n + 2)])
    assert all(r.status == Status.PASSED for r in results)
    assert [r.earlier_in_child for r in results] == [*range(n), 0, 1]


def test_a_memory_cap_gives_each_case_a_fresh_child(default_build):
    results = run_all(default_build.library, [ADD, MUL, ADD], max_memory=1 << 30)
    assert [r.status for r in results] == [Status.PASSED] * 3
    assert [r.earlier_in_child for r in results] == [0, 0, 0]


KNOWN_AND_NEW_YAML = """\
cases:
  - name: first
    params: {a: [4, 3]}
    graph: scale(a, s=2)
    consumers: [none]
  - name: mark
    params: {a: [4, 3]}
    graph: scale(a, s=29)
    consumers: [none]
  - name: known_leaky
    params: {a: [4, 3]}
    graph: scale(a, s=23)
    consumers: [none]
  - name: mark_again
    params: {a: [4, 3]}
    graph: scale(a, s=29)
    consumers: [none]
  - name: new_leaky
    params: {a: [4, 3]}
    graph: scale(a, s=23)
    consumers: [none]
"""


def test_known_failures_start_in_a_fresh_child_and_others_are_rerun_there(pytester, ggml_variant, monkeypatch):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    root = ggml_variant("deaths")[0]
    cases = pytester.makefile(".yaml", reuse=KNOWN_AND_NEW_YAML)
    args = gate_args(root, cases)
    collected = pytester.runpytest(*args, "--collect-only", "-q").stdout.lines
    known = next(line for line in collected if "::known_leaky" in line)
    # known_leaky is listed as a known failure; it passes (in a fresh child), so the baseline
    # is stale and the run fails, which is not what this test looks at
    baseline = pytester.path / "baseline.json"
    baseline.write_text(json.dumps({"schema": 2, "entries": {known: {"status": "failed", "reason": "by the test"}}}))
    result = pytester.runpytest(*args, "--gradgate-baseline", str(baseline))
    report = {r["name"]: r for r in json.loads((pytester.path / "report.json").read_text())["cases"]}
    assert {name: r["status"] for name, r in report.items()} == dict.fromkeys(
        ["first", "mark", "known_leaky", "mark_again", "new_leaky"], "passed"), result.stdout.str()
    assert report["known_leaky"]["baseline"] == "stale"
    assert not report["known_leaky"]["rerun"] and report["known_leaky"]["earlier_in_child"] == 0
    assert report["new_leaky"]["rerun"] and report["new_leaky"]["earlier_in_child"] == 0
    assert report["mark_again"]["earlier_in_child"] >= 1
    # the case that passed only in a fresh child is pointed out; the one that started there is not
    out = result.stdout.str()
    assert "new_leaky[none-sqr-cpu] did not pass in a child that had run earlier cases" in out, out
    assert "known_leaky[none-sqr-cpu] did not pass" not in out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_children_killed_while_they_wait_are_replaced_and_nothing_is_called_a_rerun(default_build):
    import os
    import signal
    import time
    runner = Runner(default_build.library, isolate="case")
    try:
        first = runner.run(ADD)
        pid = runner.worker.proc.pid
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        assert len(children) == 2       # the child that ran ADD, waiting, and the spare
        for child in children:
            os.kill(child, signal.SIGKILL)   # as the OOM killer would
        time.sleep(0.2)
        after = runner.run(MUL)
        assert runner.worker.proc.pid == pid    # the same worker
    finally:
        runner.close()
    assert first.status == after.status == Status.PASSED
    assert after.earlier_in_child == 0 and not after.rerun


def test_a_long_case_starts_in_a_fresh_child(default_build):
    # 1000 elements in full mode: 4e6 element-evaluations, LONG_WORK (declare/work.py); a
    # red verdict in a reused child would cost it a second run, a fork costs it little
    long_ = Case(name="long", graph="sqr(a)", params={"a": [1000]}, consumer="none")
    results = run_all(default_build.library, [ADD, long_, MUL])
    assert [r.status for r in results] == [Status.PASSED] * 3
    assert [r.earlier_in_child for r in results] == [0, 0, 1]
    assert not results[1].rerun


TWO_PASSING_YAML = """\
cases:
  - name: one
    params: {a: [4, 3]}
    graph: scale(a, s=2)
    consumers: [none]
  - name: two
    params: {a: [4, 3]}
    graph: scale(a, s=3)
    consumers: [none]
"""


@pytest.mark.parametrize("isolate, earlier", [(None, [0, 1]), ("fresh", [0, 0])])
def test_the_isolate_option_chooses_reused_or_fresh_children(pytester, default_ggml, monkeypatch, isolate, earlier):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    cases = pytester.makefile(".yaml", two=TWO_PASSING_YAML)
    args = gate_args(default_ggml, cases)
    result = pytester.runpytest(*args, *(["--gradgate-isolate", isolate] if isolate else []))
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "report.json").read_text())["cases"]
    assert [r["earlier_in_child"] for r in report] == earlier


def test_the_case_after_a_surprising_red_starts_fresh_and_after_an_expected_one_does_not(default_build):
    # ADD1's backward takes the mean where it should take the sum on this ggml (1-D a: the only
    # shape it builds for): a real failure, which leaves its child standing
    add1 = Case(name="add1_vector", graph="add1(a, b)", params={"a": [6], "b": [1]}, consumer="none")
    runner = Runner(default_build.library, isolate="case")
    try:
        first = runner.run(ADD)
        surprise = runner.run(add1)
        after_surprise = runner.run(MUL)
        expected = runner.run(add1, fresh=True)
        after_expected = runner.run(MUL)
    finally:
        runner.close()
    assert first.status == after_surprise.status == after_expected.status == Status.PASSED
    assert surprise.status == expected.status == Status.FAILED
    assert surprise.rerun and surprise.earlier_in_child == 0
    # red verdicts come in runs: after a surprise the next case does not try a reused child first
    assert after_surprise.earlier_in_child == 0 and not after_surprise.rerun
    assert not expected.rerun and expected.earlier_in_child == 0
    assert after_expected.earlier_in_child >= 1     # a known failure changes nothing after it


# What a red verdict's fresh child runs, as it runs it: a copy of the worker after its
# warm-up (fork copies sys.modules), here in a process of its own so nothing of this test's leaks in
_FRESH_CHILD_SCRIPT = """
import json, os, sys
from pytest_gradgate.library import binding
from pytest_gradgate.check.engine import run_case
from pytest_gradgate.declare.case import Case
from pytest_gradgate.isolation.worker import ForkingRunner
lib = binding.load(sys.argv[1])
ForkingRunner(lib, os.dup(1)).warm_up()
before = set(sys.modules)
result = run_case(Case(**json.loads(sys.argv[2])), lib)
print(json.dumps({"status": str(result.status), "kind": str(result.kind),
                  "imported": sorted(set(sys.modules) - before)}))
"""


def test_a_fresh_child_diagnoses_a_failure_with_nothing_left_to_import(default_build):
    # SILU's backward reads the incoming gradient as if contiguous on this ggml (the
    # baseline's silu[transpose]): a real failure of 24 elements, whose diagnosis goes through
    # np.median, which imports numpy.ma (16 ms) in each fresh child unless the worker did
    silu = Case(name="silu_transposed", graph="silu(a)", params={"a": [4, 3, 2]}, consumer="transpose")
    out = subprocess.run([sys.executable, "-c", _FRESH_CHILD_SCRIPT, str(default_build.library),
                          json.dumps(silu.to_dict())], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, GGML_NO_BACKTRACE="1"))
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["status"] == "failed" and child["kind"] != "", child
    assert child["imported"] == [], child
