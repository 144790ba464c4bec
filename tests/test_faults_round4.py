"""Faults and bad input, round 4: each through the real plugin or command, each seen failing
against the code before its fix (the docstring says what it showed)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pytest_gradgate.gate.baseline import Baseline
# the cases, the case file writer and the autouse fixture that keeps CI's variables out, as round 3 has them
from test_faults import CRASHING, PASSING, case_file, outside_ci  # noqa: F401  (outside_ci: autouse)


def gate_command(*args):
    return [sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
            "-q", *args]


# -- row 2: concurrent recordings into one baseline -------------------------------------------
def test_concurrent_baseline_updates_each_keep_their_entries(tmp_path, default_build):
    """Before: six runs recording into one baseline at once all renamed baseline.json.tmp;
    some failed on the rename, the others exited 0, and the file held one run's entry."""
    baseline = tmp_path / "baseline.json"
    runs = []
    for i in range(6):
        case_file(tmp_path / f"gradgate_run{i}.yaml", f"crash{i}", CRASHING)
        runs.append(subprocess.Popen(
            gate_command(f"gradgate_run{i}.yaml", "--gradgate-update-baseline", "--gradgate-baseline",
                         str(baseline)),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0] * 6, "\n".join(outputs)
    assert set(Baseline.load(baseline).entries) == {f"gradgate_run{i}.yaml::crash{i}[none-sqr-cpu]"
                                                    for i in range(6)}
    assert sorted(p.name for p in tmp_path.iterdir() if "baseline" in p.name) == ["baseline.json"]


# -- rows 3, 4 and 18: a newline in any field never starts a line of its own ------------------
INJECTED = "x\n::error file=x.yaml,line=1::INJECTED"


def _forged_commands(text):
    """Output lines that GitHub's runner would take as workflow commands, less the gate's own
    annotations (which carry title=gradgate...)."""
    return [line for line in text.splitlines()
            if line.lstrip().startswith("::") and "title=gradgate" not in line.split("::")[1]]


def test_a_newline_in_any_field_never_becomes_a_workflow_command(pytester, default_build, monkeypatch):
    """Before: a vary value's newline was printed raw inside the invalid-case error, and the line
    after it was `::error file=x.yaml,line=1::INJECTED`, an annotation of the case file's making;
    a case file whose name held a newline was not collected at all (its failing case never ran,
    the run was green)."""
    import yaml
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    base = {"params": {"a": [4, 3]}, "graph": "sqr(a)", "consumers": ["none"]}
    fields = [dict(base, name="vary_value", vary={"tag": [INJECTED]}),
              dict(base, name="graph_op", graph=f"{INJECTED}(a)"),
              dict(base, name="consumer", consumers=[INJECTED]),
              dict(base, name="loss", loss=[INJECTED]),
              dict(base, name="param_name", params={INJECTED: [2]}),
              dict(base, name="unknown_key", **{INJECTED: 1}),
              dict(base, name=INJECTED),
              dict(base, name="init", init={"a": INJECTED}),
              dict(base, name="backends", backends=[INJECTED]),
              dict(base, name="description", description=INJECTED)]
    (pytester.path / "gradgate_fields.yaml").write_text(yaml.safe_dump({"cases": fields}))
    (pytester.path / f"gradgate_{INJECTED}.yaml").write_text("cases:\n  - name: crash\n" + CRASHING)
    (pytester.path / "gradgate_a\x01b.yaml").write_text("cases:\n  - name: ok\n" + PASSING)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "-rA", ".", "--gradgate-json", "r.json", "--junitxml", "j.xml")
    out = result.stdout.str() + result.stderr.str()
    assert _forged_commands(out) == []
    assert result.ret == 1
    # row 19: the ids pytest's JUnit file takes its names from print on one line, and it parses
    import xml.etree.ElementTree as ET
    names = {case.get("classname") for case in ET.parse(pytester.path / "j.xml").iter("testcase")}
    assert "gradgate_a\\x01b.yaml" in names, names
    report = json.loads((pytester.path / "r.json").read_text())
    invalid = report["invalid_cases"]
    assert len(invalid) == 11 and all("\n" not in bad["message"] for bad in invalid), invalid
    named = sorted(bad["path"] for bad in invalid if "control character" in bad["message"])
    assert len(named) == 2 and named[1].endswith("gradgate_x\\n::error file=x.yaml,line=1::INJECTED.yaml")
    assert named[0].endswith("gradgate_a\\x01b.yaml")
    assert report["statuses"] == {"passed": 1}      # `description` is text, never printed: its case runs

    # row 18: --gradgate-ggml-src (and gradgate build --ggml-src) echoed on one line
    src = pytester.path / f"src{INJECTED}"
    src.mkdir()
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "--gradgate-ggml-src", str(src))
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "is neither a ggml checkout" in err
    assert _forged_commands(err + result.stdout.str()) == []
    build = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", str(src)],
                           capture_output=True, text=True)
    assert build.returncode == 2 and _forged_commands(build.stderr) == [] and "src x\\n" not in build.stderr
    assert "srcx\\n::error" in build.stderr


