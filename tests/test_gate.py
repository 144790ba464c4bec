"""The gate end to end: `pytest --gradgate` in a real subprocess on real ggml builds, its exit
code, the baseline of known failures, and the outputs (JSON, GitHub annotations and step
summary, terminal summary).

The bug is real: the concat-buggy variant of the default ggml has a CONCAT backward that
slices the gradient with a view assuming a contiguous first stride (DESIGN.md's story);
concat-fixed slices a contiguous copy. Each check that guards the bug is shown to fail on
the buggy tree and to pass on the fixed one.
"""

import json
import math
import re

import jsonschema
import pytest

from pytest_gradgate.report import outputs
from pytest_gradgate.gate.baseline import STALE_TEXT, Baseline, normalise_reason

SQR_ID = "concat_dim1[permute_0213_transpose-sqr-cpu]"
SUM_ID = "concat_dim1[permute_0213_transpose-sum-cpu]"
SQR_KEY = "concat_cases.yaml::" + SQR_ID     # its baseline key: file and case id
CASES = """\
cases:
  # DESIGN.md's gating case (sqr) and its blind SUM-loss twin
  - name: concat_dim1
    params: {a: [4, 3, 5, 1], b: [4, 2, 5, 1]}
    graph: concat(a, b, dim=1)
    consumers: [permute_0213_transpose]
    loss: [sqr, sum]
"""
CASE_LINE = 3   # the line of "- name: concat_dim1" above


@pytest.fixture(autouse=True)
def outside_ci(monkeypatch):
    """The inner runs must not see the outer CI's GitHub or gradgate settings."""
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE", "GRADGATE_GGML_SRC",
                 "GRADGATE_BASELINE", "GRADGATE_JSON", "GRADGATE_CASES", "GRADGATE_HTML", "GRADGATE_BACKEND"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def case_file(pytester):
    return pytester.path / "concat_cases.yaml"


def gate(pytester, root, *args):
    (pytester.path / "concat_cases.yaml").write_text(CASES)
    return pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "--gradgate-cases",
                                         "concat_cases.yaml", "--gradgate-ggml-src", str(root),
                                         "-p", "no:cacheprovider", "-rxX", *args)


def cases_by_id(path):
    return {c["id"]: c for c in json.loads(path.read_text())["cases"]}


def validate(doc):
    jsonschema.validate(doc, json.loads(outputs.REPORT_SCHEMA_FILE.read_text()),
                        cls=jsonschema.Draft202012Validator)


# -- the story: the buggy CONCAT fails the gate, and every output names it ---------------------
@pytest.mark.slow
def test_buggy_concat_fails_the_gate_and_every_output_names_it(pytester, ggml_variant, monkeypatch, case_file):
    root, _ = ggml_variant("concat-buggy")
    summary = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report = pytester.path / "report.json"
    result = gate(pytester, root, "--gradgate-json", str(report))
    assert result.ret == 1
    result.assert_outcomes(failed=1, passed=1)

    doc = json.loads(report.read_text())
    validate(doc)
    assert doc["schema_version"] == 1 and doc["ggml"]["version"] == "0.15.3" and doc["backends"] == ["cpu"]
    assert doc["build"]["options"]["build_type"] == "Release" and doc["machine"]["cpu_count"] >= 1
    case = cases_by_id(report)[SQR_ID]
    assert (case["op"], case["consumer"], case["loss"], case["status"], case["outcome"]) == \
        ("concat", "permute_0213_transpose", "sqr", "failed", "failed")
    assert case["maa"] > 1 and case["maa"] > case["limit"] and case["diagnosis"]
    assert case["origin"] == {"path": str(case_file), "line": CASE_LINE}
    assert cases_by_id(report)[SUM_ID]["status"] == "passed"     # blind: the SUM loss survives the scramble
    maa = f"{case['maa']:.3g}"

    out = result.stdout.str()
    errors = [line for line in out.splitlines() if line.startswith("::error ")]
    # a fork of 0.15.3 starts from upstream's shipped baseline, which does not have this failure
    own = ("not in upstream ggml-0.15.3's known failures (the shipped baseline this tree, which says it is ggml "
           "0.15.3, starts from): the fork's own failure")
    assert errors == [f"::error file={case_file},line={CASE_LINE},title=gradgate%3A {SQR_ID}::"
                      f"{SQR_ID}: {own}: MAA {maa} > {case['limit']:.3g}: " + case["diagnosis"].replace("%", "%25")]

    table = summary.read_text()
    assert "## gradgate: FAILED" in table and f"| `{SQR_ID}` | failed |" in table
    assert f"| {maa} |" in table and case["diagnosis"] in table and SUM_ID not in table

    section = out.split("gradgate failures")[1]
    assert f"{SQR_ID}: {own}: MAA {maa}" in section and case["diagnosis"] in section and SUM_ID not in section.split("blind")[0]


