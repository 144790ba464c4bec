"""The engine on real ggml builds: MAA, NaN handling, gradients that are views, stencils,
diagnosis kinds, phases and power. Array-level checks of the same rules: test_metrics.py."""

import contextlib
import re

import numpy as np
import pytest

from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.declare.case import Case
from pytest_gradgate.check.engine import run_case
from pytest_gradgate.check.ggml_graph import GraphBuilder, read_tensor, write_tensor
from pytest_gradgate.isolation.parent import Runner
from ggml_variants import replace_once
from pytest_gradgate.library.source import copy_tree

from test_metrics import mean_abs_asymm


def case(graph, params, **kw):
    return Case(name="t", graph=graph, params=params, **kw)


# ---------------------------------------------------------------- MAA and what never passes

def test_maa_of_a_real_failure_is_test_backend_ops_mean_abs_asymm(lib):
    """SILU's CPU backward reads a transposed incoming gradient as if it were contiguous (it only
    assert()s, and Release builds drop that): a real failure on the default ggml. The MAA we report
    is test-backend-ops' mean_abs_asymm of the values we report."""
    r = run_case(case("silu(a)", {"a": [4, 3, 2]}, consumer="transpose"), lib)
    assert r.status == "failed" and r.maa > 0.1
    p = r.params[0]
    assert p["excluded"] == {} and p["n_compared"] == 24
    assert r.maa == pytest.approx(mean_abs_asymm(p["numeric_values"], p["analytic_values"]), rel=1e-5)
    assert "consumer 'transpose'" in r.diagnosis       # says where to look
    # the failure text says the diagnosis once (it was also repeated at the end of the message line)
    from pytest_gradgate.report.text import format_result
    assert format_result(r).count(r.diagnosis.split(": ", 1)[1]) == 1
    assert run_case(case("silu(a)", {"a": [4, 3, 2]}), lib).status == "passed"


@pytest.mark.parametrize("graph", ["sqrt(a)", "log(a)"])
def test_nan_gradients_fail_with_a_reason(lib, graph):
    """Inputs out of the op's domain make the loss and both gradients NaN; test-backend-ops'
    `NaN > limit` comparison would pass that. We fail it and say why."""
    r = run_case(case(graph, {"a": [4, 3]}, init={"a": [-1.0, -0.5]}), lib)
    assert r.status == "failed" and r.kind == "nonfinite-loss" and r.n_compared == 0
    assert "not finite" in r.diagnosis and "init range" in r.diagnosis
    assert r.maa is None        # nothing was compared: no MAA is claimed


def test_both_zero_elements_are_left_out_and_counted(lib):
    """relu of negative inputs: both gradients are exactly 0 there. Counted, not averaged as 0/0."""
    r = run_case(case("relu(a)", {"a": [4, 3]}, init={"a": {"abs": [0.2, 1.0]}}), lib)
    assert r.status == "passed"
    p = r.params[0]
    n_zero = p["excluded"]["both zero within numeric noise"]
    assert 0 < n_zero < 12 and p["n_compared"] == 12 - n_zero


# ---------------------------------------------------------------- gradients that are views

def test_a_gradient_that_is_a_view_is_read_through_its_strides(lib):
    """The gradient of a param consumed through transpose is ggml's TRANSPOSE view of the incoming
    gradient (nb0 = a whole row). Read through its strides it is 2a; read as flat memory it is a
    permutation of 2a, which is what a harness that ignored strides would compare."""
    c = case("transpose(a)", {"a": [4, 3]})
    assert run_case(c, lib).status == "passed"

    g = GraphBuilder(lib, c, 64)
    session = None
    try:
        a = g.new_tensor([4, 3], name="a")
        lib.ggml_set_param(a)
        loss = lib.ggml_sum(g.ctx, lib.ggml_sqr(g.ctx, lib.ggml_cont(g.ctx, lib.ggml_transpose(g.ctx, a))))
        gf = g.forward_graph(loss)
        gb = g.backward_graph(gf)
        grad = lib.ggml_graph_get_grad(gb, a)
        ne, nb = g.layout(grad)
        assert g.ffi.string(lib.gg_tensor_op_name(grad)) == b"TRANSPOSE"
        assert ne[:2] == [4, 3] and nb[:2] == [12, 4]            # a view, not contiguous
        session = lib.gg_session_new(b"cpu", 1, g.ffi.new("char[256]"), 256)
        assert lib.gg_session_alloc(session, g.ctx)
        x = np.arange(1, 13, dtype=np.float32)
        write_tensor(g, a, x)
        lib.ggml_graph_reset(gb)
        assert lib.gg_session_compute(session, gb) == 0
        assert np.allclose(read_tensor(g, grad), 2 * x)
        flat = np.empty(lib.gg_tensor_nbytes(grad), dtype=np.uint8)
        lib.gg_tensor_read(grad, g.ffi.from_buffer(flat), 0, flat.size)
        assert not np.allclose(flat.view(np.float32), 2 * x)
    finally:
        if session is not None:
            lib.gg_session_free(session)
        g.free()