# -- row 8: --ggml-src values that are no path ---------------------------------------------
@pytest.mark.parametrize("value, expected", [("a" * 5000, "cannot be a ggml source: File name too long"),
                                             ("", "an empty value; give a ggml or llama.cpp checkout")],
                         ids=["5000-chars", "empty"])
def test_a_ggml_src_that_is_no_path_is_one_usage_line(value, expected):
    """Before: a 5,000-character path was a traceback (OSError: File name too long), and an
    empty --ggml-src silently meant the default ggml, which was then built."""
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


# -- rows 6, 11, 12, 13: numbers out of range are refused at their keys' lines -------------------
OUT_OF_RANGE = """\
cases:
  - name: eps_list
    params: {a: [4, 3]}
    graph: sqr(a)
    eps: [0.1]
  - name: big_timeout
    params: {a: [4, 3]}
    graph: sqr(a)
    timeout: 1.0e+300
  - name: big_seed
    params: {a: [4, 3]}
    graph: sqr(a)
    seed: 18446744073709551616
  - name: big_threads
    params: {a: [4, 3]}
    graph: sqr(a)
    threads: 2147483648
  - name: big_directions
    params: {a: [4, 3]}
    graph: sqr(a)
    mode: fast
    directions: 1000000000000
  - name: infinite_init
    params: {a: [4, 3]}
    graph: sqr(a)
    init: {a: [0, .inf]}
  - name: fine
    params: {a: [4, 3]}
    graph: sqr(a)
    consumers: [none]
"""


def test_numbers_out_of_range_are_refused_at_their_keys_lines(pytester, default_build):
    """Before: eps [0.1] was `invalid case (TypeError: float() argument ...)` at the case's first
    line; timeout 1e300 an OverflowError in the parent; seed 2^64 passed (and an exported test's
    std::mt19937 could not take it); threads 2^31, directions 1e12 and init [0, inf] ended as
    worker tracebacks."""
    (pytester.path / "gradgate_ranges.yaml").write_text(OUT_OF_RANGE)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           ".", "--gradgate-json", "r.json")
    report = json.loads((pytester.path / "r.json").read_text())
    messages = {bad["line"]: bad["message"] for bad in report["invalid_cases"]}
    assert messages == {
        5: "'eps' must be a positive number, got [0.1]",
        9: "'timeout' must be a positive number up to 86400, got 1e+300",
        13: "'seed' must be an integer from 0 to 4294967295, got 18446744073709551616",
        17: "'threads' must be an integer from 1 to 512, got 2147483648",
        22: "'directions' must be an integer from 1 to 10000, got 1000000000000",
        26: "param 'a': init must be [lo, hi] (uniform) or {abs: [lo, hi]} (uniform magnitude, random sign), "
            "lo < hi, both finite numbers within +-1e+30; got [0, inf]"}
    assert report["statuses"] == {"passed": 1} and result.ret == 1


def test_the_timeout_option_has_a_ceiling(pytester, default_build):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "--gradgate-timeout", "1e300")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gradgate-timeout: '1e+300' is above 86400*"])


def test_a_parent_side_failure_is_charged_to_its_own_case(default_build):
    """Before: a case whose wait overflowed the clock raised OverflowError in the parent while
    its worker went on, and the next case was blamed: "the worker process died". (The loader
    now refuses such a timeout; the Runner is given one directly, as a bug of ours could.)"""
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import Runner
    runner = Runner(default_build.library, isolate="case")
    try:
        broken = runner.run(Case(name="huge_wait", graph="sqr(a)", params={"a": [4, 3]}, timeout=1e300))
        after = runner.run(Case(name="after", graph="sqr(a)", params={"a": [4, 3]}))
    finally:
        runner.close()
    assert broken.status == "error" and "the gate failed while it waited for this case" in broken.message
    assert "OverflowError" in broken.message
    assert after.status == "passed", after.to_dict()


