"""Against ggml's own test-backend-ops, built from the same ggml tree: on a sample of its grad
cases that are non-NaN and that we can reproduce exactly (same op, shapes, init range, eps,
stencil, SUM loss, consumer none), our engine gives the same verdict and an MAA of the same
order. test-backend-ops seeds from std::random_device, so MAAs are compared by order only.

The first run builds test-backend-ops (a large C++ file: about 2m45s cold on 2 busy cores);
later runs reuse the build cached by content in the user cache.

How the comparison can fail (checked by hand): with every translated case's eps multiplied by
10, i.e. a translation that does not reproduce the reference, 17 of the 48 sampled cases
disagree (SIN/COS: our MAA 1.5e-2 from truncation; SQR/CONT/REPEAT/SCALE: exact 0 against
test-backend-ops' 2e-6).
"""

import math

import pytest

import reference

pytestmark = pytest.mark.slow

# ops whose test-backend-ops grad cases run in seconds; -p narrows the slow ones to a few cases
SAMPLE = [("SQR", None), ("SQRT", None), ("LOG", None), ("SIN", None), ("COS", None), ("SUM", None),
          ("MEAN", None), ("SUM_ROWS", None), ("REPEAT", None), ("SCALE", None), ("CONT", None),
          ("ADD", r"ne=\[10,5,4,3\],nr=\[1,1,1,1\]"),
          ("MUL_MAT", r"type_a=f32,type_b=f32,m=16,n=[1-4],k=256,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1")]


@pytest.fixture(scope="module")
def tbo(default_ggml):
    return reference.ensure_reference(default_ggml).binary


@pytest.fixture(scope="module")
def runs(tbo):
    return {op: reference.run_grad(tbo, op, params=p, timeout=300) for op, p in SAMPLE}


def test_output_is_parsed_case_by_case(runs):
    sqr = runs["SQR"]
    assert sqr.returncode == 0
    statuses = {c.vars: c.status for c in sqr.cases}
    assert statuses["type=f32,ne=[10,5,4,3]"] == "ok"
    assert statuses["type=f16,ne=[10,5,4,3]"] == "not_supported"
    assert statuses["type=f32,ne=[1024,1024,1,1]"] == "skipped_large"
    ok = next(c for c in sqr.cases if c.status == "ok")
    assert set(ok.maa) == {"a"} and 0 <= ok.maa["a"] < 1e-4   # our MAA report line, for passing cases too


def test_a_whole_run_aborts_and_the_case_it_died_in_is_named(runs):
    """SCALE's in-place variant aborts test-backend-ops (a view cannot take a gradient); the
    cases before it keep their verdicts, the one it died in is `crashed` with ggml's message."""
    scale = runs["SCALE"]
    assert scale.signal == "SIGABRT"
    crashed = [c for c in scale.cases if c.status == "crashed"]
    assert len(crashed) == 1 and "inplace=1" in crashed[0].vars and "GGML_ASSERT" in crashed[0].detail
    assert any(c.status == "ok" for c in scale.cases)


RERUNS = 5


def test_same_verdict_and_maa_order_as_test_backend_ops(runs, runner, tbo):
    """A disagreement where test-backend-ops fails and we pass is excused only when its own reruns of
    that case pass (its verdict depends on the draw). A broken backward fails every draw: SUM over a
    permuted param (below) stays a failure on both sides, and it must."""
    rows, disagreements, flaky = [], [], []
    for run in runs.values():
        for ref in run.cases:
            if not reference.comparable(ref):
                continue
            result = runner.run(reference.to_case(ref))
            same_verdict, same_order, why = reference.agreement(ref, result)
            if not same_verdict and ref.status == "fail" and result.status == "passed":
                # test-backend-ops draws new inputs on every run: a correct op over its fixed limit by
                # roundoff in one draw (seen: MUL_MAT k=256, MAA 6e-4 > 1e-4) passes in others
                reruns = reference.rerun_statuses(tbo, ref, RERUNS)
                if "ok" in reruns:
                    # ... and its MAA is that of a draw its own reruns disown: no order to compare
                    # with (seen in CI: MUL_MAT k=256, 7.5e-4 in the draw, 10/10 reruns ok, ours 6.5e-6)
                    same_verdict, same_order = True, True
                    why = f"test-backend-ops flaky: {reruns.count('ok')}/{len(reruns)} reruns ok"
                    flaky.append(ref.id)
            rows.append((ref.id, ref.status, ref.worst_maa, result.status, result.maa, why))
            if not (same_verdict and same_order):
                disagreements.append(rows[-1])
    table = "\n".join(f"{r[0][:70]:70s} tbo {r[1]:4s} {r[2]:.2e}  ours {r[3]:6s} {r[4]:.2e} {r[5]}" for r in rows)
    assert len(rows) >= 30, table
    assert {r[0].split("(")[0] for r in rows} >= {"SQR", "SUM", "CONT", "MUL_MAT", "SIN", "ADD"}, table
    assert not disagreements, table
    assert len(flaky) <= 2, table   # flakiness is the exception; more would mean we excuse too much
    # a real failure both agree on: SUM over a permuted param (ggml 0.15.3's SUM forward misreads
    # the permuted view: tests/test_producers.py)
    assert any(r[1] == "fail" and r[3] == "failed" and r[2] > 0.5 for r in rows), table


def test_reference_needs_the_tests_folder(tmp_path):
    from pytest_gradgate.errors import BuildError
    with pytest.raises(BuildError, match="tests/test-backend-ops.cpp"):
        reference.ensure_reference(tmp_path)


def test_vars_are_parsed_with_lists_and_flags():
    v = reference.parse_vars("type=f32,ne_a=[128,2,2,2],v=0,split")
    assert v == {"type": "f32", "ne_a": [128, 2, 2, 2], "v": 0, "split": True}
    assert math.isclose(reference.parse_vars("scale=2.000000")["scale"], 2.0)


def test_bench_params_filter_runs_exactly_the_chosen_cases(tbo):
    """The bench times test-backend-ops on the cases we reproduce by passing them as a -p regex."""
    from bench_reference import params_regex, run_tbo
    chosen = ["type=f32,ne=[10,5,4,3]", "type=f32,ne=[7,1,5,3]"]
    run, peak_kib = run_tbo(tbo, "SQR", params=params_regex(chosen))
    assert sorted(c.vars for c in run.cases) == sorted(chosen) and peak_kib > 0
