"""Parity items: one case's analytic gradients on two sides, compared (check/parity.py,
gate/parity.py).

On real builds: with --gradgate-reference-src the seed's CONCAT backward (ggml_variants.py
'concat-buggy') against the fixed one ('concat-fixed') fails exactly the items whose backward
the bug changes (CONCAT behind a transpose, the KV walk at Qwen2.5-1.5B head sizes), naming the
params it changed, and the fixed tree against itself passes them all: the buggy run is the
control of the clean one, one patched function apart. The verdict's logic and the precision
model need no build.
"""

import dataclasses
import textwrap

import numpy as np
import pytest

from pytest_gradgate.check import gradsets, parity, precision
from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.declare.case import Case
from pytest_gradgate.gate.parity import VS_CPU, VS_REFERENCE, parity_cases
from pytest_gradgate.library.cache import cache_root

USER_CACHE = cache_root()

CASES = textwrap.dedent("""\
    cases:
      - name: concat_dim1
        params: {a: [4, 3, 2], b: [4, 2, 2]}
        graph: concat(a, b, dim=1)
        consumers: [none, transpose]
      - name: mul_plain
        params: {a: [4, 3], b: [4, 3]}
        graph: mul(a, b)
        consumers: [none]
    """)
KV_1P5B = "kv_walk_chunked_1p5b and none-sqr"


def _gate(pytester, monkeypatch, tested, reference, *extra):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))
    for name in ("GITHUB_ACTIONS", "GRADGATE_GGML_SRC", "GRADGATE_BASELINE", "GRADGATE_CASES",
                 "GRADGATE_REFERENCE_SRC", "GRADGATE_TF32"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "gradgate_p.yaml").write_text(CASES)
    return pytester.runpytest_subprocess("--gradgate", "gradgate_p.yaml", "pytest_gradgate/cases_equivalence.yaml",
                                         "-k", f"concat_dim1 or mul_plain or ({KV_1P5B})",
                                         "--gradgate-ggml-src", str(tested), "--gradgate-reference-src", str(reference),
                                         "-p", "no:cacheprovider", "-rA", *extra)


@pytest.mark.slow
def test_a_reference_tree_fails_the_items_whose_backward_the_bug_changes_and_passes_itself(
        pytester, monkeypatch, ggml_variant):
    """Buggy CONCAT against the fixed one: CONCAT through a transpose and the 1.5B KV walk fail,
    naming the params the bug changed (the walk's V, not its Q and K); CONCAT through `none`
    (a contiguous gradient, which the bug reads right) and MUL pass. The fixed tree against
    itself passes every one: the same items, the bug taken out."""
    buggy, fixed = ggml_variant("concat-buggy")[0], ggml_variant("concat-fixed")[0]
    red = _gate(pytester, monkeypatch, buggy, fixed)
    red.assert_outcomes(failed=2, passed=2)     # the parity items alone: no finite-difference item runs
    red.stdout.fnmatch_lines([
        "*gradgate: parity against the reference ggml from *concat-fixed*",
        "FAILED gradgate_p.yaml::concat_dim1[[]transpose-sqr-cpu-vs-reference[]]*",
        "FAILED *cases_equivalence.yaml::kv_walk_chunked_1p5b[[]none-sqr-cpu-vs-reference[]]*",
    ], consecutive=False)
    text = red.stdout.str()
    assert "the tested side changed the gradient of a, b (against the reference side)" in text
    assert "the tested side changed the gradient of v (against the reference side): v: right values at wrong " \
           "positions" in text and "k, q agree" in text
    assert "PASSED gradgate_p.yaml::concat_dim1[none-sqr-cpu-vs-reference]" in text
    clean = _gate(pytester, monkeypatch, fixed, fixed, "--durations=0")
    clean.assert_outcomes(passed=4)
    # the 1.5B walk as a parity item: both sides' one backward, well under the issue's 2 s
    line = next(x for x in clean.stdout.lines if "call" in x and "kv_walk_chunked_1p5b" in x)
    assert float(line.split("s")[0]) < 2.0, line


def test_a_bad_reference_src_is_a_usage_error_naming_the_option(pytester):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-reference-src", str(pytester.path / "nowhere"),
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gradgate-reference-src*nowhere*"])