# -- rows 7 and 16: a file-wide YAML error is at a line that exists, and comes at once ---------
def _alias_bomb():
    """Nine levels of nine aliases: 480 bytes that stand for 9^9 values. `vary` makes the
    loader walk the case's values once per combination."""
    lines = ["cases:", "  - name: bomb", "    params: {a: [2]}", "    graph: sqr(a)", "    vary: {k: [1]}",
             "    description:", '      - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for name, previous in zip("bcdefghi", "abcdefgh"):
        lines.append(f"      - &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, line, expected", [
    ("cases:\n  - name: x\n    description: " + "[" * 5000 + "\n", 3, "nests collections deeper than 100 levels"),
    ("cases:\n  - name: x\n    params: {a: [2]}\n    graph: sqr(a)\n    description: "
     + "[" * 100000 + "]" * 100000 + "\n", 5, "nests collections deeper than 100 levels"),
    (_alias_bomb(), 13, "aliases (*name) expand to more than 1,000,000 values"),
], ids=["unclosed", "100000-deep", "alias-bomb"])
def test_a_monstrous_yaml_is_one_error_at_a_line_and_the_rest_runs(pytester, default_build, text, line, expected):
    """Before: an unclosed 5,000-deep list was item `line0[invalid]`, its header `ERROR at setup of
    invalid case at line None`; a 100,000-deep one crashed libyaml's composer (a segfault: the
    whole pytest run died, no report); the alias bomb kept collection busy for minutes."""
    (pytester.path / "gradgate_monster.yaml").write_text(text)
    case_file(pytester.path / "gradgate_good.yaml", "good", PASSING)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", "-rE",
                                           ".", "--gradgate-json", "r.json", timeout=120)
    out = result.stdout.str()
    assert f"gradgate_monster.yaml::line{line}[invalid]" in out and "line None" not in out
    assert f"ERROR at setup of invalid case at line {line}" in out
    invalid = json.loads((pytester.path / "r.json").read_text())["invalid_cases"]
    assert [(bad["line"], expected in bad["message"]) for bad in invalid] == [(line, True)]
    result.assert_outcomes(passed=1, errors=1)


# -- rows 9, 14, 15: reports ----------------------------------------------------------------
@pytest.mark.parametrize("options", [("--gradgate-json", "out.xml", "--junitxml", "out.xml"),
                                     ("--gradgate-html", "r/../out.html", "--gradgate-json", "out.html"),
                                     ("--gradgate-json", "b.json", "--gradgate-baseline", "b.json")],
                         ids=["json-junit", "html-json", "json-baseline"])
def test_two_outputs_on_one_path_are_a_usage_error(pytester, options):
    """Before: rc 0, and one report silently replaced the other."""
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    named = {options[0], options[2]}
    line = next(line for line in result.stderr.lines if "name one file" in line)
    assert all(option in line for option in named) and "each output needs its own path" in line


def test_a_report_that_cannot_be_put_in_place_leaves_no_temp_file(pytester, default_build):
    """Before: with the HTML target a folder (os.replace fails) the run said so, and its temp
    file .gradgate-XXXX.html stayed behind; the JSON's temp file named out.json.tmp too."""
    case_file(pytester.path / "gradgate_ok.yaml", "ok", PASSING)
    (pytester.path / "out.html").mkdir()
    (pytester.path / "out.json").mkdir()
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", ".",
                                           "--gradgate-html", "out.html", "--gradgate-json", "out.json")
    out = result.stdout.str()
    assert "could not write the HTML report" in out and "could not write the JSON report" in out
    assert result.ret == 1
    left = [p.name for p in pytester.path.iterdir() if "tmp" in p.name or p.name.startswith(".gradgate")]
    assert left == [], left


def test_a_killed_run_leaves_no_report_of_an_earlier_run(pytester, default_build):
    """Before: SIGTERM during a run left the previous run's green JSON, HTML and JUnit files in
    place, indistinguishable from this run's."""
    import signal
    import time
    case_file(pytester.path / "gradgate_ok.yaml", "ok", PASSING)
    # a case that runs for seconds: 16,384 elements, each with four forwards
    (pytester.path / "gradgate_slow.yaml").write_text(
        "cases:\n  - name: slow\n    params: {a: [128, 128]}\n    graph: sqr(a)\n    consumers: [none]\n")
    reports = ("--gradgate-json", "r.json", "--junitxml", "j.xml")
    first = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                          "gradgate_ok.yaml", *reports)
    assert first.ret == 0 and (pytester.path / "r.json").is_file() and (pytester.path / "j.xml").is_file()
    proc = subprocess.Popen(gate_command("gradgate_slow.yaml", *reports), cwd=pytester.path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while (pytester.path / "r.json").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert not (pytester.path / "r.json").exists() and not (pytester.path / "j.xml").exists()


# -- row 10: a case that cannot fit in memory is refused at collection --------------------------
def test_a_case_too_big_for_the_machine_or_the_cap_is_refused_at_its_line(pytester, default_build):
    """Before: a 40 GB fast-mode case was collected and ended as `MemoryError: Unable to allocate
    74.5 GiB` in the worker; under --gradgate-max-memory 1G a 3.6 GB case ended as a raw MemoryError."""
    (pytester.path / "gradgate_machine.yaml").write_text(
        "cases:\n  - name: fine\n    params: {a: [4, 3]}\n    graph: sqr(a)\n    consumers: [none]\n"
        "  - name: forty_gb\n    params: {a: [100000, 100000]}\n    graph: sqr(a)\n    mode: fast\n")
    (pytester.path / "gradgate_cap.yaml").write_text(
        "cases:\n  - name: three_gb\n    params: {a: [30000, 30000]}\n    graph: sqr(a)\n    mode: fast\n")
    machine = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                            "gradgate_machine.yaml", "--gradgate-json", "m.json")
    capped = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "gradgate_cap.yaml", "--gradgate-max-memory", "1G", "--gradgate-json",
                                           "c.json")
    m, c = (json.loads((pytester.path / name).read_text()) for name in ("m.json", "c.json"))
    [(line, message)] = [(bad["line"], bad["message"]) for bad in m["invalid_cases"]]
    assert line == 6 and message.startswith("case 'forty_gb': needs at least 111.8 GiB (12 bytes for each of its "
                                            "10,000,000,000 param elements") and "this machine has" in message
    assert m["statuses"] == {"passed": 1} and machine.ret == 1
    [(line, message)] = [(bad["line"], bad["message"]) for bad in c["invalid_cases"]]
    assert line == 2 and "needs at least 10.1 GiB" in message
    assert "more than the 1.0 GiB --gradgate-max-memory allows" in message and capped.ret == 1
    assert "MemoryError" not in machine.stdout.str() + capped.stdout.str()


