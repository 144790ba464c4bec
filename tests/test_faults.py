"""Faults and bad input through the real plugin: each one clear line at its file, case or
option, nothing else lost, and never a green gate that should be red.

Every test here was run against the code before its fix; its docstring says what it showed.
"""

import json

import pytest

from pytest_gradgate.gate.baseline import Baseline

# add1 with a 3-D a crashes in build-backward on ggml 0.15.3 (a known failure of the
# shipped baseline); sqr passes: a failing and a passing case on the default ggml
CRASHING = "    params: {a: [4, 3, 2], b: [1]}\n    graph: add1(a, b)\n    consumers: [none]\n"
PASSING = "    params: {a: [4, 3]}\n    graph: sqr(a)\n    consumers: [none]\n"


@pytest.fixture(autouse=True)
def outside_ci(monkeypatch):
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE", "GRADGATE_GGML_SRC",
                 "GRADGATE_BASELINE", "GRADGATE_JSON", "GRADGATE_CASES", "GRADGATE_HTML", "GRADGATE_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def case_file(path, name, body):
    path.write_text(f"cases:\n  - name: {name}\n{body}")
    return path


def outcomes(report):
    return {c["nodeid"]: c["outcome"] for c in json.loads(report.read_text())["cases"]}


def run_gate(pytester, *args):
    return pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                         "-rxX", ".", *args)


# -- 1. the baseline identifies a case by its file, not by its name alone --------------------
def test_a_baseline_entry_does_not_cover_a_same_named_case_of_another_file(pytester, default_build):
    """Before the fix (entries keyed by case id alone): b.yaml's new crash of `twin` was an
    XFAIL "known failure (baseline)" and c.yaml's passing `twin` a stale entry, on every run."""
    case_file(pytester.path / "gradgate_a.yaml", "twin", CRASHING)
    baseline = pytester.path / "baseline.json"
    written = run_gate(pytester, "--gradgate-update-baseline", "--gradgate-baseline", str(baseline))
    assert written.ret == 0, written.stdout.str()
    assert set(Baseline.load(baseline).entries) == {"gradgate_a.yaml::twin[none-sqr-cpu]"}

    case_file(pytester.path / "gradgate_b.yaml", "twin", CRASHING)   # a new failure
    case_file(pytester.path / "gradgate_c.yaml", "twin", PASSING)    # a passing twin
    result = run_gate(pytester, "--gradgate-baseline", str(baseline), "--gradgate-json", "r.json")
    assert outcomes(pytester.path / "r.json") == {"gradgate_a.yaml::twin[none-sqr-cpu]": "xfailed",
                                                  "gradgate_b.yaml::twin[none-sqr-cpu]": "failed",
                                                  "gradgate_c.yaml::twin[none-sqr-cpu]": "passed"}
    assert result.ret == 1


def test_a_users_case_named_like_a_builtin_does_not_inherit_the_shipped_baseline(pytester, default_build):
    """Before the fix: a user's crashing `add1` was XFAIL through the shipped baseline's
    entry for the built-in add1, and the gate exited 0."""
    case_file(pytester.path / "gradgate_mine.yaml", "add1", CRASHING)
    result = run_gate(pytester, "--gradgate-json", "r.json")
    assert outcomes(pytester.path / "r.json") == {"gradgate_mine.yaml::add1[none-sqr-cpu]": "failed"}
    assert result.ret == 1


def test_update_baseline_rewrites_an_unreadable_or_old_baseline(pytester, default_build):
    """Before: a corrupt baseline with --gradgate-update-baseline was a usage error that
    advised --gradgate-update-baseline, the very flag given. A schema 1 file (keyed by case
    name alone) is refused without the flag, with the command that rewrites it (before: used)."""
    case_file(pytester.path / "gradgate_a.yaml", "twin", CRASHING)
    baseline = pytester.path / "baseline.json"
    baseline.write_text('{"entries": [')
    written = run_gate(pytester, "--gradgate-update-baseline", "--gradgate-baseline", str(baseline))
    assert written.ret == 0, written.stdout.str() + written.stderr.str()
    written.stdout.fnmatch_lines(["*not a readable JSON file*rewritten from this run's results alone*"])
    assert set(Baseline.load(baseline).entries) == {"gradgate_a.yaml::twin[none-sqr-cpu]"}

    baseline.write_text(json.dumps({"schema": 1, "entries": {"twin[none-sqr-cpu]": {"status": "crashed"}}}))
    refused = run_gate(pytester, "--gradgate-baseline", str(baseline))
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"*baseline {baseline}: schema 1 keys entries by case name alone*"
                                  "--gradgate-update-baseline*"])


