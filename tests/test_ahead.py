"""Cases run ahead of their items (gate/ahead.py), through the real plugin: each item gets
its own case's result in pytest's order, a run that stops early does not wait for the
cases it started ahead, and the option's bad values are usage errors."""

import json
import subprocess
import sys
import time

import pytest

# on the default ggml 0.15.3: sqr passes, add1 with a 3-D a crashes in build-backward (a
# known failure of the shipped baseline), and a transposed sum aborts in ggml's backward
PASS = "    params: {a: [4, 3]}\n    graph: sqr(a)\n    consumers: [none]\n"
CRASH = "    params: {a: [4, 3, 2], b: [1]}\n    graph: add1(a, b)\n    consumers: [none]\n"


def cases_yaml(entries):
    return "cases:\n" + "".join(f"  - name: {name}\n{body}" for name, body in entries)


def gate(pytester, *args):
    return pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", ".",
                                         "--gradgate-json", "r.json", *args)


@pytest.mark.parametrize("jobs", ["1", "2", "3"])
def test_each_item_gets_its_own_cases_result(pytester, default_build, jobs):
    """Passing and crashing cases interleaved, several run at once: a result handed to the
    wrong item (a neighbour's) would move a crash onto a pass. Checked by giving each item
    the result of whichever case finished first: the tests with 2 and 3 jobs failed."""
    pattern = "PCPPCCPCPPPCPCCP"
    entries = [(f"c{i:02d}_{'crash' if k == 'C' else 'pass'}", CRASH if k == "C" else PASS)
               for i, k in enumerate(pattern)]
    (pytester.path / "gradgate_mix.yaml").write_text(cases_yaml(entries))
    result = gate(pytester, "--gradgate-jobs", jobs)
    got = {c["name"]: c["status"] for c in json.loads((pytester.path / "r.json").read_text())["cases"]}
    assert got == {name: "crashed" if name.endswith("crash") else "passed" for name, _ in entries}, \
        result.stdout.str()[-3000:]
    # and pytest reports them in its own order, one line each
    assert result.parseoutcomes() == {"passed": pattern.count("P"), "failed": pattern.count("C")}
    result.stdout.fnmatch_lines([f"gradgate: isolate=case; {jobs} case{'s' if jobs != '1' else ''} at once*"])
    names = [line.split("::")[1].split("[")[0] for line in result.stdout.lines
             if line.startswith("FAILED gradgate_mix.yaml::")]
    assert names == sorted(names)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_run_stopped_early_kills_the_cases_it_started_ahead(pytester, ggml_variant):
    """With -x the run stops at the first failure while the next cases already run. Before
    Ahead.close killed them, the run waited for the hanging ones (600 s timeout) until each
    thread's join gave up after 30 s (74 s in all); now it ends within seconds and leaves no
    process behind.
    (25 s: well above the few seconds the run takes, well below what waiting costs.)"""
    from test_faults import _alive, _children
    root, _ = ggml_variant("deaths")
    hang = "    params: {a: [4, 3]}\n    graph: scale(a, s=17)\n    consumers: [none]\n    timeout: 600\n"
    (pytester.path / "gradgate_stop.yaml").write_text(cases_yaml(
        [("first_crash", CRASH), ("then_hang", hang), ("hang_too", hang), ("never_run", PASS)]))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p",
                             "no:cacheprovider", ".", "--gradgate-ggml-src", str(root), "--gradgate-json", "r.json",
                             "--gradgate-jobs", "2", "-x"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = set()
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            for worker in _children(proc.pid):
                seen.update([worker, *_children(worker)])
            time.sleep(0.05)
        assert proc.poll() is not None, "the run did not end"
        stopped = time.monotonic()
        out = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    cases = {c["name"]: c["status"] for c in json.loads((pytester.path / "r.json").read_text())["cases"]}
    assert cases == {"first_crash": "crashed"}, out[-3000:]
    assert "stopping after 1 failures" in out
    assert stopped - started < 25, f"the run took {stopped - started:.0f} s: it waited for the cases started ahead"
    while any(_alive(p) for p in seen) and time.monotonic() < stopped + 10:
        time.sleep(0.1)
    assert not [p for p in seen if _alive(p)], "a worker or a case's child outlived the run"


