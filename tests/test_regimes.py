"""The allocation regimes (check/regimes.py, gg_session_alloc_graph / gg_session_alloc_aliased in
the shim): the backward run again in the memory training gives it, ggml's graph allocator with
its in-place reuse and each in-place alias forced.

Every tensor in memory of its own, as the engine lays a case out for its guard zones, hides a
kernel that writes its output before it has read a source the allocator lays that output over:
ggml 0.15.3's SOFT_MAX_BACK is one (llama.cpp #27096), a softmax under a residual trained through
ggml-opt gets its gradient at cosine -0.42 to the true one, and before the regimes the gate said
green. Each test below was seen failing with the regimes off (--gradgate-alloc own, or
SELECTIONS["all"] emptied in check/regimes.py).
"""

import json
from pathlib import Path

import pytest

from pytest_gradgate.declare.case import Case
from pytest_gradgate.isolation.parent import Runner

# the case, as a case file writes it
SOFTMAX_RESIDUAL_YAML = """\
cases:
  - name: softmax_residual
    params: {a: [8, 6]}
    graph: add(a, soft_max(a))
    consumers: [none]
"""


def softmax_residual(**kw):
    return Case(name="softmax_residual", graph=["add(a, soft_max(a))"], params={"a": [8, 6]}, **kw)


def silu_residual(**kw):
    """x + silu(x) of an intermediate x: SILU_BACK's src1 (x) is memory the allocator may take."""
    return Case(name="silu_residual", graph=["x = mul(a, b)", "add(x, silu(x))"], params={"a": [5, 3, 2], "b": [5, 3, 2]},
                init={"a": [0.5, 1.5], "b": [0.5, 1.5]}, loss="wsqr", **kw)


def test_softmax_under_a_residual_is_red_on_every_run_naming_the_alias(default_build):
    """The issue's case on the default ggml: red in ten fresh children, each naming SOFT_MAX_BACK and
    its output laid over the softmax output (its src1), with memory of its own green."""
    runner = Runner(default_build.library, isolate="fresh")
    try:
        results = [runner.run(softmax_residual()) for _ in range(10)]
        own = runner.run(softmax_residual(alloc="own"))
    finally:
        runner.close()
    for r in results:
        assert (r.status, str(r.kind), str(r.phase), r.culprit) == ("failed", "alias", "allocation", "SOFT_MAX_BACK"), \
            r.diagnosis
        assert r.diagnosis.startswith("alias: SOFT_MAX_BACK (node ")
        assert "wrote its output over its src1, the SOFT_MAX node's output" in r.diagnosis
        assert "In the graph regime (ggml's graph allocator" in r.diagnosis
        assert "in memory of its own the gradients passed the finite differences" in r.diagnosis
        graph = next(run for run in r.alloc if run["regime"] == "graph")
        assert not graph["agrees"]
        assert {"op": "SOFT_MAX_BACK", "src": 1} in [{k: a[k] for k in ("op", "src")} for a in graph["aliases"]]
    # the same case in memory of its own alone is the green the gate gave before the regimes
    assert (own.status, own.alloc) == ("passed", [])


def test_a_plain_softmax_meets_the_alias_through_the_forced_regime(default_build):
    """Without a residual the allocator lays SOFT_MAX_BACK's output over dy (its src0, harmless);
    the forced regime lays it over the softmax output too, as a training graph around it may."""
    runner = Runner(default_build.library, isolate="case")
    try:
        forced = runner.run(Case(name="softmax", graph=["soft_max(a)"], params={"a": [8, 6]}, alloc="forced"))
        graph_only = runner.run(Case(name="softmax", graph=["soft_max(a)"], params={"a": [8, 6]}, alloc="graph"))
    finally:
        runner.close()
    assert (forced.status, str(forced.kind), forced.culprit) == ("failed", "alias", "SOFT_MAX_BACK"), forced.diagnosis
    assert "In the forced-src1 regime" in forced.diagnosis
    assert graph_only.status == "passed", graph_only.diagnosis
    assert [run["regime"] for run in graph_only.alloc] == ["graph"]


@pytest.mark.slow
def test_a_kernel_right_in_its_own_memory_and_wrong_over_its_input_is_red_only_in_the_regimes(run_on):
    """The silu-back-overwrites variant's SILU_BACK copies dy into dx before it reads x: right in
    memory of its own, wrong once dx lies over x (its src1). Red with the regimes, naming the node
    and the source; green with --gradgate-alloc own; green on the default ggml."""
    r = run_on("silu-back-overwrites", silu_residual())
    assert (r.status, str(r.kind), r.culprit) == ("failed", "alias", "SILU_BACK"), r.diagnosis
    assert "SILU_BACK (node " in r.diagnosis and "wrote its output over its src1, the MUL node's output" in r.diagnosis
    own = run_on("silu-back-overwrites", silu_residual(alloc="own"))
    assert own.status == "passed", own.diagnosis