# -- 2. one bad file, or one monstrous case, is one error; the rest run ---------------------
def test_a_non_utf8_file_and_a_100000_term_expression_are_one_error_each(pytester, default_build):
    """Before: the byte 0xff was a UnicodeDecodeError and the 100,000-term sum a
    RecursionError at collection: "Interrupted: 2 errors during collection", rc 2, and not
    one case ran."""
    (pytester.path / "gradgate_bytes.yaml").write_bytes(
        b"cases:\n  - name: latin1\n    description: caf\xe9\n" + PASSING.encode())
    huge = " + ".join(["a"] * 100_000)
    (pytester.path / "gradgate_huge.yaml").write_text(
        f"cases:\n  - name: fine\n{PASSING}  - name: huge\n    params: {{a: [2]}}\n    graph: {huge}\n")
    case_file(pytester.path / "gradgate_good.yaml", "good", PASSING)
    result = run_gate(pytester, "-rE", "--junitxml", "j.xml")
    result.assert_outcomes(passed=2, errors=2)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["invalid case: */gradgate_bytes.yaml:3: not UTF-8 text: byte 0xe9*UTF-8",
                                 "invalid case: */gradgate_huge.yaml:8: graph expression 'a + a *"
                                 "(399997 characters)' is too long*"])
    # the expression is not echoed in full, neither on the terminal nor in JUnit
    assert len(result.stdout.str()) < 20_000 and (pytester.path / "j.xml").stat().st_size < 20_000


# -- 3. a failed build shows the compiler's error -----------------------------------------
@pytest.mark.slow
def test_a_failed_build_shows_the_compilers_error_and_keeps_it_in_the_log(default_ggml, pytester, tmp_path,
                                                                          monkeypatch):
    """Before the fix: the log was copied while its last writes were still in the file
    object's buffer: the failure text ended at `FAILED: ...vec.cpp.o`, and neither it nor
    the kept log said "boom"."""
    from pytest_gradgate.library.source import copy_tree
    broken = copy_tree(default_ggml, tmp_path / "ggml")
    vec = broken / "src" / "ggml-cpu" / "vec.cpp"
    vec.write_text("#error boom\n" + vec.read_text())
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))
    case_file(pytester.path / "gradgate_one.yaml", "twin", PASSING)
    result = run_gate(pytester, "--gradgate-ggml-src", str(broken))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    result.stdout.fnmatch_lines([f"gradgate: CMake build of ggml at {broken} failed: *vec.cpp:1:*error: *boom*"])
    logs = list((tmp_path / "cache" / "builds" / "failed").glob("*.log"))
    assert len(logs) == 1 and "#error boom" in logs[0].read_text(), out[-3000:]
    assert "Traceback" not in out and "another exception occurred" not in out


# -- 4. a clear line, not an INTERNALERROR --------------------------------------------------
def in_own_mounts(pytester, mount, *pytest_args):
    """Run the gate in a private mount namespace with `mount` (a shell command) done first,
    so a read-only or full file system is real, and nothing outside the test sees it."""
    import shlex
    import shutil
    import subprocess
    import sys
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare (a user and mount namespace) for a real read-only or full mount")
    args = [sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", ".",
            *pytest_args]
    return pytester.run("unshare", "-rm", "sh", "-c", f"{mount} && exec {shlex.join(args)}", timeout=600)