@pytest.mark.slow
def test_fixed_concat_passes_and_prints_no_failure_output(pytester, ggml_variant, monkeypatch):
    """The other side of the test above: with the fix the gate is green and says nothing."""
    root, _ = ggml_variant("concat-fixed")
    summary = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = gate(pytester, root, "--gradgate-json", "r.json")
    assert result.ret == 0
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "::error" not in out and "gradgate failures" not in out
    assert summary.read_text().startswith("## gradgate: passed")
    validate(json.loads((pytester.path / "r.json").read_text()))


# -- the baseline ------------------------------------------------------------------------------
def write_baseline(path, entries):
    path.write_text(json.dumps({"schema": 2, "ggml_version": "0.15.3", "entries": entries}))
    return path


@pytest.mark.slow
def test_new_failure_fails_the_gate_despite_a_baseline(pytester, ggml_variant):
    root, _ = ggml_variant("concat-buggy")
    baseline = write_baseline(pytester.path / "baseline.json", {"concat_cases.yaml::other[none-sqr-cpu]": {"status": "failed",
                                                                                        "reason": "x"}})
    result = gate(pytester, root, "--gradgate-baseline", str(baseline))
    assert result.ret == 1
    result.assert_outcomes(failed=1, passed=1)


@pytest.mark.slow
def test_update_baseline_records_the_failure_and_then_it_is_a_known_xfail(pytester, ggml_variant):
    root, _ = ggml_variant("concat-buggy")
    path = pytester.path / "baseline.json"
    written = gate(pytester, root, "--gradgate-update-baseline", "--gradgate-baseline", str(path),
                   "--gradgate-json", "update.json")
    assert written.ret == 0, written.stdout.str()
    baseline = Baseline.load(path)
    assert set(baseline.entries) == {SQR_KEY}          # the passing twin is not an entry
    entry = baseline.get(SQR_KEY)
    diagnosis = cases_by_id(pytester.path / "update.json")[SQR_ID]["diagnosis"]
    # a fork of 0.15.3: a failure that upstream's shipped baseline lacks is recorded as the fork's own
    assert entry == {"status": "failed", "reason": normalise_reason(diagnosis), "kind": "failed misread",
                     "own": "ggml-0.15.3"} and diagnosis
    assert baseline.ggml_version == "0.15.3"
    assert gate(pytester, root, "--gradgate-baseline", str(path)).ret == 1      # not known until accepted

    entry["reason"] = "known since the fork's CONCAT backward (issue 42)"
    entry["accepted"] = "the fork's CONCAT backward, fixed in the next release"
    write_baseline(path, baseline.entries)
    result = gate(pytester, root, "--gradgate-baseline", str(path), "--gradgate-json", "r.json")
    assert result.ret == 0
    result.assert_outcomes(xfailed=1, passed=1)
    xfail = [line for line in result.stdout.lines if line.startswith("XFAIL ") and SQR_ID in line]
    assert xfail and "known failure (baseline): failed: known since the fork's CONCAT backward (issue 42)" in xfail[0]
    record = cases_by_id(pytester.path / "r.json")[SQR_ID]
    assert (record["outcome"], record["baseline"], record["status"]) == ("xfailed", "known", "failed")


@pytest.mark.slow
def test_stale_baseline_entry_fails_the_gate(pytester, ggml_variant, monkeypatch):
    """A known failure that now passes must leave the baseline (strict xfail)."""
    root, _ = ggml_variant("concat-fixed")
    monkeypatch.setenv("GRADGATE_BASELINE", str(write_baseline(
        pytester.path / "baseline.json", {SQR_KEY: {"status": "failed", "reason": "CONCAT scrambles views"}})))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = gate(pytester, root, "--gradgate-json", "r.json")
    assert result.ret == 1
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert f"{SQR_ID}: passes now" in out and STALE_TEXT in out
    assert re.search(rf"^::error file=.*title=gradgate%3A {re.escape(SQR_ID)}::.*{STALE_TEXT}", out, re.M)
    record = cases_by_id(pytester.path / "r.json")[SQR_ID]
    assert (record["status"], record["outcome"], record["baseline"]) == ("passed", "failed", "stale")