def test_clean_ggml_passes_every_regime_of_the_residual_cases(default_build):
    """Legal aliases only: on the default ggml the residual around silu, rms_norm, rope and scale
    is green in every regime (a forced alias over a source still read later would make it red),
    and each regime that ran laid at least one alias."""
    cases = [silu_residual(),
             Case(name="rms_norm_residual", graph=["x = mul(a, b)", "add(x, rms_norm(x, eps=1.0e-6))"],
                  params={"a": [5, 3, 2], "b": [5, 3, 2]}, init={"a": [0.5, 1.5], "b": [0.5, 1.5]}, loss="wsqr"),
             Case(name="rope_residual", graph=["x = mul(a, b)", "add(x, rope_ext(x, pos, n_dims=4))"],
                  params={"a": [4, 2, 3], "b": [4, 2, 3]}, inputs={"pos": {"type": "i32", "values": [3, 0, 7]}},
                  loss="wsqr"),
             Case(name="scale_residual", graph=["x = mul(a, b)", "add(x, scale(x, s=1.7))"],
                  params={"a": [5, 3, 2], "b": [5, 3, 2]}, loss="wsqr")]
    runner = Runner(default_build.library, isolate="case")
    try:
        results = [runner.run(c) for c in cases]
    finally:
        runner.close()
    for case, r in zip(cases, results):
        assert r.status == "passed", (case.name, r.diagnosis)
        assert r.alloc and all(run["agrees"] for run in r.alloc), (case.name, r.alloc)
        assert all(run["aliases"] for run in r.alloc if run["regime"].startswith(("graph", "forced"))), r.alloc
        assert "graph" in [run["regime"] for run in r.alloc]


@pytest.mark.slow
def test_a_backward_that_scales_its_incoming_gradient_in_place_is_red_under_a_shared_gradient(run_on):
    """The scale-back-inplace variant's SCALE backward scales dy in place: right where nothing else
    reads dy (the suite's scale case, which stayed green), wrong in x + scale(x), whose residual
    reads the same dy (the built-in residual_scale and shared_gradient cases)."""
    shared = Case(name="residual_scale", graph=["x = mul(a, b)", "add(x, scale(x, s=1.7))"],
                  params={"a": [5, 3, 2], "b": [5, 3, 2]}, init={"a": [0.5, 1.5], "b": [0.5, 1.5]}, loss="wsqr")
    alone = Case(name="scale", graph=["scale(a, s=0.7)"], params={"a": [4, 3, 2]})
    r = run_on("scale-back-inplace", shared)
    assert (r.status, str(r.kind)) == ("failed", "wrong-scale"), r.diagnosis
    assert run_on("scale-back-inplace", alone).status == "passed"


@pytest.mark.slow
def test_a_tree_that_fixes_softmax_back_turns_the_known_items_to_passes_now(pytester, ggml_variant):
    """The softmax-back-fixed variant reads y and dy before it writes dx (as ggml 0.26.0 does): the
    issue's case is green there, and the shipped 0.15.3 baseline's alias entry for the built-in
    soft_max item is reported as passing now."""
    import pytest_gradgate.gate
    shipped = Path(pytest_gradgate.gate.__file__).parent / "baseline_default.json"
    root, _ = ggml_variant("softmax-back-fixed")
    pytester.makefile(".yaml", gradgate_residual=SOFTMAX_RESIDUAL_YAML)
    pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", f"--gradgate-ggml-src={root}",
                                  "gradgate_residual.yaml", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", f"--gradgate-baseline={shipped}",
                                           "-k", "soft_max and none and wsqr and not ext", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*cases.yaml::soft_max[[]none-wsqr-cpu[]]: passes now, but the baseline*"])


def test_the_option_env_and_report(pytester, default_build, monkeypatch):
    """--gradgate-alloc selects the regimes (own: none), GRADGATE_ALLOC does as the option does, a
    bad value names the option, and the JSON report carries each case's regimes."""
    pytester.makefile(".yaml", gradgate_residual=SOFTMAX_RESIDUAL_YAML)
    red = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_residual.yaml", "--gradgate-json=report.json",
                                        "-p", "no:cacheprovider")
    red.assert_outcomes(failed=1)
    red.stdout.fnmatch_lines(["gradgate: alloc=all: *", "*failed in phase allocation: alias: SOFT_MAX_BACK*"])
    record = json.loads((pytester.path / "report.json").read_text())["cases"][0]
    assert record["alloc"][0]["regime"] == "graph" and not record["alloc"][0]["agrees"]
    green = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_residual.yaml", "--gradgate-alloc", "own",
                                          "-p", "no:cacheprovider")
    green.assert_outcomes(passed=1)
    green.stdout.fnmatch_lines(["gradgate: alloc=own: *training's in-place aliases are not checked*"])
    bad = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_residual.yaml", "--gradgate-alloc", "nowhere",
                                        "-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--gradgate-alloc: 'nowhere' is not one of all, graph, forced, ggml-opt, own*"])
    monkeypatch.setenv("GRADGATE_ALLOC", "own")
    pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_residual.yaml", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def softmax_residual_trained(**kw):
    """The issue's ggml-opt probe: param w, a = x * w, output a + softmax(a)."""
    return Case(name="softmax_residual_w", graph=["a = mul(x, w)", "add(a, soft_max(a))"], params={"w": [8, 6]},
                inputs={"x": {"type": "f32", "shape": [8, 6]}}, **kw)