@pytest.mark.parametrize("mount, says", [
    ("mount -t tmpfs -o ro,size=1m none \"$GRADGATE_CACHE_DIR\"", "Read-only file system"),
    ("mount -t tmpfs -o size=300k none \"$GRADGATE_CACHE_DIR\"", "No space left on device"),
])
@pytest.mark.slow
def test_a_cache_that_cannot_be_written_is_one_line(pytester, default_ggml, tmp_path, monkeypatch, mount, says):
    """Before the fix: INTERNALERROR> OSError: [Errno 30] Read-only file system (a read-only
    cache), or [Errno 28] No space left on device (a full one), and no JSON report."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache))
    case_file(pytester.path / "gradgate_one.yaml", "one", PASSING)
    result = in_own_mounts(pytester, mount, "--gradgate-ggml-src", str(default_ggml), "--gradgate-json", "r.json")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:] + result.stderr.str()[-3000:]
    assert "INTERNALERROR" not in out + result.stderr.str()
    result.stdout.fnmatch_lines([f"gradgate: *ggml*{says}*GRADGATE_CACHE_DIR*"])
    assert (pytester.path / "r.json").is_file()


@pytest.mark.parametrize("corrupt", ["{", "[]", "{}"])
def test_a_corrupt_build_info_is_no_build(default_ggml, default_build, tmp_path, monkeypatch, corrupt):
    """Before: JSONDecodeError, AttributeError on [] and KeyError on {} from find_build (and
    from every run on that cache entry); now such an entry is not a build, and is rebuilt."""
    from pytest_gradgate.library.cmake import BUILD_INFO, BuildOptions, find_build
    import shutil
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "builds" / default_build.path.name
    shutil.copytree(default_build.path, entry)
    assert find_build(default_ggml, BuildOptions()).path == entry
    (entry / BUILD_INFO).write_text(corrupt)
    assert find_build(default_ggml, BuildOptions()) is None


@pytest.mark.slow
def test_a_corrupt_build_info_is_rebuilt_by_the_gate(pytester, default_ggml, default_build, tmp_path,
                                                    monkeypatch):
    """Before: INTERNALERROR> json.decoder.JSONDecodeError; now the entry is rebuilt."""
    import shutil
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache))
    entry = cache / "builds" / default_build.path.name
    shutil.copytree(default_build.path, entry)
    (entry / "build-info.json").write_text('{"options": ')
    case_file(pytester.path / "gradgate_one.yaml", "one", PASSING)
    result = run_gate(pytester, "--gradgate-ggml-src", str(default_ggml))
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["gradgate: Release build for cpu (built in * s): *"])
    assert json.loads((entry / "build-info.json").read_text())["options"]["build_type"] == "Release"


@pytest.mark.parametrize("value", ["infG", "nanM", "1e30G", "-1"])
def test_an_impossible_memory_cap_is_a_usage_error(pytester, value):
    """Before: infG was INTERNALERROR> OverflowError, and 1e30G made every case crash with
    OverflowError from setrlimit."""
    result = run_gate(pytester, f"--gradgate-max-memory={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gradgate-max-memory: '{value}' is not a valid value*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# -- 5. the ggml context holds every op of a one-line graph ---------------------------------
def test_deeply_nested_one_line_graphs_run(pytester, default_build):
    """Before: the context was sized by graph lines, so one line of 15 nested sin(mul(...))
    aborted with "not enough space in the context's memory pool" and 100 nested neg
    segfaulted, both reported as ggml crashes in build-backward."""
    sin_mul, negs = "a", "a"
    for _ in range(15):
        sin_mul = f"sin(mul({sin_mul}, a))"
    for _ in range(100):
        negs = f"neg({negs})"
    (pytester.path / "gradgate_deep.yaml").write_text(
        "cases:\n"
        f"  - name: sin_mul\n    params: {{a: [3]}}\n    init: {{a: [0.2, 0.5]}}\n    graph: {sin_mul}\n"
        "    consumers: [none]\n    max_maa: 0.01\n"
        f"  - name: negs\n    params: {{a: [3]}}\n    graph: {negs}\n    consumers: [none]\n")
    result = run_gate(pytester, "--gradgate-json", "r.json")
    assert outcomes(pytester.path / "r.json") == {"gradgate_deep.yaml::sin_mul[none-sqr-cpu]": "passed",
                                                  "gradgate_deep.yaml::negs[none-sqr-cpu]": "passed"}, \
        result.stdout.str()[-3000:]
    assert result.ret == 0


# -- 6. killing pytest kills its worker and the worker's children ------------------------------
def _children(pid):
    """Live (not zombie) processes whose parent is pid."""
    import os
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("isolate", ["case", "worker"])
@pytest.mark.slow
def test_killing_pytest_during_a_case_kills_its_worker_too(pytester, ggml_variant, how, isolate):
    """Before the fix: after pytest died the worker was re-parented to PID 1, and the
    worker (isolate=worker) or its child (isolate=case) kept spinning on the case until the
    case's timeout (here 600 s)."""
    import signal
    import subprocess
    import sys
    import time
    root, _ = ggml_variant("deaths")
    case_file(pytester.path / "gradgate_hang.yaml", "hang",
              "    params: {a: [4, 3]}\n    graph: scale(a, s=17)\n    consumers: [none]\n    timeout: 600\n")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p",
                             "no:cacheprovider", ".", "--gradgate-ggml-src", str(root), "--gradgate-isolate", isolate],
                            cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:   # the worker, and (isolate=case) its spare and the child running the case
            workers = _children(proc.pid)
            spinning = [p for w in workers for p in _children(w)] if isolate == "case" else workers
            if workers and len(spinning) >= (2 if isolate == "case" else 1):
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the case never started"
            time.sleep(0.1)
        time.sleep(1.0)   # well inside the case
        doomed = workers + [p for w in workers for p in _children(w)]
        proc.send_signal(getattr(signal, how))
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in doomed) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in doomed if _alive(p)]
        assert not left, f"still running after pytest got {how}: {left}"
    finally:
        proc.kill()
        proc.wait()
        for p in doomed if "doomed" in locals() else ():
            if _alive(p):
                __import__("os").kill(p, signal.SIGKILL)


