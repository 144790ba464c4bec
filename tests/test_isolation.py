"""Crash isolation, tested with real deaths: a ggml variant whose SCALE kernel segfaults,
hangs or allocates without bound on magic scale factors (ggml_variants.py, "deaths"), and
ggml's own aborts on the default ggml. Each death must be one clear failed item while the
other cases of the run pass, in every isolation mode, under pytest-xdist too.

How these tests were seen to fail with the bug put back:
- isolation off (the cases run in the pytest process: --gradgate-isolate none) on the
  deaths YAML: the run itself dies at the segfault (exit status 139), no JUnit file;
- GGML_NO_BACKTRACE not set for children: the default-settings run's stderr section holds
  gdb's backtrace, failing test_no_backward_reported_and_no_backtrace_by_default;
- the worker's Worker() env forcing GGML_NO_BACKTRACE=1 (as it once did): the
  --gradgate-backtrace run shows no backtrace, failing the same test;
- the worker's stderr in a named file removed at close() (as it once was): a killed
  parent leaves it in the temporary folder, failing test_a_killed_parent_leaves_no_worker_log.
"""

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from pytest_gradgate.library.cache import cache_root

# ten cases: five deaths, each followed by a case that must still pass
DEATHS_YAML = """\
cases:
  - name: add_ok
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none]
  - name: segfault
    params: {a: [4, 3]}
    graph: scale(a, s=13)
    consumers: [none]
  - name: after_segfault
    params: {a: [4, 3]}
    graph: scale(a, s=2)
    consumers: [none]
  - name: hang
    params: {a: [4, 3]}
    graph: scale(a, s=17)
    consumers: [none]
  - name: after_hang
    params: {a: [4, 3]}
    graph: scale(a, s=3)
    consumers: [none]
  - name: unbounded_alloc
    params: {a: [4, 3]}
    graph: scale(a, s=19)
    consumers: [none]
  - name: after_alloc
    params: {a: [4, 3]}
    graph: scale(a, s=5)
    consumers: [none]
  - name: assert_abort
    params: {a: [4, 3]}
    init: {a: [0.5, 2.0]}
    graph: sqrt(a)
    consumers: [transpose]
  - name: reglu_no_backward
    params: {a: [4, 3, 2]}
    graph: reglu(a)
    consumers: [none]
  - name: last_ok
    params: {a: [4, 3], b: [4, 3]}
    graph: mul(a, b)
    consumers: [none]
"""
PASSING = {"add_ok", "after_segfault", "after_hang", "after_alloc", "last_ok"}
# what each death must say: signal (or timeout), phase, and ggml's message where it has one
DEATHS = {
    "segfault": ["CRASHED", "phase compute", "signal: SIGSEGV"],
    "hang": ["TIMEOUT", "timed out after 3 s in phase compute"],
    "unbounded_alloc": ["CRASHED", "phase compute", "signal: SIGABRT",
                        "gradgate deaths variant: malloc failed after", "--gradgate-max-memory cap of 256M"],
    "assert_abort": ["CRASHED", "phase compute", "signal: SIGABRT", "GGML_ASSERT(", ") failed"],
    "reglu_no_backward": ["CRASHED", "phase build-backward", "signal: SIGABRT",
                          "no backward for REGLU in this ggml", "unsupported glu op for backward pass: REGLU"],
}
OTHER_CASES_YAML = """\
cases:
  - name: add_ok
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none]
  - name: reglu_no_backward
    params: {a: [4, 3, 2]}
    graph: reglu(a)
    consumers: [none]
  - name: mul_ok
    params: {a: [4, 3], b: [4, 3]}
    graph: mul(a, b)
    consumers: [none]
  - name: scale_ok
    params: {a: [4, 3]}
    graph: scale(a, s=2)
    consumers: [none]
"""
BACKTRACE_MARKERS = ("ggml_abort", "[Inferior 1")   # gdb's frames / its detach line; backtrace_symbols'