COMPILES_IN_THREADS = """
import sys, threading
seen = []
def _hook(event, args):
    # ast.parse, compile() and the import of a module from source all raise this event
    if event == "compile" and threading.current_thread() is not threading.main_thread():
        seen.append(f"{threading.current_thread().name}: {args[1]}")
sys.addaudithook(_hook)
def pytest_unconfigure(config):
    with open("compiles_in_threads.txt", "w") as out:
        out.write("\\n".join(seen))
"""


def test_the_threads_that_run_cases_ahead_never_parse_python(pytester, default_build):
    """CPython 3.11's AST constructor keeps its recursion depth in state that threads share:
    an ast.parse in a thread of ours while pytest's thread parses its tracebacks raised
    "SystemError: AST constructor recursion depth mismatch" in a CI run. A crashed case's
    Result is made in the parent, from the case's op, which parsing its graph gives: with
    Result.for_case parsing it in the thread, this test failed on the crashing cases."""
    pytester.makeconftest(COMPILES_IN_THREADS)
    entries = [(f"c{i}_{'crash' if k == 'C' else 'pass'}", CRASH if k == "C" else PASS)
               for i, k in enumerate("PCCPC")]
    (pytester.path / "gradgate_mix.yaml").write_text(cases_yaml(entries))
    result = gate(pytester, "--gradgate-jobs", "2")
    assert result.parseoutcomes() == {"passed": 2, "failed": 3}, result.stdout.str()[-3000:]
    assert (pytester.path / "compiles_in_threads.txt").read_text() == ""


@pytest.mark.parametrize("args, env, says", [
    (["--gradgate-jobs", "-1"], {}, "--gradgate-jobs: '-1' is below 0"),
    (["--gradgate-jobs", "two"], {}, "--gradgate-jobs: 'two' is not a valid value"),
    ([], {"GRADGATE_JOBS": "-3"}, "environment GRADGATE_JOBS: '-3' is below 0"),
])
def test_a_bad_jobs_value_is_a_usage_error(pytester, monkeypatch, args, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


WORKER_SEEN_AT_COLLECTION = """
import os, time
def _workers():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat, open(f"/proc/{entry}/cmdline", "rb") as cmd:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                    line = cmd.read()
            except OSError:
                continue
            if parent == os.getpid() and b"pytest_gradgate.isolation.worker" in line:
                found.append(entry)
    return found
def pytest_collection_finish(session):
    # the worker's process exists from the moment it is started (well before it is ready)
    deadline = time.monotonic() + float(os.environ["WAIT_FOR_WORKER_S"])
    while not _workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open("workers_at_collection.txt", "w") as out:
        out.write(str(len(_workers())))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("extra, expected", [([], "1"), (["--co"], "0"), (["--gradgate-isolate", "none"], "0")])
def test_the_first_worker_starts_while_pytest_collects(pytester, monkeypatch, default_build, extra, expected):
    """With the build in the cache, the first worker starts in the background at configure,
    not in the first item's setup: it runs before collection ends (this failed with
    start_early removed). --co runs no case, and isolate=none no worker: neither starts one
    (looked for during 2 s, when the worker's process would appear within milliseconds)."""
    monkeypatch.setenv("WAIT_FOR_WORKER_S", "30" if expected != "0" else "2")
    pytester.makeconftest(WORKER_SEEN_AT_COLLECTION)
    (pytester.path / "gradgate_two.yaml").write_text(cases_yaml([("p1", PASS), ("p2", PASS)]))
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", ".",
                                           *extra)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert (pytester.path / "workers_at_collection.txt").read_text() == expected
    if not extra:
        result.assert_outcomes(passed=2)