# -- 7. full mode refuses a size it cannot do, before running ---------------------------------
def test_a_huge_full_mode_case_is_refused_at_load_with_its_cost(pytester, default_build):
    """Before: a 10^9-element full-mode case was accepted, printed nothing for minutes and
    then failed to allocate (its default timeout: 20,000,030 s). --gradgate-mode full over
    a large fast case is refused the same way."""
    (pytester.path / "gradgate_big.yaml").write_text(
        "cases:\n"
        "  - name: huge\n    params: {a: [1000, 1000, 1000]}\n    graph: sqr(a)\n    consumers: [none]\n"
        "  - name: big_fast\n    mode: fast\n    params: {a: [1000, 200]}\n    graph: sqr(a)\n    consumers: [none]\n")
    case_file(pytester.path / "gradgate_small.yaml", "small", PASSING)
    result = run_gate(pytester, "--gradgate-json", "r.json", "--junitxml", "j.xml")
    result.stdout.fnmatch_lines(["invalid case: */gradgate_big.yaml:2: case 'huge': full mode is for up to 100,000 param "
                                 "elements; this case has 1,000,000,000: 4,000,000,000 evaluations*mode: fast*"])
    result.assert_outcomes(passed=2, errors=1)
    forced = run_gate(pytester, "--gradgate-mode", "full")
    forced.stdout.fnmatch_lines(["invalid case: */gradgate_big.yaml:6: case 'big_fast', with --gradgate-mode full: "
                                 "full mode is for up to 100,000 param elements; this case has 200,000*"])
    forced.assert_outcomes(passed=1, errors=2)


def test_default_timeouts_stay_sane():
    """Before: the default timeout of a 10^7-element full-mode case was 200,030 s."""
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import MAX_DEFAULT_TIMEOUT, default_timeout
    big = Case(name="x", graph=["sqr(a)"], params={"a": [100_000]})
    assert default_timeout(big) <= MAX_DEFAULT_TIMEOUT <= 3600


