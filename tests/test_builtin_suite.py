"""The built-in suite (pytest_gradgate/cases.yaml) on the default ggml, run once the way a
user runs it: `pytest --gradgate` in a directory of its own, every report recorded (the
fast-mode file cases_fast.yaml is left out: it has tests of its own).

Checked here: it collects every case the loader finds and nothing invalid; every item ends
passed, failed with a diagnosis, or skipped with a reason; every case that ran to the
comparison has power; each op of the op table is covered through `none` and at least three
non-contiguous consumers; each op whose backward reads a forward input is also checked
through at least one producer (a non-contiguous input); and a few of ggml 0.15.3's known findings keep being found (so
this suite demonstrably fails on a wrong backward). The run uses an empty baseline so that
outcomes are the raw ones, not the shipped baseline's xfails.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

import pytest_gradgate
from pytest_gradgate.library.cache import cache_root, file_lock
from pytest_gradgate.declare.expr import ops_used, parse_graph
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.ops.table import OPS

BUILTIN = Path(pytest_gradgate.__file__).parent / "cases.yaml"
USER_CACHE = cache_root()

# ops the suite does not check, and why
NOT_IN_SUITE = {
    "clamp": "ggml_clamp is always in place (a view of its input), which ggml_build_backward_expand rejects",
}

DUMP_PLUGIN = '''
import json, os
reports = []

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else ""
        where = list(longrepr[:2]) if isinstance(longrepr, tuple) else None
        reports.append({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                        "text": str(longrepr or ""), "reason": reason, "where": where,
                        "result": getattr(report, "gradgate_result", None)})

def pytest_sessionfinish(session):
    with open(os.environ["GRADGATE_TEST_DUMP"], "w") as out:
        json.dump(reports, out)
'''


def _run_suite(workdir):
    """pytest --gradgate in a bare directory -> list of report dicts (setup errors included)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "gradgate_dump.py").write_text(textwrap.dedent(DUMP_PLUGIN))
    baseline = workdir / "empty-baseline.json"
    baseline.write_text(json.dumps({"schema": 2, "entries": {}}))
    dump = workdir / "reports.json"
    env = dict(os.environ, GRADGATE_CACHE_DIR=str(USER_CACHE), GRADGATE_TEST_DUMP=str(dump),
               PYTHONPATH=os.pathsep.join([str(workdir), os.environ.get("PYTHONPATH", "")]))
    for name in ("GRADGATE_BASELINE", "GRADGATE_CASES", "GRADGATE_GGML_SRC", "GRADGATE_BACKEND", "GRADGATE_MODE"):
        env.pop(name, None)
    # only cases.yaml: the built-in fast-mode file (cases_fast.yaml) has tests of its own
    proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "-q", "-p", "no:cacheprovider",
                           "-p", "gradgate_dump", f"--gradgate-baseline={baseline}",
                           "--gradgate-no-builtin", f"--gradgate-cases={BUILTIN}"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert dump.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(dump.read_text())