# -- row 17: an underflowing case is inconclusive, never a pass --------------------------------
def test_a_case_whose_loss_underflows_is_inconclusive_not_a_pass(run_on, runner):
    """Before: SCALE's backward with the wrong sign for s < 0 (the scale-negative variant) at
    s = -1e-20 `passed (MAA 0): blind`: the SQR loss, 1e-40 times the inputs, underflowed and
    every element was zero on both sides."""
    from pytest_gradgate.declare.case import Case
    tiny = Case(name="tiny", graph="scale(a, s=-1e-20)", params={"a": [4, 3]})
    normal = Case(name="normal", graph="scale(a, s=-0.5)", params={"a": [4, 3]})
    for result in (run_on("scale-negative", tiny), runner.run(tiny)):
        assert result.status == "inconclusive", result.to_dict()
        assert "the loss is" in result.diagnosis and "below float32's smallest normal number" in result.diagnosis
    assert run_on("scale-negative", normal).status == "failed"    # the same bug at a scale that shows it
    assert runner.run(normal).status == "passed"


# -- row 5: a step across a pole is numeric-unreliable, never a red that blames the op -------------
def test_a_step_across_a_pole_is_numeric_unreliable_not_a_blamed_backward(runner, run_on):
    """Before: div(a, b) with b in +-[1e-5, 1e-4] at the default step 0.1 was `values disagree
    (cosine 0.000, norm ratio inf)`, MAA 1, blaming DIV's correct backward: L(b+h) and L(b-h)
    are nearly equal, so the central differences are 0 at h and at h/2 alike, and halving the
    step moved nothing. The loss's even part around b, which does not shrink with the step
    across a pole, shows it."""
    from pytest_gradgate.declare.case import Case
    pole = Case(name="pole", graph="div(a, b)", params={"a": [4, 3], "b": [4, 3]},
                init={"b": {"abs": [1e-5, 1e-4]}}, alloc="own")
    result = runner.run(pole)
    assert result.status == "numeric-unreliable", result.to_dict()
    assert result.diagnosis.startswith("b: numeric gradient unreliable at 12 of 12 elements")
    # the same check leaves a wrong backward blamed where the loss is smooth
    wrong = run_on("sub-sign", Case(name="sign", graph="sub(a, b)", params={"a": [4, 3], "b": [4, 3]}, alloc="own"))
    assert wrong.status == "failed" and all(p.get("numeric_unreliable") is None for p in wrong.params)


@pytest.mark.parametrize("loss, x, expected", [
    (lambda v: (1.0 / v) ** 2, 5e-5, True),          # a pole inside the step: even part ~ the same at h and h/2
    (lambda v: np.where(v > 0, 1.0, 0.0), 0.01, True),  # a jump
    (lambda v: v ** 4, 0.01, False),                  # smooth, its h^4 term dominating: 16-fold
    (lambda v: np.cos(3 * v), 0.2, False),            # smooth, 4-fold
    (lambda v: np.exp(v), 1.0, False),
], ids=["pole", "jump", "quartic", "cos", "exp"])
def test_the_even_part_shrinks_fourfold_where_the_loss_is_smooth(loss, x, expected):
    from pytest_gradgate.check.reliability import even_part_diverges
    h = 0.1
    even = [loss(x + s) + loss(x - s) - 2 * loss(x) for s in (h, h / 2)]
    slope = (loss(x + h) - loss(x - h)) / (2 * h)
    assert bool(even_part_diverges([even[0]], [even[1]], [slope], h, roundoff=1e-9)[0]) is expected