# -- 8. nothing a case file says can become a GitHub workflow command ---------------------------
def test_a_param_name_cannot_inject_a_workflow_command(pytester, default_build, monkeypatch):
    """Before: a param named "c\\n::error file=x::pwned" was accepted; the failure text
    printed its name on its own line, which GitHub Actions runs as a workflow command."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    (pytester.path / "gradgate_evil.yaml").write_text(
        "cases:\n"
        "  - name: evil\n"
        '    params: {a: [4, 3, 2], b: [2, 2, 1], "c\\n::error file=x::pwned": [2]}\n'
        "    graph: acc(a, b, offset=5)\n    consumers: [transpose]\n")   # fails on ggml 0.15.3
    result = run_gate(pytester)
    assert result.ret == 1
    commands = [line for line in result.stdout.lines if line.startswith("::")]
    assert len(commands) == 1 and "pwned" in commands[0] and commands[0].startswith("::error file=")
    assert "\\n::error file=x::pwned" in commands[0]     # its repr: one annotation, no second command
    result.stdout.fnmatch_lines(["invalid case: */gradgate_evil.yaml:3: param name *must be an identifier*"])


def test_the_step_summary_cells_hold_no_markup_or_line_breaks():
    """Before: a cell kept `<`, `>` and backticks: HTML or a code span's end reached the
    job summary as markup."""
    from pytest_gradgate.report import outputs
    record = {"case_id": "x[none-sqr-cpu]", "status": "failed", "outcome": "failed", "phase": "done",
              "maa": 2.0, "max_maa": 1e-4, "diagnosis": "a <img src=x> | b `c`\n## d", "origin": {}}
    rows = [line for line in outputs.step_summary([record]).splitlines() if line.startswith("| `x")]
    assert len(rows) == 1
    assert "&lt;img src=x&gt; \\| b 'c' ## d" in rows[0] and "<img" not in rows[0]


# -- 9. user errors are file:line errors at load, not ggml crashes or tracebacks -----------------
USER_ERRORS = """\
cases:
  - name: row_99
    params: {a: [4, 6]}
    inputs: {r: {type: i32, values: [0, 99]}}
    graph: get_rows(a, r)
    consumers: [none]
  - name: row_minus_5
    params: {a: [4, 6]}
    inputs: {r: {type: i32, values: [-5]}}
    graph: get_rows(a, r)
    consumers: [none]
  - name: i32_overflow
    params: {a: [4, 6]}
    inputs: {r: {type: i32, values: [4294967296]}}
    graph: get_rows(a, r)
    consumers: [none]
  - name: no_param_used
    params: {a: [4]}
    inputs: {c: {type: f32, shape: [4]}}
    graph: sin(c)
    consumers: [none]
  - name: unused_param
    params: {a: [4], b: [4]}
    graph: sin(a)
    consumers: [none]
  - name: cuda_only
    params: {a: [4]}
    graph: sin(a)
    backends: [cuda]
  - name: fine
    params: {a: [4, 6]}
    inputs: {r: {type: i32, values: [5, 0]}}
    graph: get_rows(a, r)
    consumers: [none]