def test_a_bad_tf32_backend_is_a_usage_error_naming_the_option(pytester):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-tf32", "gpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gradgate-tf32*'gpu' is not a backend*"])


# -- the verdict (no build) ----------------------------------------------------------------------

CASE = Case(name="c", graph="mul_mat(a, b)", params={"a": [8, 4], "b": [8, 3]})


def _set(label, grads, output=(1.0, 2.0), **kw):
    return gradsets.GradientSet(label, np.asarray(output), (2, 1, 1, 1), {k: np.asarray(v) for k, v in grads.items()},
                                {k: (len(v), 1, 1, 1) for k, v in grads.items()}, 10.0, 20.0, **kw)


def _ok(sets):
    return Result.for_case(CASE).finish(Status.PASSED, Phase.DONE), sets


def _died(status=Status.CRASHED, message="ggml aborted"):
    r = Result.for_case(CASE).finish(status, Phase.COMPUTE, message=message)
    return r, None


GOOD = {"a": np.linspace(-1, 1, 12), "b": np.linspace(2, -1, 9)}


def test_the_same_gradients_pass_and_a_changed_param_is_named_with_its_diagnosis():
    same = parity.judge(CASE, ("tested", "reference"), [_ok([_set("graph", GOOD)]), _ok([_set("graph", GOOD)])])
    assert same.status == Status.PASSED and same.nmse == 0 and same.mode == "parity"
    flipped = dict(GOOD, b=-GOOD["b"])
    r = parity.judge(CASE, ("tested", "reference"), [_ok([_set("graph", flipped)]), _ok([_set("graph", GOOD)])])
    assert r.status == Status.FAILED and r.kind == Diagnosis.WRONG_SIGN
    assert r.diagnosis.startswith("the tested side changed the gradient of b (against the reference side): b: wrong sign")
    assert r.diagnosis.endswith("; a agrees")
    assert [m["changed"] for m in r.params] == [None, "tested"]


def test_a_forward_that_changed_makes_no_gradient_claim():
    other = _set("graph", GOOD, output=(1.0, 3.0))
    r = parity.judge(CASE, ("tested", "reference"), [_ok([other]), _ok([_set("graph", GOOD)])])
    assert r.status == Status.FAILED and r.kind == Diagnosis.FORWARD_DIFFERS and r.params == []


def test_one_side_that_cannot_compute_is_a_verdict_only_where_the_other_side_did():
    crashed = parity.judge(CASE, ("tested", "reference"), [_died(), _ok([_set("graph", GOOD)])])
    assert crashed.status == Status.CRASHED
    assert crashed.diagnosis.startswith("the tested side fails where the reference side computes the gradients")
    no_reference = parity.judge(CASE, ("tested", "reference"), [_ok([_set("graph", GOOD)]), _died()])
    assert no_reference.status == Status.INCONCLUSIVE
    both = parity.judge(CASE, ("tested", "reference"), [_died(), _died()])
    assert both.status == Status.SKIPPED and both.message.startswith("neither side computes")
    unsupported = parity.judge(CASE, ("cuda", "cpu"), [_died(Status.SKIPPED, "backend cuda does not support X"),
                                                       _ok([_set("graph", GOOD)])])
    assert unsupported.status == Status.SKIPPED and "does not support" in unsupported.message


def test_a_cuda_case_gets_a_parity_item_against_the_cpu_and_a_reference_tree_gives_every_case_one():
    cuda = Case(name="c", graph="sqr(a)", params={"a": [4]}, backend="cuda")
    cpu = Case(name="c", graph="sqr(a)", params={"a": [4]})
    assert [k for k, _ in parity_cases(cuda, None)] == [VS_CPU]
    assert parity_cases(cpu, None) == []
    assert [k for k, _ in parity_cases(cpu, "/some/tree")] == [VS_REFERENCE]


# -- precision per backend (no build) ------------------------------------------------------------