# ---------------------------------------------------------------- stencils

def test_two_point_stencil_is_exact_on_a_quadratic_loss(lib):
    for stencil in (2, 4):
        r = run_case(case("scale(a, 2.5)", {"a": [4, 3, 2]}, stencil=stencil), lib)
        assert r.status == "passed" and r.maa < 1e-4


def test_two_point_stencil_truncation_is_numeric_unreliable_and_a_smaller_eps_cures_it(lib):
    """sum(exp(a)^2) with h = 0.1: the 2-point estimate is off by h^2 f'(3)/(6 f') = 0.67% on every
    element. Halving the step moves it by 3/4 of that, far beyond roundoff: the numeric side is not
    evidence at this step, and the correct backward is not blamed (it was, before the reliability
    check: "a: wrong scale: analytic = 0.993"). The 4-point stencil removes the h^2 term; h = 0.01
    shrinks it below the limit."""
    two = run_case(case("exp(a)", {"a": [4, 3, 2]}, stencil=2, eps=0.1), lib)
    assert two.status == "numeric-unreliable" and two.kind == "numeric-unreliable"
    assert "use a smaller eps" in two.diagnosis
    assert run_case(case("exp(a)", {"a": [4, 3, 2]}, stencil=4, eps=0.1), lib).status == "passed"
    assert run_case(case("exp(a)", {"a": [4, 3, 2]}, stencil=2, eps=0.01), lib).status == "passed"


# ---------------------------------------------------------------- power

def test_power_sqr_loss_has_it_sum_loss_on_a_linear_op_is_blind(lib):
    sqr = run_case(case("scale(a, 2.5)", {"a": [4, 3, 2]}, loss="sqr"), lib)
    assert sqr.status == "passed" and sqr.power is True
    blind = run_case(case("scale(a, 2.5)", {"a": [4, 3, 2]}, loss="sum"), lib)
    assert blind.status == "passed" and blind.power is False
    assert blind.diagnosis.startswith("blind") and blind.blind_params == ["a"]


def test_power_is_measured_at_the_ops_incoming_gradient(lib):
    """silu through transpose: SILU's CPU backward ignores the strides of its incoming gradient.
    With loss sqr that gradient (2z) varies and the case fails; with loss sum it is all ones, any
    read of it gives the same ones, and the case passes: it must say blind. Before power was taken
    at the incoming gradient (it scrambled the *parameter* gradient, which varies with silu'), the
    SUM case passed with power=True."""
    blind = run_case(case("silu(a)", {"a": [4, 3, 2]}, consumer="transpose", loss="sum"), lib)
    assert blind.status == "passed" and blind.power is False and blind.kind == "blind"
    assert blind.blind_params == ["a"] and set(blind.power_scrambles) == {"transposed", "permuted", "shifted",
                                                                          "reversed"}
    sqr = run_case(case("silu(a)", {"a": [4, 3, 2]}, consumer="transpose", loss="sqr"), lib)
    assert sqr.status == "failed" and sqr.power is True
    assert all(maa["a"] > 0.1 for maa in sqr.power_scrambles.values())