def test_ggml_opt_trains_the_softmax_residual_wrong_and_says_so(default_build):
    """Through ggml-opt itself (its scheduler, its gradient graph with accumulators) the issue's
    probe gets the wrong gradient on the default ggml, red in phase ggml-opt; the graph regime
    (ggml-opt's layout without accumulation) gives the same wrong values and names the alias."""
    runner = Runner(default_build.library, isolate="case")
    try:
        opt = runner.run(softmax_residual_trained(alloc="ggml-opt"))
        graph = runner.run(softmax_residual_trained(alloc="graph"))
    finally:
        runner.close()
    assert (opt.status, str(opt.phase)) == ("failed", "ggml-opt"), opt.diagnosis
    assert opt.diagnosis.startswith("wrong as ggml-opt trains it: the gradient ggml-opt accumulates for one micro-batch")
    assert [run["regime"] for run in opt.alloc] == ["ggml-opt", "ggml-opt-accumulated"]
    assert (graph.status, str(graph.kind), graph.culprit) == ("failed", "alias", "SOFT_MAX_BACK"), graph.diagnosis
    # the same wrong number in both: e.g. "at [5, 0, 0, 0]: -1.34116 against 1.2692"
    assert opt.diagnosis.split("e.g. at ")[1].split(" (cosine")[0] == graph.diagnosis.split("e.g. at ")[1].split(" (cosine")[0]


def test_mean_aborts_under_gradient_accumulation_in_phase_ggml_opt(default_build):
    """MEAN's backward adds its gradient into an accumulator with ggml_add1, which asserts a scalar:
    ggml-opt with two micro-batches per step aborts there. In memory of its own (no accumulator)
    the same case passes; with the ggml-opt regime removed this test fails on the first assert."""
    runner = Runner(default_build.library, isolate="case")
    try:
        opt = runner.run(Case(name="mean", graph=["mean(a)"], params={"a": [4, 3, 2]}, alloc="ggml-opt"))
        own = runner.run(Case(name="mean", graph=["mean(a)"], params={"a": [4, 3, 2]}, alloc="own"))
    finally:
        runner.close()
    assert (opt.status, str(opt.phase)) == ("crashed", "ggml-opt"), opt.diagnosis
    assert "GGML_ASSERT(ggml_is_scalar(b)) failed" in opt.diagnosis + opt.stderr_tail
    assert own.status == "passed"


@pytest.mark.slow
def test_ggml_opt_agrees_on_a_tree_with_softmax_back_fixed(run_on):
    """The same probe on the softmax-back-fixed variant: ggml-opt's gradient and its accumulation
    over two micro-batches agree with memory of its own (which passed the finite differences)."""
    r = run_on("softmax-back-fixed", softmax_residual_trained())
    assert r.status == "passed", r.diagnosis
    agrees = {run["regime"]: run["agrees"] for run in r.alloc}
    assert agrees["ggml-opt"] and agrees["ggml-opt-accumulated"] and all(agrees.values()), agrees


def test_accumulation_with_other_values_in_the_second_micro_batch_catches_a_stale_kernel(run_on):
    """repeat-back-memo (in the reach tree): REPEAT_BACK gives a node's last result again when asked
    for the same node. ggml-opt's first micro-batch is right, and the second, with other values as
    training's next batch has, adds the first's gradient again: red in phase ggml-opt, against the
    sum of the two single-batch gradients. Every other regime is green (each evaluates a node
    with the values it last had), and so is memory of its own. With the second micro-batch given
    the same values again (second_values returning its input) this case was green: seen failing."""
    from ggml_variants import REACH
    case = dict(name="repeat", graph=["repeat(a, shape=[4, 3, 2])"], params={"a": [2, 3, 1]})
    r = run_on(REACH, Case(**case))
    assert (r.status, str(r.phase)) == ("failed", "ggml-opt"), r.diagnosis
    assert r.diagnosis.startswith(
        "gradient accumulation lost or doubled: a's gradient accumulated over two micro-batches (the case's values, "
        "then each leaf's reversed) differs from the sum of the two single-batch gradients"), r.diagnosis
    agrees = {run["regime"]: run["agrees"] for run in r.alloc}
    assert agrees.pop("ggml-opt-accumulated") is False and agrees["ggml-opt"] and all(agrees.values()), r.alloc
    assert run_on(REACH, Case(alloc="own", **case)).status == "passed"


def test_second_values_stay_in_the_leafs_domain():
    """The second micro-batch's values: each leaf's elements reversed, in its shape and dtype, so
    positive values stay positive and row ids stay valid ids."""
    import numpy as np
    from pytest_gradgate.check.regimes import second_values
    ids = np.array([[0, 2, 1], [1, 1, 0]], dtype=np.int32)
    assert second_values(ids).tolist() == [[0, 1, 1], [1, 2, 0]] and second_values(ids).dtype == np.int32
    assert second_values(np.float32([3.0])).tolist() == [3.0]