@pytest.fixture(autouse=True)
def real_cache(monkeypatch):
    """pytester points HOME at a temporary folder; keep the runs on the real build cache."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))


@pytest.fixture(scope="session")
def deaths_ggml(ggml_variant):
    return ggml_variant("deaths")[0]


def gate_args(ggml_root, cases, *extra):
    return ["--gradgate", "--gradgate-no-builtin", "--gradgate-ggml-src", str(ggml_root),
            "--gradgate-cases", str(cases), *extra]


def junit_cases(path):
    """testcase name -> failure text ('' when it passed)."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        failure = tc.find("failure")
        out[tc.get("name")] = "" if failure is None else (failure.get("message", "") + "\n" + (failure.text or ""))
    return out


def check_deaths_run(result, junit):
    assert result.ret == 1
    result.assert_outcomes(passed=len(PASSING), failed=len(DEATHS))
    cases = junit_cases(junit)
    assert {name.split("[")[0] for name in cases} == PASSING | set(DEATHS)   # every case listed
    for name, text in cases.items():
        short = name.split("[")[0]
        if short in PASSING:
            assert text == "", name
        else:
            for expected in DEATHS[short]:
                assert expected in text, (name, expected, text)
    out = result.stdout.str()
    for short in DEATHS:   # -ra: one FAILED line per death
        result.stdout.fnmatch_lines([f"FAILED *{short}*"])
    assert "ggml stderr" in out   # the report section with ggml's own output
    assert "GGML_ASSERT(" in out and "unsupported glu op for backward pass" in out


@pytest.mark.slow
def test_each_death_is_one_failed_item_and_lf_reruns_them(pytester, deaths_ggml):
    """isolate=case (default): forked children die; the worker and the run go on."""
    cases = pytester.makefile(".yaml", gradgate_deaths=DEATHS_YAML)
    args = gate_args(deaths_ggml, cases, "--gradgate-timeout", "3", "--gradgate-max-memory", "256M", "-ra")
    result = pytester.runpytest(*args, "--junitxml=first.xml")
    check_deaths_run(result, pytester.path / "first.xml")

    rerun = pytester.runpytest(*args, "--lf", "--junitxml=rerun.xml")
    rerun.assert_outcomes(failed=len(DEATHS), deselected=len(PASSING))
    assert {n.split("[")[0] for n in junit_cases(pytester.path / "rerun.xml")} == set(DEATHS)


@pytest.mark.slow
def test_each_death_is_one_failed_item_with_isolate_worker(pytester, deaths_ggml):
    """isolate=worker: the worker itself dies (or is killed on timeout) and is replaced;
    the case after each death still runs and passes."""
    cases = pytester.makefile(".yaml", gradgate_deaths=DEATHS_YAML)
    result = pytester.runpytest(*gate_args(deaths_ggml, cases, "--gradgate-isolate", "worker", "--gradgate-timeout",
                                           "3", "--gradgate-max-memory", "256M", "-ra", "--junitxml=worker.xml"))
    check_deaths_run(result, pytester.path / "worker.xml")


@pytest.mark.slow
def test_each_death_is_one_failed_item_without_fork(pytester, deaths_ggml, monkeypatch):
    """The path of Windows and macOS (no child per case), forced on Linux: the worker runs
    each case itself and is replaced when one kills it. Before GRADGATE_START_METHOD existed
    this path never ran here (the header said plain isolate=case: every case was forked)."""
    monkeypatch.setenv("GRADGATE_START_METHOD", "spawn")
    cases = pytester.makefile(".yaml", gradgate_deaths=DEATHS_YAML)
    result = pytester.runpytest_subprocess(*gate_args(deaths_ggml, cases, "--gradgate-timeout", "3",
                                                      "--gradgate-max-memory", "256M", "-ra", "-p", "no:cacheprovider",
                                                      "--junitxml=spawn.xml"))
    result.stdout.fnmatch_lines(["gradgate: isolate=case (no fork here: each case runs in the worker process*"])
    check_deaths_run(result, pytester.path / "spawn.xml")