def test_a_one_element_output_has_no_other_positions_to_read(lib):
    r = run_case(case("sum(a)", {"a": [4, 3]}, loss="sum"), lib)
    assert r.status == "passed" and r.power is True and r.power_scrambles == {}


def test_add1_backward_is_a_real_wrong_scale_in_this_ggml(lib, runner):
    """ggml 0.15.3's ADD1 backward gives b `ggml_mean(grad)` ("TODO: should probably be sum"): for a
    one-row a that is the true gradient / ne0; for more rows its shape is wrong and it aborts."""
    r = run_case(case("add1(a, b)", {"a": [4], "b": [1]}), lib)
    assert r.status == "failed" and r.diagnosis.startswith("b: wrong scale: analytic = 0.25 x numeric")
    rows = runner.run(case("add1(a, b)", {"a": [4, 3], "b": [1]}))
    assert rows.status == "crashed" and rows.phase == "build-backward"
    assert "ggml_are_same_shape(src1, cgraph->grads[isrc1])" in rows.message


# ---------------------------------------------------------------- phases, crashes, no backward

def test_phase_done_when_compared(lib):
    assert run_case(case("sqr(a)", {"a": [4, 3]}), lib).phase == "done"


def test_no_backward_is_reported_as_such(runner):
    """ggml 0.15.3 has no REGLU backward: ggml_build_backward_expand aborts. In isolation that is
    one result with the op named, not a dead run."""
    r = runner.run(case("reglu(a)", {"a": [4, 3, 2]}))
    assert r.status == "crashed" and r.phase == "build-backward" and r.no_backward
    assert r.diagnosis == "no backward for REGLU in this ggml"


def test_the_fused_swiglu_abort_is_no_backward(runner):
    """ggml has a backward for swiglu_split only; the fused one aborts in an assert whose text says so.
    It was reported as a crash ("ggml aborted in phase build-backward: ... GGML_ASSERT(src1 && ...)")."""
    r = runner.run(case("swiglu(a)", {"a": [4, 3, 2]}))
    assert r.status == "crashed" and r.phase == "build-backward" and r.no_backward
    assert r.diagnosis == "no backward for fused SWIGLU in this ggml"


def test_crash_in_compute_names_ggmls_assertion(runner):
    """SQRT's backward divides the incoming gradient (src0 of DIV); the CPU DIV kernel asserts a
    contiguous src0, so a transposed incoming gradient aborts the backward compute."""
    r = runner.run(case("sqrt(a)", {"a": [4, 3, 2]}, init={"a": [0.3, 1.0]}, consumer="transpose"))
    assert r.status == "crashed" and r.phase == "compute" and r.signal == "SIGABRT"
    assert "GGML_ASSERT(nb00 == sizeof(src0_t))" in r.message


# ---------------------------------------------------------------- a real wrong backward

# One patched ggml with three backward bugs of the kinds ggml has had (GGML-BACKWARD-NOTES.md):
# SCALE's backward scales by 2s (wrong scale), RELU's subtracts (wrong sign, as RELU once did),
# SIN's multiplies the incoming gradient by 0 (drops it).
WRONG_BACKWARD_PATCHES = [
    ("ggml_scale_impl(ctx, grad, s, 0.0, false)", "ggml_scale_impl(ctx, grad, 2.0f*s, 0.0, false)"),
    ("ggml_add_or_set(ctx, cgraph, isrc0, ggml_mul(ctx, ggml_step(ctx, src0), grad));",
     "ggml_sub_or_set(ctx, cgraph, isrc0, ggml_mul(ctx, ggml_step(ctx, src0), grad));"),
    ("ggml_add_or_set(ctx, cgraph, isrc0, ggml_mul(ctx, grad, ggml_cos(ctx, src0)));",
     "ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale(ctx, ggml_mul(ctx, grad, ggml_cos(ctx, src0)), 0.0f));"),
]

WRONG_BACKWARD_CASES = [
    (case("scale(a, 2.5)", {"a": [4, 3, 2]}), "a: wrong scale: analytic = 2 x numeric"),
    (case("relu(a)", {"a": [4, 3, 2]}, init={"a": {"abs": [0.2, 1.0]}}), "a: wrong sign: analytic = -numeric"),
    (case("sin(a)", {"a": [4, 3, 2]}), "a: analytic gradient is zero where the numeric one is not"),
]


