"""Lanes (check/lanes.py): a big case's finite differences over copies of its forward graph,
each on a thread of its own, on real ggml builds."""

import pytest

from pytest_gradgate.check.engine import run_case
from pytest_gradgate.check.lanes import LANES_ENV
from pytest_gradgate.declare.case import Case
from pytest_gradgate.errors import GradgateError
from pytest_gradgate.isolation.parent import Runner

# test-backend-ops' silu case: 5,005 elements at eps 15, about 0.3-0.6 s of evaluations on one core
BIG = dict(graph="silu(a)", params={"a": [5, 7, 11, 13]}, init={"a": [-150.0, 150.0]}, loss="sum", eps=15.0,
           stencil=2)


def verdict(r):
    """Everything a result says that the estimates decide, to the bit."""
    return (str(r.status), str(r.kind), r.diagnosis, r.maa, r.cosine, r.limit, r.n_compared,
            [(p["name"], p["maa"], p["limit"], p["cosine"], p.get("numeric_values"), p.get("halved_step_elements"))
             for p in r.params])


@pytest.mark.parametrize("spec", [
    dict(graph="silu(a)", params={"a": [9, 7, 5]}, consumer="transpose"),        # fails: the stride bug
    dict(graph="mul(a, b)", params={"a": [33, 7], "b": [33, 7]}, stencil=4),     # two params, passes
    BIG,                                                                         # fails, halved step taken
], ids=["silu-transposed", "mul-two-params", "silu-tbo"])
def test_lanes_give_the_estimates_of_one_lane_to_the_bit(lib, monkeypatch, spec):
    """Whatever lane takes an element, its estimate is what the caller's graph alone gives: the
    same verdict, MAA, limit, cosine and numeric values with 1, 2 and 3 lanes. A lane writing its
    estimates at other positions, or a copy built with other values, fails this."""
    case = Case(name="t", **spec)
    results = {}
    for n in (1, 2, 3):
        monkeypatch.setenv(LANES_ENV, str(n))
        results[n] = run_case(case, lib)
        assert results[n].lanes == n
    assert verdict(results[2]) == verdict(results[1])
    assert verdict(results[3]) == verdict(results[1])
    assert results[2].timings["numeric-lane-cpu-seconds"] > 0 and "numeric-lane-cpu-seconds" not in results[1].timings


@pytest.mark.parametrize("cores, estimate_s, running, lanes", [
    (2, 0.5, [1, 1, 1], 2),          # a big case, the other core idle
    (2, 0.5, [2, 3, 2], 1),          # ... the other core busy (the gate's other job, pytest-xdist)
    (2, 0.5, [1, 2, 1], 2),          # the median of the looks
    (8, 0.5, [3, 3, 3], 2),          # at most MAX_LANES
    (2, 0.01, [1, 1, 1], 1),         # a small case: never
    (2, 0.5, [None, 1, 1], 2),       # /proc/loadavg unreadable: one per other core
])
def test_lanes_go_to_big_cases_on_idle_cores(cores, estimate_s, running, lanes):
    from pytest_gradgate.check.lanes import lanes_for
    assert lanes_for(cores, estimate_s, running) == lanes


def test_a_small_case_gets_no_lanes(lib, monkeypatch):
    """Unforced, a 12-element case (its numeric phase well under LANES_MIN_SECONDS) gets none,
    whatever the machine is doing; the big one at most MAX_LANES."""
    monkeypatch.delenv(LANES_ENV, raising=False)
    assert run_case(Case(name="small", graph="silu(a)", params={"a": [4, 3]}), lib).lanes == 1
    assert 1 <= run_case(Case(name="big", **BIG), lib).lanes <= 2


def test_lanes_run_in_a_forked_child_too(default_build, monkeypatch):
    """Through the isolating Runner (threads started in a child forked from the warm worker):
    the same verdict as one lane."""
    results = {}
    for n in (1, 2):
        monkeypatch.setenv(LANES_ENV, str(n))     # the worker starts with it
        runner = Runner(default_build.library, isolate="case")
        try:
            results[n] = runner.run(Case(name="t", graph="silu(a)", params={"a": [9, 7, 5]}, consumer="transpose"))
        finally:
            runner.close()
    assert results[2].lanes == 2 and results[1].lanes == 1
    assert verdict(results[2]) == verdict(results[1]) and results[1].status == "failed"


@pytest.mark.parametrize("value", ["two", "0", "9"])
def test_a_bad_number_of_lanes_names_the_variable(lib, monkeypatch, value):
    monkeypatch.setenv(LANES_ENV, value)
    with pytest.raises(GradgateError, match=f"{LANES_ENV}='{value}': give a whole number of lanes from 1 to 8"):
        run_case(Case(name="t", graph="sqr(a)", params={"a": [4]}), lib)