def test_no_backward_reported_and_no_backtrace_by_default(pytester, default_ggml):
    """On the default ggml a user's REGLU case fails with ggml's message and the run goes
    on. Children run with GGML_NO_BACKTRACE (no gdb backtrace in stderr) unless
    --gradgate-backtrace is given, and then the backtrace is there."""
    cases = pytester.makefile(".yaml", gradgate_other=OTHER_CASES_YAML)
    result = pytester.runpytest(*gate_args(default_ggml, cases))
    assert result.ret == 1
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "no backward for REGLU in this ggml" in out
    assert "unsupported glu op for backward pass: REGLU" in out
    assert not any(marker in out for marker in BACKTRACE_MARKERS), out

    traced = pytester.runpytest(*gate_args(default_ggml, cases, "--gradgate-backtrace", "-k", "reglu"))
    traced.assert_outcomes(failed=1, deselected=3)
    out = traced.stdout.str()
    assert "no backward for REGLU in this ggml" in out   # ggml's message survives a long backtrace
    assert any(marker in out for marker in BACKTRACE_MARKERS), out


def test_isolate_none_runs_passing_cases(pytester, default_ggml):
    cases = pytester.makefile(".yaml", gradgate_other=OTHER_CASES_YAML)
    result = pytester.runpytest(*gate_args(default_ggml, cases, "--gradgate-isolate", "none", "-k", "not reglu"))
    assert result.ret == 0
    result.assert_outcomes(passed=3, deselected=1)


def test_under_xdist_results_reach_the_controller(pytester, default_ggml):
    """-n 2: a worker in each xdist process, one shared (cached) build; the controller's
    terminal summary lists the failure that happened in an xdist process."""
    cases = pytester.makefile(".yaml", gradgate_other=OTHER_CASES_YAML)
    result = pytester.runpytest(*gate_args(default_ggml, cases, "-n", "2"))
    assert result.ret == 1
    result.assert_outcomes(passed=3, failed=1)
    # node ids: two files may hold cases of the same name
    result.stdout.fnmatch_lines(["*gradgate failures*",
                                 "gradgate_other.yaml::reglu_no_backward*no backward for REGLU in this ggml*"])
    # the build's facts ride on each worker's first result only, and still reach the summary
    result.stdout.fnmatch_lines(["gradgate: ggml 0.15.3 from *", "gradgate: Release build for cpu *"])


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_a_cancelled_runner_starts_no_worker_and_kills_one_that_was_starting(default_build):
    """Runner.cancel (a run that stops early, and every session's close, gate/ahead.py): a
    worker that is starting when cancel comes is killed at once, not left to take a case nor
    waited for until it is up (before, the close of a one-case run waited 0.3 s for the
    second job's worker to start), and no later case starts one."""
    import threading
    import time
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import CANCELLED, Runner
    case = Case(name="c", graph="sqr(a)", params={"a": [4, 3]})
    runner = Runner(default_build.library)
    up, finished = threading.Event(), threading.Event()

    def start_and_stay():
        runner.start()
        up.set()
        finished.wait(60)     # a worker dies with the thread that started it (PR_SET_PDEATHSIG)
    others = set(_worker_processes())     # other tests' workers in this process (xdist)
    try:
        starting = threading.Thread(target=start_and_stay)
        starting.start()
        deadline = time.monotonic() + 30
        while not set(_worker_processes()) - others and time.monotonic() < deadline:
            time.sleep(0.001)         # its process exists; it is not up yet (a few tenths of a second)
        ours = set(_worker_processes()) - others
        assert ours, "no worker process started"
        runner.cancel(kill=False)
        assert up.wait(60)
        assert runner.worker is None, "the worker was left to get up"
        assert runner.workers_started == 0
        assert not ours & set(_worker_processes()), "the starting worker was not killed"
        result = runner.run(case)
        assert (result.status, result.message) == ("error", CANCELLED)
        assert runner.workers_started == 0 and not set(_worker_processes()) - others
    finally:
        finished.set()
        runner.close()


@pytest.mark.skipif(not os.path.isfile("/proc/self/environ"), reason="reads the worker's environment in /proc")
def test_a_worker_runs_numpys_blas_on_one_thread_whatever_the_users_setting(default_build, monkeypatch):
    """A worker's numpy (OpenBLAS in PyPI's wheels) starts a thread pool on import, and its
    threads spin between the engine's matrix-vector products, taking CPU from ggml and the
    other workers (parent.Worker). The worker is set to one BLAS thread, over the user's value,
    and still runs cases."""
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import Runner
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")    # a user's own setting, which would start a pool
    runner = Runner(default_build.library)
    try:
        runner.start()
        pid = runner.worker.proc.pid
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        assert env.get(b"OPENBLAS_NUM_THREADS") == b"1"
        result = runner.run(Case(name="c", graph="sqr(a)", params={"a": [64, 64]}))
        assert result.status == "passed", result.message
    finally:
        runner.close()