@pytest.fixture(scope="module")
def wrong_backward_runner(tmp_path_factory, default_ggml):
    root = copy_tree(default_ggml, tmp_path_factory.mktemp("wrong-backward") / "ggml")
    for old, new in WRONG_BACKWARD_PATCHES:
        replace_once(root / "src" / "ggml.c", old, new)
    r = Runner(ensure_build(root, BuildOptions()).library, isolate="case")
    yield r
    r.close()


@pytest.mark.slow
@pytest.mark.parametrize("c, diagnosis", WRONG_BACKWARD_CASES, ids=["scale", "relu", "sin"])
def test_a_real_wrong_backward_is_caught_and_named(wrong_backward_runner, lib, c, diagnosis):
    assert run_case(c, lib).status == "passed"                   # the default ggml is right
    r = wrong_backward_runner.run(c)
    assert r.status == "failed" and r.maa > 0.1
    assert r.diagnosis.startswith(diagnosis)


def test_a_sign_bug_in_one_of_two_params_is_that_params_wrong_sign(run_on):
    """SUB's backward adding b's gradient instead of subtracting it: b's gradient is exactly -true.
    Before the diagnosis went per param first, the joint look over a and b (a = true next to
    b = -true) called it "b: right values at wrong positions ... (cosine 0.000) (across params a, b)"."""
    r = run_on("sub-sign", case("sub(a, b)", {"a": [4, 3], "b": [4, 3]}))
    assert r.status == "failed" and r.kind == "wrong-sign"
    assert r.diagnosis == "b: wrong sign: analytic = -numeric"
    assert [p["passed"] for p in r.params] == [True, False]


# ---------------------------------------------------------------- the harness checks its consumers

@pytest.mark.parametrize("graph, params", [("dup(a)", {"a": [4, 3]}), ("add(a, b)", {"a": [4, 3], "b": [4, 3]}),
                                           ("mul_mat(a, b)", {"a": [4, 3], "b": [4, 5]})])
def test_a_consumer_that_aborts_on_its_own_is_the_consumers_failure(runner, graph, params):
    """ggml 0.15.3's VIEW backward accumulates the transposed gradient of `transpose_view_gap` with
    ACC, whose CPU kernel asserts nb10 == sizeof(float): it aborts whatever op comes before. Before
    the consumer check, each of these was "crashed ... ggml aborted in phase compute" against the op."""
    r = runner.run(case(graph, params, consumer="transpose_view_gap"))
    assert r.status == "consumer-failed" and r.phase == "consumer-check" and r.kind == "consumer-fails"
    assert r.diagnosis.startswith("consumer 'transpose_view_gap' fails on its own in this ggml")
    assert "GGML_ASSERT(nb10 == sizeof(float))" in r.diagnosis
    # the same ops through a consumer that works are checked, and pass
    assert runner.run(case(graph, params, consumer="transpose")).status == "passed"


def test_a_consumer_fails_on_its_own_after_a_view_only(runner):
    """view_gap's VIEW backward zeroes its source with SCALE, which asserts a padded row: it aborts
    when the op's output is a view (transpose), and carries the gradient of a plain op (silu)."""
    r = runner.run(case("transpose(a)", {"a": [4, 3]}, consumer="view_gap"))
    assert r.status == "consumer-failed" and "GGML_ASSERT(ggml_is_padded_1d(a))" in r.diagnosis
    assert runner.run(case("silu(a)", {"a": [4, 3]}, consumer="view_gap")).status == "passed"


# ---------------------------------------------------------------- numeric reliability