def _tf32(x):
    """x rounded to TF32 (10 mantissa bits), to nearest even, as tensor cores take f32 inputs."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
    return bits.astype(np.uint32).view(np.float32)


def test_the_tf32_limit_takes_a_tf32_matmul_and_still_refuses_a_one_percent_scale_error():
    """A matmul's gradient computed from TF32-rounded inputs differs from the f32 one by more
    than the f32 limit allows, and by less than the limit of a TF32 side; a 1% scale error
    stays far above the TF32 limit."""
    rng = np.random.default_rng(0)
    k = 256
    a, g = rng.uniform(-1, 1, (64, k)).astype(np.float32), rng.uniform(-1, 1, (k, 32)).astype(np.float32)
    exact = a.astype(np.float64) @ g
    rounded = _tf32(a).astype(np.float64) @ _tf32(g)
    steps = dict(matmuls=1, forward_matmuls=1)

    def sets(values, prec):
        s = gradsets.GradientSet("x", np.zeros(1), (1, 1, 1, 1), {"w": values.ravel()}, {"w": (values.size, 1, 1, 1)},
                                 float(k) + 1, float(k) + 2, **steps, precision=prec)
        return s

    def nmse(x, y):
        return gradsets.compare_values(x.ravel(), y.ravel(), 1.0, [x.size, 1, 1, 1])["nmse"]
    f32_limit = gradsets.set_limit(sets(exact, "f32"), sets(exact, "f32"))
    tf32_limit = gradsets.set_limit(sets(rounded, "tf32"), sets(exact, "f32"))
    assert nmse(rounded, exact) > f32_limit        # without the model a clean TF32 matmul is red
    assert nmse(rounded, exact) < tf32_limit / 10   # with it, green with room
    assert nmse(1.01 * exact, exact) > 10 * tf32_limit   # a 1% scale error stays red
    three = gradsets.set_limit(dataclasses.replace(sets(rounded, "tf32"), matmuls=3), sets(exact, "f32"))
    assert nmse(1.01 * exact, exact) > 5 * three     # ... behind a chain of three matmuls too
    assert precision.matmul_precision("cuda") == "tf32" and precision.matmul_precision("cpu") == "f32"
    assert precision.matmul_precision("cpu", precision.parse_backends("cpu,cuda")) == "tf32"
    assert precision.parse_backends("none") == ()


MATMUL_HEAVY = "mul_mat or attention or mlp"


@pytest.mark.slow
def test_a_tf32_matmul_is_green_under_its_precision_and_a_one_percent_scale_error_stays_red(
        pytester, monkeypatch, ggml_variant, default_ggml):
    """ggml_variants.py 'tf32-matmul' rounds the CPU mul_mat's inputs to TF32, as CUDA's cuBLAS
    calls do. Told so (--gradgate-tf32 cpu), its built-in matmul-heavy items (mul_mat, the
    attention and MLP cases, up to 1.5B head sizes) all pass against the default ggml; with the
    f32 limits (--gradgate-tf32 none) they are red: the precision model is what makes them green.
    'tf32-matmul-scaled' adds a 1% scale error to mul_mat's backward: red, diagnosed as the
    wrong scale, under the TF32 limits too."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))
    for name in ("GITHUB_ACTIONS", "GRADGATE_GGML_SRC", "GRADGATE_BASELINE", "GRADGATE_REFERENCE_SRC", "GRADGATE_TF32"):
        monkeypatch.delenv(name, raising=False)

    def gate(variant, tf32):
        return pytester.runpytest_subprocess("--gradgate", "-k", MATMUL_HEAVY, "--gradgate-tf32", tf32,
                                             "--gradgate-ggml-src", str(ggml_variant(variant)[0]),
                                             "--gradgate-reference-src", str(default_ggml), "-p", "no:cacheprovider")
    green = gate("tf32-matmul", "cpu")
    outcomes = green.parseoutcomes()
    assert outcomes.get("passed", 0) >= 20 and "failed" not in outcomes, outcomes
    assert gate("tf32-matmul", "none").parseoutcomes().get("failed", 0) == outcomes["passed"]
    scaled = gate("tf32-matmul-scaled", "cpu")
    assert scaled.parseoutcomes().get("failed", 0) == outcomes["passed"]
    scaled.stdout.fnmatch_lines(["*attention_gqa_1p5b[[]none-sqr-cpu-vs-reference[]]*wrong scale: tested = 1.01 x "
                                 "reference*"])