def test_baseline_errors_name_the_file(pytester, default_ggml, tmp_path):
    missing = tmp_path / "nope.json"
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "--gradgate-baseline", str(missing))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*baseline {missing}: no such file*--gradgate-update-baseline*"])
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": []}')
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "--gradgate-baseline", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*baseline {bad}: expected*schema*"])


def test_update_baseline_needs_a_file_unless_the_source_is_the_default(pytester, default_ggml):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "--gradgate-update-baseline", "--gradgate-ggml-src", str(default_ggml))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gradgate-update-baseline: name the file to write with --gradgate-baseline*"])


def test_default_ggml_is_green_with_the_shipped_baseline(pytester, default_build):
    """Done-when: `pytest --gradgate` on the pinned default exits 0, upstream's gaps as xfails.
    Fails whenever the built-in suite and baseline_default.json disagree (regenerate it)."""
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("--gradgate", "-p", "no:cacheprovider", "-q", "--gradgate-json",
                                           str(report))
    assert result.ret == 0, result.stdout.str()[-3000:]
    doc = json.loads(report.read_text())
    validate(doc)
    assert doc["baseline"].endswith("baseline_default.json")
    shipped = Baseline.load(doc["baseline"])
    known = {c["nodeid"] for c in doc["cases"] if c["outcome"] == "xfailed"}
    assert known == set(shipped.entries)
    # crashes are counted apart from wrong gradients (the summary, by pytest outcome, folds them
    # together); consumers that fail on their own are neither
    statuses = doc["statuses"]
    assert statuses["crashed"] > 0 and statuses["failed"] > 0 and statuses["consumer-failed"] == 6
    assert sum(statuses.values()) == sum(doc["summary"].values()) == len(doc["cases"])


@pytest.mark.slow
def test_the_newest_ggml_is_green_with_its_shipped_baseline(pytester, newest_ggml):
    """The second pinned source, chosen by its short name: ggml 0.26.0 builds, runs the whole
    built-in suite, and its known failures are exactly its shipped baseline."""
    from pytest_gradgate.library.cmake import ensure_build
    from pytest_gradgate.library.options import BuildOptions
    ensure_build(newest_ggml, BuildOptions())     # built once per machine, outside the timed run
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-ggml-src", "ggml-0.26.0", "-p",
                                           "no:cacheprovider", "-q", "--gradgate-json", str(report))
    assert result.ret == 0, result.stdout.str()[-3000:]
    doc = json.loads(report.read_text())
    assert doc["ggml"]["version"] == "0.26.0" and doc["baseline"].endswith("baseline_ggml-0.26.0.json")
    known = {c["nodeid"] for c in doc["cases"] if c["outcome"] == "xfailed"}
    assert known == set(Baseline.load(doc["baseline"]).entries)


@pytest.mark.slow
def test_json_report_under_xdist_has_every_workers_cases(pytester, ggml_variant):
    root, _ = ggml_variant("concat-buggy")
    result = gate(pytester, root, "-n", "2", "--gradgate-json", "r.json")
    assert result.ret == 1
    assert set(cases_by_id(pytester.path / "r.json")) == {SQR_ID, SUM_ID}


WIRE_PLUGIN = """
import json
seen = []

def pytest_configure(config):
    seen.append(config)

def pytest_runtest_logreport(report):
    config = seen[0]
    if getattr(report, "gradgate_result", None) is None:
        return
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    # what crosses pytest-xdist's channel: plain data
    back = config.hook.pytest_report_from_serializable(config=config, data=json.loads(json.dumps(data)))
    seen.append([type(data["gradgate_result"]).__name__, back.gradgate_result == report.gradgate_result])

def pytest_sessionfinish(session):
    open("wire.json", "w").write(json.dumps(seen[1:]))
"""