@pytest.mark.parametrize("graph, params, init", [
    ("div(a, b)", {"a": [4, 3], "b": [4, 3]}, {"b": [0.05, 0.2]}),     # b - eps crosses the pole at 0
    ("step(a)", {"a": [4, 3]}, {"a": [-0.2, 0.2]}),                    # a +- eps crosses the jump at 0
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_step_across_a_pole_or_jump_is_numeric_unreliable_not_a_failure(lib, graph, params, init, seed):
    """Before the reliability check these failed with confident diagnoses against correct backwards:
    div "b: right values at wrong positions", step "the backward drops this gradient". A smaller eps
    (away from the singular points) makes div pass."""
    r = run_case(case(graph, params, init=init, seed=seed), lib)
    assert r.status == "numeric-unreliable" and r.kind == "numeric-unreliable", r.diagnosis
    assert "use a smaller eps, or an init range" in r.diagnosis and "x = " in r.diagnosis
    if graph.startswith("div"):
        assert run_case(case(graph, params, init=init, seed=seed, eps=1e-3), lib).status == "passed"


def test_a_real_failure_on_a_smooth_op_is_still_blamed(lib):
    """The check only leaves out elements whose estimate moves with the step: silu's stride bug stays
    a failure (its numeric side is smooth and stable)."""
    r = run_case(case("silu(a)", {"a": [4, 3, 2]}, consumer="transpose"), lib)
    assert r.status == "failed" and "numeric_unreliable" not in r.params[0]
    assert r.params[0]["halved_step_checked"] is True


def test_a_loss_that_is_not_finite_at_the_inputs_takes_no_finite_differences(lib):
    """expm1 at inputs up to 150 (test-backend-ops' own init for it): the loss is infinite, and so
    is every finite difference, since the other elements stay where they are. The case fails for
    its inputs, with the loss's value, and takes none of its 2 x 64 evaluations (at 5,005 elements
    they took 0.35 s). With the check of the loss removed, the evaluations are taken and the
    case ends in compare."""
    r = run_case(case("expm1(a)", {"a": [8, 4, 2]}, init={"a": [-150.0, 150.0]}, loss="sum"), lib)
    assert r.status == "failed" and r.kind == "nonfinite-loss", r.diagnosis
    assert r.phase == "compute" and r.evaluations == 0 and r.params == [] and r.maa is None
    assert r.loss_value == float("inf")
    assert "the loss itself is not finite at these inputs (loss = inf" in r.diagnosis
    assert "no finite differences were taken and the backward was not checked" in r.diagnosis


def test_the_halved_step_is_taken_where_the_comparison_disagrees(lib):
    """test-backend-ops' silu case (inputs up to +-150, eps 15, sum loss): a step of 15 is wrong
    only near 0, so only a few elements disagree. The halved step is taken there (at 67 of 512),
    not at all 512 elements, and counted in evaluations_halved (bench/ divides by it). Whether
    halving there decides as halving everywhere would: test_metrics.py."""
    r = run_case(case("silu(a)", {"a": [32, 4, 2, 2]}, init={"a": [-150.0, 150.0]}, loss="sum", eps=15.0,
                      stencil=2), lib)
    assert r.status == "failed", r.diagnosis
    p = r.params[0]
    assert p["halved_step_checked"] is True and 0 < p["halved_step_elements"] < 512 // 4
    # per element 2 forwards for the halved step, 4 for the loss's even part at two steps; and
    # the loss at x once a step, for each of at most two groups of elements
    assert r.evaluations == 2 * 512
    assert 6 * p["halved_step_elements"] < r.evaluations_halved <= 6 * p["halved_step_elements"] + 8


@pytest.mark.parametrize("stencil", [2, 4])
def test_the_halved_estimate_is_the_one_a_whole_pass_at_half_the_step_gives(lib, stencil):
    """The 4-point halved estimate evaluates only at +-h/4 and reuses g_half for its h/2 half; it
    must be, to the bit, what a whole 4-point pass at h/2 gives, as must the 2-point one at h/2
    (taken here at a few elements only, in another order). Using the h/4 central difference
    without Richardson, or h/2 for the 4-point stencil, fails this."""
    from pytest_gradgate.library import binding
    from pytest_gradgate.check.engine import halved_estimate
    c = case("exp(a)", {"a": [5, 3]}, eps=0.1, stencil=stencil)
    with _forward_session(lib, c) as (g, session, params, gf, loss):
        t, h = params["a"], 0.1
        buf = lambda a: binding.ffi.from_buffer("double[]", a)    # noqa: E731
        g_h, g_half, whole_h, whole_half = (np.empty(15) for _ in range(4))
        precise = stencil == 4
        assert lib.gg_numeric_grad(session, gf, t, loss, h, buf(g_h), buf(g_half) if precise else binding.ffi.NULL) == 0
        assert lib.gg_numeric_grad(session, gf, t, loss, h / 2, buf(whole_h),
                                   buf(whole_half) if precise else binding.ffi.NULL) == 0
        whole = (4 * whole_half - whole_h) / 3 if precise else whole_h
        if precise:
            assert (whole_h == g_half).all()       # the h/2 half of the whole pass is g_half, to the bit
        idx = np.array([14, 0, 7])
        halved = halved_estimate(lib, session, gf, t, loss, h, g_half if precise else None, idx)
        assert (halved == whole[idx]).all(), (halved, whole[idx])
        assert not np.allclose(whole, (4 * g_half - g_h) / 3 if precise else g_h, rtol=1e-9, atol=0)


def test_directional_estimates_leave_the_param_as_it_was_and_match_the_loss_at_both_ends(lib):
    """gg_directional reads a contiguous param in one copy and writes it back in one (element by
    element took tens of ms per call at 1M elements): the param is restored to the bit, and each
    estimate is (L(x + h d) - L(x - h d)) / 2h of the forward at both ends."""
    from pytest_gradgate.check import directional
    c = case("sqr(a)", {"a": [7, 5, 3]}, loss="sum", mode="fast")
    with _forward_session(lib, c) as (g, session, params, gf, loss):
        t, h = params["a"], 0.25
        before = read_tensor(g, t)
        dirs = directional.rademacher(3, 4, before.size)
        d_h, d_half = directional._along(g, session, gf, t, loss, dirs, h)
        assert (read_tensor(g, t) == before).all()
        x = before.astype(np.float32)
        # sum(sqr(x)) in float64 at the same f32 points: the forward's own f32 sum differs by roundoff
        ends = [(np.float64((x + s * h * d).astype(np.float32)) ** 2).sum() for d in dirs for s in (1, -1)]
        expected = (np.array(ends[0::2]) - np.array(ends[1::2])) / (2 * h)
        np.testing.assert_allclose(d_h, expected, rtol=1e-4)


@contextlib.contextmanager
def _forward_session(lib, c):
    """The case's forward graph on a CPU session, its values written: (g, session, params, gf, loss)."""
    from pytest_gradgate.check.ggml_graph import build_forward, graph_tensors
    from pytest_gradgate.declare.expr import parse_graph
    lines = parse_graph(c.graph)
    g = GraphBuilder(lib, c, graph_tensors(c, lines))
    session = lib.gg_session_new(b"cpu", 1, g.ffi.new("char[256]"), 256)
    try:
        params, _, _, loss = build_forward(g, c, lines)
        gf = g.forward_graph(loss)
        assert lib.gg_session_alloc(session, g.ctx)
        for t, values in g.values:
            write_tensor(g, t, values)
        yield g, session, params, gf, loss
    finally:
        lib.gg_session_free(session)
        g.free()


def test_a_graph_of_the_most_ops_a_case_may_have_is_not_full(runner):
    """Graphs are sized by the case's tensor budget (GraphBuilder), not by a fixed size: a case of
    MAX_OPS op calls (a chain of mul and add, 498 calls, about 2,500 nodes with its backward)
    passes. A full graph aborts the child; sized at 512 this case crashes."""
    from pytest_gradgate.declare.expr import MAX_OPS
    lines = ["x0 = mul(a, b)"] + [f"x{i} = add(mul(x{i - 1}, b), a)" for i in range(1, MAX_OPS // 2 - 1)]
    r = runner.run(case("\n".join(lines), {"a": [2], "b": [2]}, threads=1))
    assert r.status == "passed", (r.status, r.message, r.stderr_tail[-500:])


def test_a_failures_headline_speaks_of_one_param(run_on):
    """Issue 52: with a and b both failing, the headline gave b's MAA, limit and cosine under a's
    diagnosis ("MAA 4.44 > 0.000834: a: right values at wrong positions ... (cosine -0.006)"), and
    the HTML and step-summary rows mixed them the same way. Now all of them are the param that is
    furthest off."""
    from pytest_gradgate.report.outputs import one_line
    r = run_on("concat-buggy", case("concat(a, b, dim=1)", {"a": [4, 3, 5, 1], "b": [4, 2, 5, 1]},
                                    consumer="permute_0213_transpose", alloc="own"))
    assert r.status == "failed"
    by_name = {p["name"]: p for p in r.params}
    assert all(not p["passed"] for p in by_name.values()) and by_name["b"]["maa"] > by_name["a"]["maa"]
    b = by_name["b"]
    assert (r.maa, r.cosine, r.limit) == (b["maa"], b["cosine"], b["limit"])
    assert r.diagnosis.startswith("b: ") and "for param b" in r.message
    assert one_line(r.to_dict()).startswith(f"MAA {b['maa']:.3g} > {b['limit']:.3g}: b: ")


def test_a_crashs_line_says_its_phase_once(runner):
    """Issue 52: "crashed in phase build-backward: ggml aborted in phase build-backward: ..." """
    from pytest_gradgate.report.outputs import one_line
    r = runner.run(case("add1(a, b)", {"a": [4, 3, 2], "b": [1]}))     # ADD1's backward aborts on 0.15.3
    assert r.status == "crashed" and r.phase == "build-backward"
    line = one_line(r.to_dict())
    assert line.startswith("crashed: ggml aborted in phase build-backward: ") and line.count("in phase") == 1


def test_gradient_sent_where_it_should_be_masked_is_named_so(run_on):
    """Issue 53: a backward that sends gradient to elements it should mask was called "right
    values at wrong positions ... reads the incoming gradient with the wrong strides or offsets",
    while its element lines showed analytic +1.99 against numeric 0. relu-unmasked: RELU's backward
    without its step(x) mask."""
    # b keeps the gradient arriving at relu non-zero where a < 0 (with relu alone, SQR's gradient
    # 2 relu(a) is already 0 there, and the missing mask changes nothing)
    r = run_on("relu-unmasked", case("add(relu(a), b)", {"a": [4, 3, 2], "b": [4, 3, 2]}, alloc="own"))
    assert r.status == "failed" and r.kind == "gradient-where-zero", r.diagnosis
    assert re.match(r"a: gradient where the numeric one is zero: at (all )?\d+ of the \d+ elements that disagree", r.diagnosis)
    assert "the backward sends gradient to elements it should mask" in r.diagnosis
    assert "wrong positions" not in r.diagnosis and "strides" not in r.diagnosis


def test_a_batch_written_at_another_batchs_place_is_named_so(run_on, lib):
    """Issue 53: a backward that writes batch (i2, i3) at (i3, i2) was "values disagree" or "right
    values at wrong positions ... strides or offsets". rms-norm-back-batch-swap: RMS_NORM_BACK's
    output rows of batch (i2, i3) written at (i3, i2); with ne2 = ne3 = 2 the slices [:, :, 1, 0]
    and [:, :, 0, 1] trade places and the two others are right."""
    r = run_on("rms-norm-back-batch-swap", case("rms_norm(a, eps=1.0e-6)", {"a": [4, 3, 2, 2]}, loss="wsqr",
                                                alloc="own"))
    assert r.status == "failed" and r.kind == "batch-misplaced", r.diagnosis
    assert "slice [:, :, 1, 0] holds the numeric gradient of slice [:, :, 0, 1]" in r.diagnosis
    assert "slice [:, :, 0, 1] holds the numeric gradient of slice [:, :, 1, 0]" in r.diagnosis
    assert "the other 2 slice(s) agree" in r.diagnosis and "another batch's place" in r.diagnosis
    # control: the default's right backward passes the same case
    assert run_case(case("rms_norm(a, eps=1.0e-6)", {"a": [4, 3, 2, 2]}, loss="wsqr", alloc="own"), lib).status == "passed"