"""


def test_user_errors_are_errors_at_their_line(pytester, default_build):
    """Before: rows 99 and -5 were ggml aborts (crashed in phase compute), 2^32 an
    OverflowError traceback, a graph without params ggml's "no trainable parameters" abort,
    an unused param silently passed, and the cuda-only case vanished (alone: rc 5)."""
    (pytester.path / "gradgate_user.yaml").write_text(USER_ERRORS)
    result = run_gate(pytester, "-rs")
    result.stdout.fnmatch_lines([
        "invalid case: */gradgate_user.yaml:5: graph line 1 'get_rows(a, r)': get_rows: row 99 is not a row of a, "
        "which has 6 (ne1 of *); rows must be 0 to 5",
        "invalid case: */gradgate_user.yaml:10: graph line 1 'get_rows(a, r)': get_rows: row -5 is not a row*",
        "invalid case: */gradgate_user.yaml:14: input 'r': i32 values must be from -2147483648 to 2147483647, "
        "got 4294967296",
        "invalid case: */gradgate_user.yaml:18: the graph uses none of the params (a)*",
        "invalid case: */gradgate_user.yaml:23: param(s) b not used by the graph*",
    ], consecutive=False)
    # at the case's line, as pytest shows a skip mark at its test
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] gradgate_user.yaml:26: case 'cuda_only' is for other backends*"])
    result.assert_outcomes(passed=1, errors=5, skipped=1)
    assert "Traceback" not in result.stdout.str() and "crashed" not in result.stdout.str()


# -- 10. smaller points ---------------------------------------------------------------------
def test_a_yaml_string_number_is_named_and_invalid_cases_reach_the_json_report(pytester, default_build):
    """Before: `max_maa: 1e-4` (a string to PyYAML) got "'max_maa' must be a positive
    number, got '1e-4'", and the JSON report had no trace of the invalid case."""
    (pytester.path / "gradgate_s.yaml").write_text(
        f"cases:\n  - name: s\n    max_maa: 1e-4\n{PASSING}  - name: ok\n{PASSING}")
    result = run_gate(pytester, "--gradgate-json", "r.json")
    result.stdout.fnmatch_lines(["invalid case: */gradgate_s.yaml:3: 'max_maa' is the string '1e-4' to YAML, "
                                 "not a number; write it with a dot and a signed exponent, e.g. 1.0e-4"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert [(i["path"], i["line"]) for i in doc["invalid_cases"]] == [(str(pytester.path / "gradgate_s.yaml"), 3)]
    assert doc["invalid_cases"][0]["message"].startswith("'max_maa' is the string '1e-4' to YAML")
    assert result.ret == 1


def test_a_report_that_cannot_be_written_fails_the_run_and_leaves_no_temp_file(pytester, default_build):
    """Before: with --gradgate-json naming a folder the run said "could not write" and still
    exited 0, and left r.json.tmp behind."""
    case_file(pytester.path / "gradgate_one.yaml", "one", PASSING)
    (pytester.path / "r.json").mkdir()
    result = run_gate(pytester, "--gradgate-json", "r.json")
    result.stdout.fnmatch_lines(["gradgate: could not write the JSON report (--gradgate-json): *"])
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not (pytester.path / "r.json.tmp").exists()


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_worker_killed_during_a_case_is_not_said_to_die_in_startup(pytester, ggml_variant):
    """Before: a worker killed (SIGKILL) while its child ran a case was reported as
    "crashed (SIGKILL) in phase startup", as if the case had never begun."""
    import os
    import signal
    import subprocess
    import sys
    import time
    root, _ = ggml_variant("deaths")
    (pytester.path / "gradgate_hang.yaml").write_text(
        "cases:\n"
        "  - name: hang\n    params: {a: [4, 3]}\n    graph: scale(a, s=17)\n    consumers: [none]\n    timeout: 600\n"
        f"  - name: after\n{PASSING}")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p",
                             "no:cacheprovider", ".", "--gradgate-ggml-src", str(root), "--gradgate-json", "r.json",
                             "--gradgate-jobs", "1"],   # one worker: the one to kill is the one running "hang"
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:   # the worker whose children are the case's child and the next spare
            busy = [w for w in _children(proc.pid) if len(_children(w)) >= 2]
            if busy:
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the case never started"
            time.sleep(0.1)
        time.sleep(1.0)
        os.kill(busy[0], signal.SIGKILL)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
        proc.wait()
    cases = {c["name"]: c for c in json.loads((pytester.path / "r.json").read_text())["cases"]}
    assert (cases["hang"]["status"], cases["hang"]["phase"]) == ("error", "unknown"), out[-3000:]
    assert "the worker process died (SIGKILL) while its child ran the case" in cases["hang"]["message"]
    assert cases["after"]["status"] == "passed"


def test_an_assert_after_a_large_case_is_not_blamed_on_the_memory_cap(pytester, default_build):
    """Before: with --gradgate-isolate worker the worker's lifetime peak (here from the large
    case before) counted as the crash's growth: add1's shape assert was reported "(it had
    grown by 928 MiB against the --gradgate-max-memory cap of 1G: ...)"."""
    (pytester.path / "gradgate_seq.yaml").write_text(
        "cases:\n"
        "  - name: big\n    mode: fast\n    params: {a: [4096, 2048]}\n    graph: sqr(a)\n    consumers: [none]\n"
        f"  - name: crash\n{CRASHING}")
    result = run_gate(pytester, "--gradgate-isolate", "worker", "--gradgate-max-memory", "1G",
                      "--gradgate-json", "r.json")
    cases = {c["name"]: c for c in json.loads((pytester.path / "r.json").read_text())["cases"]}
    assert cases["crash"]["status"] == "crashed" and "GGML_ASSERT" in cases["crash"]["diagnosis"]
    assert "--gradgate-max-memory" not in cases["crash"]["diagnosis"], result.stdout.str()[-2000:]
