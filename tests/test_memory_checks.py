"""The memory checks: guard zones beside every tensor, data that starts as a NaN pattern no
kernel computes, and the backward computed on two thread counts (check/memory.py,
check/determinism.py, gg_session_alloc in the shim).

Each guards a class of bug whose verdict used to depend on the run: a kernel writing past its
tensor corrupts whatever the allocator put next, an element never written holds whatever the
memory held, and a race gives whichever thread stored last.
"""

import numpy as np
import pytest

from pytest_gradgate.check import determinism
from pytest_gradgate.declare.case import Case
from pytest_gradgate.isolation.parent import Runner

ROPE_ODD_HEAD = dict(name="rope_odd_head", graph=["rope_ext(a, pos, n_dims=4)"], params={"a": [7, 2, 3]},
                     inputs={"pos": {"type": "i32", "values": [3, 0, 7]}}, threads=3)


def silu_case(**kw):
    return Case(name="silu_rows", graph=["silu(a)"], params={"a": [4, 3, 2]}, **kw)


def test_rope_with_an_odd_head_dim_fails_every_run_naming_the_write(default_build):
    """ggml 0.15.3's CPU rope copies the unrotated tail of each row in pairs, so with head_dim 7
    it writes one element past every row: the last row's lands in the guard zone after the
    output. Issue 44 measured the verdict of this case without the zones over four runs:
    failed, passed, failed, passed; put back (GG_GUARD_BYTES 0 in the shim, the zones empty),
    this test fails on the first run whose verdict is not a named write. Ten fresh children."""
    runner = Runner(default_build.library, isolate="fresh")
    try:
        results = [runner.run(Case(**ROPE_ODD_HEAD)) for _ in range(10)]
    finally:
        runner.close()
    for r in results:
        assert (r.status, str(r.kind), str(r.phase)) == ("failed", "out-of-bounds-write", "compute"), r.diagnosis
        assert r.diagnosis.startswith("the ROPE kernel (node 1 of the graph) wrote past the end of its output")
        assert "4 guard bytes changed, bytes 0 to 3 after its end" in r.diagnosis
        assert "reproduced the write at this node" in r.diagnosis


def test_the_builtin_rope_odd_head_item_is_a_known_failure_with_its_reason(pytester):
    """The built-in item and its baseline entry: xfail with the recorded write, the same on every
    run (a flip would show as 'this run: ...' in the reason, or as a pass)."""
    result = pytester.runpytest_subprocess("--gradgate", "-k", "rope_odd_head", "-p", "no:cacheprovider", "-rx")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL *rope_odd_head[[]none-sqr-cpu[]] - known failure (baseline): failed: "
                                 "the ROPE kernel (node 1 of the graph) wrote past the end of its output*"])
    assert "this run:" not in result.stdout.str()


@pytest.mark.slow
def test_an_element_a_kernel_never_writes_is_named(run_on):
    """The unwritten variant's SILU_BACK kernel skips the last element of its last row. Before the
    data started as a NaN pattern the element held whatever the buffer held (zeros from a fresh
    page: a wrong gradient with no cause named, or a pass where the true value is near zero); with
    the fill removed from gg_session_alloc this test fails."""
    r = run_on("unwritten", silu_case())
    assert (r.status, str(r.kind)) == ("failed", "unwritten-elements"), r.diagnosis
    assert r.diagnosis.startswith("unwritten elements: the SILU_BACK kernel left 1 of 24 elements of its output")
    assert "the first at [3, 2, 1, 0]" in r.diagnosis


@pytest.mark.slow
def test_a_race_is_nondeterministic_on_every_run_with_both_values(run_on):
    """The race variant's SILU_BACK threads each store their partial sum into one shared element.
    The backward on 3 threads against 1 thread differs on every run, whichever thread stores last;
    with the second run taken out of the engine (_determinism returning None) the verdict is the
    finite differences' alone: a failure called a concentrated error, not a race."""
    for _ in range(5):
        r = run_on("race", silu_case())
        assert (r.status, str(r.kind)) == ("failed", "nondeterministic"), r.diagnosis
        assert "the backward gives different gradients on 3 threads and on 1 thread at 1 of 24 elements" in r.diagnosis
        assert "e.g. at [3, 2, 1, 0]:" in r.diagnosis and " on 3 threads, " in r.diagnosis
    # on one thread there is no race: the shared element is deterministic, and wrong
    r = run_on("race", silu_case(threads=1))
    assert r.status == "failed" and str(r.kind) != "nondeterministic", r.diagnosis


@pytest.mark.slow
def test_rows_lost_at_thread_boundaries_are_named_as_unwritten(run_on):
    """The thread-boundary variant's SILU_BACK threads each stop one row short of their range:
    those rows are never written. Before the data started as a NaN pattern they held whatever
    the buffer held, and the case failed as a disagreement of values; now the lost rows are
    named (8 of 24 elements: rows 1 and 3 of the 6, 4 elements each, on 3 threads)."""
    r = run_on("thread-boundary", silu_case())
    assert (r.status, str(r.kind)) == ("failed", "unwritten-elements"), r.diagnosis
    assert "the SILU_BACK kernel left 8 of 24 elements of its output" in r.diagnosis
    assert "the first at [0, 1, 0, 0]" in r.diagnosis


def test_gradients_that_differ_by_roundoff_agree_and_nan_equals_nan():
    """The comparison of the two runs: a few ulps is roundoff, NaN at the same place on both
    sides is the same, and NaN on one side only is a difference (so is 1e-4 of the scale)."""
    a = np.array([1.0, -2.0, 0.5, np.nan])
    assert determinism.differences({"a": a}, {"a": a * (1 + 4e-7)}) == {}
    assert determinism.differences({"a": a}, {"a": a.copy()}) == {}
    b = a.copy()
    b[2] = np.nan
    assert determinism.differences({"a": a}, {"a": b})["a"][:2] == (1, 2)
    c = a.copy()
    c[1] += 2e-4
    assert determinism.differences({"a": a}, {"a": c})["a"][:2] == (1, 1)