def test_waiting_for_a_worker_to_exit_returns_its_status_and_gives_up_at_the_timeout():
    """parent.wait_exited, which Worker.close uses: woken by the exit itself (a pidfd, where
    Linux has one) instead of subprocess's polling; a process that does not exit is left
    running when the timeout passes, for the caller to kill."""
    from pytest_gradgate.isolation.parent import wait_exited
    quick = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_exited(quick, timeout=60) == 3
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exited(slow, timeout=0.2)
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()


def _worker_processes():
    import os
    from test_faults import _children
    found = []
    for pid in _children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                if b"pytest_gradgate.isolation.worker" in cmd.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _core_pattern_in_working_directory():
    """This machine's core_pattern if a core dump is a file in the crashing process's working
    directory (no pipe to a helper, no other directory), else None."""
    try:
        with open("/proc/sys/kernel/core_pattern") as f:
            pattern = f.read().strip()
    except OSError:
        return None
    return pattern if pattern and not pattern.startswith("|") and "/" not in pattern else None


@pytest.mark.parametrize("isolate, backtrace", [("case", False), ("worker", False), ("case", True)])
def test_a_crashing_case_dumps_no_core_where_the_user_allows_core_dumps(default_build, tmp_path, monkeypatch,
                                                                        isolate, backtrace):
    """Under `ulimit -c unlimited` (a C developer's shell) each crashed child wrote its memory
    to a core file in the working directory: 263 of the built-in suite's cases crash on the
    default ggml, and the suite took 22 s instead of 11 s and left a 26 MB `core` behind.
    Seen to fail without prctl.allow_core_dumps(False): a `core` in the gate's folder. The
    control (a plain Python that aborts in the same setting) shows the machine does write one.
    With --gradgate-backtrace (ggml's debugging output) the user's limit stands: a core is written."""
    import resource
    import subprocess
    import sys
    from pytest_gradgate.check.outcome import Status
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import Runner
    pattern = _core_pattern_in_working_directory()
    if pattern is None:
        pytest.skip("core dumps on this machine are not files in the working directory (core_pattern)")
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        pytest.skip("this process may not raise its core dump limit (hard RLIMIT_CORE is 0)")
    control, gate = tmp_path / "control", tmp_path / "gate"
    control.mkdir()
    gate.mkdir()
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        subprocess.run([sys.executable, "-c", "import os; os.abort()"], cwd=control, check=False)
        assert list(control.iterdir()), f"no core file from a plain abort here (core_pattern {pattern!r})"
        monkeypatch.chdir(gate)      # the worker's, and so its children's, working directory
        runner = Runner(default_build.library, isolate=isolate, backtrace=backtrace)
        try:
            # add1 with a 3-D a aborts in build-backward on the default ggml (a shipped known failure)
            result = runner.run(Case(name="crash", graph="add1(a, b)", params={"a": [4, 3, 2], "b": [1]}))
        finally:
            runner.close()
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    assert result.status == Status.CRASHED, result.message
    assert "SIGABRT" in result.message, result.message
    if backtrace:
        assert [p.name for p in gate.iterdir()], "--gradgate-backtrace: the user's core dump limit was not kept"
    else:
        assert list(gate.iterdir()) == []


# start a worker, then die the way a killed pytest dies: no close(), no atexit
KILLED_PARENT = """
import os, signal, sys
from pytest_gradgate.isolation.parent import Runner
runner = Runner(sys.argv[1])
assert runner.ggml_version(), "the worker did not start"
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_parent_leaves_no_worker_log(default_build, tmp_path):
    # the worker's stderr file is read through its descriptor only: it has no name to leave behind
    run = subprocess.run([sys.executable, "-c", KILLED_PARENT, str(default_build.library)],
                         env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("gradgate-worker-")]