def test_a_result_crosses_xdists_channel_as_one_string_and_arrives_whole(pytester, default_ggml):
    """pytest-xdist serializes each report field by field, value by value: the result goes as
    one JSON string instead, and the controller's report holds the same dict again."""
    pytester.makepyfile(wire_plugin=WIRE_PLUGIN)
    (pytester.path / "one.yaml").write_text("cases:\n  - name: one\n    graph: add(a, b)\n"
                                            "    params: {a: [4, 3], b: [4, 3]}\n    consumers: [none, transpose]\n")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "--gradgate-cases", "one.yaml",
                                           "--gradgate-ggml-src", str(default_ggml), "-p", "wire_plugin",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    assert json.loads((pytester.path / "wire.json").read_text()) == [["str", True], ["str", True]]


# -- the output formats, as plain functions -----------------------------------------------------
def test_json_report_turns_non_finite_floats_into_valid_json():
    """test-backend-ops lets MAA = NaN pass; our report keeps it, as a string JSON can hold."""
    record = {"case_id": "silu[none-sqr-cpu]", "name": "silu", "op": "silu", "consumer": "none", "loss": "sqr",
              "backend": "cpu", "status": "failed", "outcome": "failed", "phase": "done", "maa": math.nan,
              "max_maa": 1e-4, "limit": math.inf, "cosine": -math.inf, "power": True, "diagnosis": "d",
              "message": "m", "origin": {"path": "c.yaml", "line": 3},
              "params": [{"name": "a", "maa": math.nan, "analytic_values": [1.0] * 100}]}
    doc = outputs.report([record], exitstatus=1)
    text = json.dumps(doc, allow_nan=False)          # raises on NaN/Infinity
    validate(json.loads(text))
    case = doc["cases"][0]
    assert (case["maa"], case["limit"], case["cosine"]) == ("nan", "inf", "-inf")
    assert "analytic_values" not in case["params"][0]


def test_annotations_escape_what_github_would_misread(tmp_path):
    record = {"case_id": "a,b[none-sqr-cpu]", "status": "crashed", "outcome": "failed", "phase": "compute",
              "maa": None, "diagnosis": "100% dead\nline two", "origin": {"path": str(tmp_path / "x.yaml"),
                                                                           "line": 7}}
    passed = dict(record, case_id="ok", outcome="passed")
    known = dict(record, case_id="known", outcome="xfailed")
    lines = outputs.annotations([record, passed, known], workspace=str(tmp_path))
    assert lines == ["::error file=x.yaml,line=7,title=gradgate%3A a%2Cb[none-sqr-cpu]::"
                     "a,b[none-sqr-cpu]: crashed in phase compute: 100%25 dead%0Aline two"]


def test_baseline_reasons_do_not_depend_on_where_ggml_was_built():
    line = "ggml aborted in phase compute: /tmp/dl/x-0.0.45/vendor/ggml/src/ggml-cpu/ops.cpp:1841: GGML_ASSERT(a) failed"
    assert normalise_reason(line) == "ggml aborted in phase compute: ggml-cpu/ops.cpp:1841: GGML_ASSERT(a) failed"
    # a build that shares objects between copies of one tree compiles it as ggml/src/...
    shared = "ggml aborted in phase compute: ggml/src/ggml-cpu/ops.cpp:1841: GGML_ASSERT(a) failed"
    assert normalise_reason(shared) == "ggml aborted in phase compute: ggml-cpu/ops.cpp:1841: GGML_ASSERT(a) failed"
    cuda = "ggml aborted in phase compute: ../ggml-source/src/ggml-cuda/binbcast.cu:12: GGML_ASSERT(a) failed"
    assert normalise_reason(cuda) == "ggml aborted in phase compute: ggml-cuda/binbcast.cu:12: GGML_ASSERT(a) failed"


def test_an_invalid_case_is_annotated_at_its_line_on_github_actions(pytester, default_build, monkeypatch):
    """Verified to fail with the feature removed: without the invalid-case annotations the
    run prints no `::error` line for the bad declaration (only the valid case's outcome)."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    (pytester.path / "gradgate_bad.yaml").write_text(
        "cases:\n"
        "  - name: fine\n"
        "    params: {a: [4, 3]}\n"
        "    graph: sqr(a)\n"
        "    consumers: [none]\n"
        "  - name: typo\n"
        "    params: {a: [4, 3]}\n"
        "    graph: sqrr(a)\n")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "gradgate_bad.yaml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["::error file=*gradgate_bad.yaml,line=8,title=gradgate%3A invalid case::"
                                 "invalid case: *unknown op 'sqrr'*"])