@pytest.fixture(scope="session")
def suite_reports(tmp_path_factory, default_build):
    """The run's reports, computed once even under pytest-xdist (workers share the file)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's basetemp is a child of the session's: share that one
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gradgate-builtin-suite"
    with file_lock(str(shared) + ".lock"):
        done = shared / "reports.json"
        if done.exists():
            return json.loads(done.read_text())
        return _run_suite(shared)


def _loaded():
    loaded, errors = load_file(BUILTIN, builtin=True)
    return loaded, errors


def test_builtin_suite_loads_without_errors():
    loaded, errors = _loaded()
    assert [str(e) for e in errors] == []
    assert sum(len(entry.cases) for entry in loaded) >= 250


def test_every_op_is_checked_through_none_and_three_non_contiguous_consumers():
    loaded, _ = _loaded()
    consumers_of = defaultdict(set)
    for entry in loaded:
        for case in entry.cases:
            for op in ops_used(parse_graph(case.graph)):
                consumers_of[op].add(case.consumer)
    for name in OPS:
        if name in NOT_IN_SUITE:
            assert name not in consumers_of, f"{name} is in the suite now: drop it from NOT_IN_SUITE"
            continue
        seen = consumers_of.get(name, set())
        assert "none" in seen and len(seen - {"none"}) >= 3, f"{name}: consumers {sorted(seen)}"


# ops whose backward reads a forward input (ggml_compute_backward: the input itself, or the
# other factor) must be checked with that input non-contiguous too, through >= 1 producer
READS_FORWARD_INPUTS = ("sqr", "sqrt", "log", "sin", "cos", "abs", "sgn", "step", "relu", "silu", "exp", "expm1",
                        "softplus", "mul", "div", "mul_mat", "rms_norm", "pool_2d", "cross_entropy_loss",
                        "swiglu_split")
# ...except where no producer gets past the op's own forward in ggml 0.15.3 and 0.26.0
NO_PRODUCER = {
    "soft_max_ext": "ggml_soft_max_ext asserts a contiguous input; its backward reads the output, always contiguous",
}


def test_ops_whose_backward_reads_a_forward_input_are_checked_through_producers():
    loaded, _ = _loaded()
    producers_of = defaultdict(set)
    for entry in loaded:
        for case in entry.cases:
            for op in ops_used(parse_graph(case.graph)):
                producers_of[op].add(case.producer)
    for name in READS_FORWARD_INPUTS:
        assert len(producers_of[name] - {"none"}) >= 1, f"{name}: producers {sorted(producers_of[name])}"
    for name in NO_PRODUCER:
        assert producers_of[name] == {"none"}, f"{name} has producers now: drop it from NO_PRODUCER"


def test_the_run_collects_the_whole_suite(suite_reports):
    loaded, _ = _loaded()
    expected = {f"pytest_gradgate/cases.yaml::{c.name}[{c.variant}]" for entry in loaded for c in entry.cases}
    ran = {r["nodeid"] for r in suite_reports if r["when"] == "call"}
    assert ran == expected


def test_every_item_ends_passed_failed_with_a_diagnosis_or_skipped_with_a_reason(suite_reports):
    assert [r["nodeid"] for r in suite_reports if r["when"] != "call"] == []    # no setup errors
    for r in suite_reports:
        result = r["result"]
        assert result is not None, r["nodeid"]
        if r["outcome"] == "passed":
            assert result["status"] == "passed", r["nodeid"]
        elif r["outcome"] == "failed":
            assert result["status"] in ("failed", "crashed", "timeout", "error"), r["nodeid"]
            assert result["diagnosis"] and result["diagnosis"] in r["text"], r["nodeid"]
        else:
            assert r["outcome"] == "skipped", r["nodeid"]
            # no backward for the op, a backward op this backend cannot run (ggml 0.15.3's CPU
            # SOFT_MAX_BACK has no max_bias), or a consumer or producer that cannot carry a
            # gradient in this ggml: nothing was checked, and it says why
            assert r["reason"].startswith(("Skipped: no backward for ", "Skipped: backend cpu does not support ",
                                           "Skipped: consumer '", "Skipped: producer '")), (r["nodeid"], r["reason"])
            # at the case's declaration (what -rs prints), not at the plugin's line that raised the skip
            assert r["where"] == [str(BUILTIN), result["origin"]["line"]], (r["nodeid"], r["where"])
            if result["status"] == "consumer-failed":
                assert result["kind"] == "consumer-fails" and "fails on its own" in r["reason"], r["nodeid"]
            if result["status"] == "producer-failed":
                assert result["kind"] == "producer-fails" and "fails on its own" in r["reason"], r["nodeid"]


def test_every_case_that_ran_has_power(suite_reports):
    """Fails when a case is blind: e.g. `sqrt` with loss sqr (sum(sqrt(a)^2) = sum(a), an
    all-ones gradient) instead of wsqr was measured power=False."""
    compared = [r["result"] for r in suite_reports if r["result"]["phase"] == "done"]
    assert len(compared) > 100
    assert [r["case_id"] for r in compared if r["power"] is not True] == []


# Findings on ggml 0.15.3 (CPU) the suite must keep making: if one of these passes, either
# ggml changed (then update this list) or the suite lost its power to see it.
KNOWN_FINDINGS = {
    "silu[transpose-sqr-cpu]": ("failed", "values disagree"),
    "pool_2d_avg[permute_1203-sqr-cpu]": ("failed", "right values at wrong positions"),
    "acc[transpose-sqr-cpu]": ("failed", "b: "),
    "add1_vector[none-sqr-cpu]": ("failed", "wrong scale: analytic = 0.1667 x numeric"),
    "im2col[permute_0213_transpose-sqr-cpu]": ("failed", "values disagree"),
    "sqrt[transpose-wsqr-cpu]": ("crashed", "GGML_ASSERT(nb00 == sizeof(src0_t)) failed"),
    "soft_max_ext_scale_mask[permute_1203-wsqr-cpu]": ("crashed", "GGML_ASSERT(ggml_is_contiguous(src0))"),
    "concat_dim1[permute_0213_transpose-sqr-cpu]": ("crashed", "no backward for CONCAT in this ggml"),
    # producers: SILU_BACK reads x at row i1 * nb[1], wrong once x's rows are permuted apart
    "silu[from_permute_0213-none-sqr-cpu]": ("failed", "a reaches the op through producer 'permute_0213'"),
    "pool_2d_max[from_view_gap-none-sqr-cpu]": ("failed", "right values at wrong positions"),
    "cross_entropy_loss[from_view_gap-none-sqr-cpu]": ("crashed", "GGML_ASSERT(ggml_is_contiguous(src0f))"),
}


@pytest.mark.parametrize("case_id", list(KNOWN_FINDINGS))
def test_known_findings_on_the_default_ggml(case_id, suite_reports):
    by_id = {r["result"]["case_id"]: r["result"] for r in suite_reports}
    status, text = KNOWN_FINDINGS[case_id]
    assert by_id[case_id]["status"] == status
    assert text in by_id[case_id]["diagnosis"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["concat-fixed", "concat-buggy"])
def test_the_suite_catches_the_concat_story(variant, ggml_variant):
    """On ggml patched with a CONCAT backward, the built-in concat cases and the KV walk run
    (they are skipped on upstream 0.15.3): the fixed backward passes every one of them that
    gets through ggml's own kernels; the buggy one (slicing with the forward's strides) fails
    each concat case behind a non-contiguous consumer and the KV walk even through `none`,
    because the attention itself transposes V after the concat."""
    from pytest_gradgate.isolation.parent import Runner
    _, build = ggml_variant(variant)
    loaded, _ = _loaded()
    # in memory of its own: the walk's softmax meets upstream's SOFT_MAX_BACK alias in the regimes
    # (tests/test_regimes.py), which is not the story's bug
    cases = [dataclasses.replace(c, alloc="own") for entry in loaded
             if entry.name.startswith(("concat_", "kv_walk")) and entry.name != "kv_walk_query"
             for c in entry.cases if c.consumer != "transpose_view_gap"]     # that one aborts in ggml's ACC
    runner = Runner(build.library)
    try:
        results = {c.id: runner.run(c) for c in cases}
    finally:
        runner.close()
    if variant == "concat-fixed":
        assert {cid: r.status for cid, r in results.items() if r.status != "passed"} == {}
        assert all(r.power for r in results.values())
    else:
        expect_pass = {cid for cid in results if cid.startswith("concat_") and "[none-" in cid}
        assert {cid for cid, r in results.items() if r.status == "passed"} == expect_pass
        assert all(r.status == "failed" for cid, r in results.items() if cid not in expect_pass)
        assert "right values at wrong positions" in results["concat_dim1[permute_0213_transpose-sqr-cpu]"].diagnosis


@pytest.mark.parametrize("baseline", ["baseline_default.json", "baseline_ggml-0.26.0.json"])
def test_the_mul_mat_ne3_broadcast_is_an_item_and_a_known_upstream_gap(baseline):
    """The parameter axes make MUL_MAT's broadcast over ne3 an item of the built-in suite; ggml
    aborts on it (0.15.3 and 0.26.0 alike), so both shipped baselines record the crash."""
    entries = json.loads((Path(pytest_gradgate.__file__).parent / "gate" / baseline).read_text())["entries"]
    broadcast = {k: v for k, v in entries.items()
                 if k.startswith("pytest_gradgate/cases.yaml::mul_mat_broadcast,n2=6,n3=1[")}
    assert broadcast, f"{baseline} has no mul_mat ne3 broadcast item"
    for entry in broadcast.values():
        assert entry["status"] == "crashed" and "GGML_ASSERT(tmp->ne[3] == 1)" in entry["reason"]
