"""The benchmark scripts run on demand, not in CI: here each one at least imports what it
uses and parses its options (`--help`), so that a moved module cannot break one unseen, as
moving result.ggml_message to isolation/crash.py broke bench/op_table.py once."""

import subprocess
import sys
from pathlib import Path

import pytest

import pytest_gradgate

BENCH = Path(__file__).resolve().parents[1] / "bench"
# modules the scripts use, not scripts: reference.py (test-backend-ops' side), worker_split.py
# (a pytest plugin bench_gate.py loads into the runs it times)
MODULES = ("reference.py", "worker_split.py")
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in MODULES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script):
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("module", MODULES)
def test_bench_module_imports(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module[:-3]}"], cwd=BENCH, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_speed_ratios_take_start_ups_out_per_op_and_name_the_worst_op():
    import bench_reference
    # op A: theirs 1.0 s with a 0.5 s start-up for 10 cases, ours 0.25 s (+0.25 s start-up);
    # op B: theirs 0.6 s with 0.5 s start-up for 1 case, ours 0.2 s
    rows = {"A": [{"tbo_n": 10, "tbo_s": 1.0, "ours_n": 10, "ours_s": 0.25}],
            "B": [{"tbo_n": 1, "tbo_s": 0.6, "ours_n": 1, "ours_s": 0.2}]}
    f = bench_reference.speed_ratios(rows, {"A": [0.5], "B": [0.5]}, {"A": [0.25], "B": [0.25]})
    assert f["without"] == pytest.approx((11 / 0.45) / (11 / 0.6))       # 0.6 s of their work, not 1.6 s
    assert f["with"] == pytest.approx((11 / 0.95) / (11 / 1.6))
    assert f["worst_op"] == "B" and f["worst"] == pytest.approx((1 / 0.2) / (1 / 0.1))
    assert f["geomean"] == pytest.approx(((10 / 0.25) / (10 / 0.5) * 0.5) ** 0.5)
    assert f["tbo_ms"] == pytest.approx(0.6 / 11 * 1e3)
    assert f["unresolved"] == 0
    # an op all start-up (its wall within noise of it) is left out per op, and costs them nothing overall
    rows["C"] = [{"tbo_n": 2, "tbo_s": 0.5, "ours_n": 2, "ours_s": 0.1}]
    f = bench_reference.speed_ratios(rows, {"A": [0.5], "B": [0.5], "C": [0.5]}, {"A": [0.25], "B": [0.25], "C": [0.1]})
    assert f["unresolved"] == 1 and f["worst_op"] == "B"
    assert f["without"] == pytest.approx((13 / 0.55) / (13 / 0.6))


def test_bare_compute_time_grows_with_the_graph_and_the_engine_counts_its_evaluations(lib, default_build):
    """gg_bare_compute_seconds really computes the graph (a 64x64 mul_mat costs more than a
    4-element sqr), and the engine's evaluations are the stencil's points per element."""
    import bench_reference
    from pytest_gradgate.check.engine import run_case
    from pytest_gradgate.declare.case import Case
    small = Case(name="small", graph="sqr(a)", params={"a": [4]})
    big = Case(name="big", graph="mul_mat(a, b)", params={"a": [256, 64], "b": [256, 64]})
    t_small = min(bench_reference.bare_forward_seconds(small, lib, budget_s=0.005) for _ in range(3))
    t_big = min(bench_reference.bare_forward_seconds(big, lib, budget_s=0.005) for _ in range(3))
    assert 0 < t_small < t_big
    result = run_case(small, lib)
    assert result.status == "passed"
    assert result.evaluations == 4 * 4 and result.timings["numeric"] > 0
    evals = bench_reference.per_evaluation(
        [small], [{"duration": result.duration, "numeric_s": result.timings["numeric"],
                   "evaluations": result.evaluations, "status": str(result.status)}], default_build.library)
    assert evals["counted"] == 1 and 0 < evals["bare"] and evals["numeric"] <= evals["engine"]
    assert evals["halved"] == 0 and evals["engine_all_ratio"] == pytest.approx(evals["engine"] / evals["bare"])


def test_per_evaluation_measures_each_full_mode_cases_bare_compute_around_its_own_run(default_build):
    """The bench child times a case's bare compute right before and after the case (its mean in
    "bare_s"), and per_evaluation takes that one: a bare compute measured once after the whole
    run drifted with the machine, which left the numeric loop faster than a bare compute."""
    import bench_reference
    from pytest_gradgate.declare.case import Case
    full = Case(name="full", graph="sqr(a)", params={"a": [4]})
    fast = Case(name="fast", graph="sqr(a)", params={"a": [4]}, mode="fast")
    ours, _ = bench_reference.run_ours([full, fast], default_build.library, 1, bare_between=True)
    timing_full, timing_fast = ours["per_case"]
    assert timing_full["bare_s"] > 0 and "bare_s" not in timing_fast, ours["per_case"]
    evals = bench_reference.per_evaluation([full, fast], ours["per_case"], default_build.library)
    assert evals["counted"] == 1
    assert evals["bare"] == pytest.approx(timing_full["bare_s"])   # not measured again afterwards
    plain, _ = bench_reference.run_ours([full], default_build.library, 1)
    assert "bare_s" not in plain["per_case"][0]
    with pytest.raises(ValueError, match="bare_between needs one worker"):
        bench_reference.run_ours([full, full], default_build.library, 2, bare_between=True)


def test_bench_reference_prints_both_ratios_and_the_per_evaluation_figure(default_build):
    """One op, one repetition: the figures' lines are there (their values are the bench's business)."""
    proc = subprocess.run([sys.executable, str(BENCH / "bench_reference.py"), "--ops", "SQR", "--max-cases", "2",
                           "--repeat", "1", "--jobs", "1", "--no-suite", "--no-fast"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    for line in ("with both start-ups:", "without start-ups:", "HEADLINE per case:", "bare: ggml_graph_compute",
                 "both alone (one case at a time, one lane;", "the same with a fresh child for every case",
                 "HEADLINE per evaluation:",
                 "with one case, process start to exit: median", f"pytest-gradgate {pytest_gradgate.__version__}, "):
        assert line in out, out
    import bench_reference
    if bench_reference.hypothesis_plugin_installed():     # the test extra brings it
        assert "default install (-p no:hypothesispytest):" in out, out


@pytest.mark.slow
def test_bench_html_report_prints_each_figure(default_ggml):
    """The concat_dim0 items but one (two of them fail on the concat-buggy variant), one run of
    each side: the figures' lines are there, with the failures and a report that has images."""
    import re
    proc = subprocess.run([sys.executable, str(BENCH / "bench_html_report.py"), "--repeat", "1",
                           "-k", "concat_dim0 and not permute_0213"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    for line in ("failures: 2\n", "without --gradgate-html (start to exit): median", "with --gradgate-html (start to exit, "
                 "the report written): median", "the report's cost (with - without, pair by pair): median",
                 "html.render alone, in this process ("):
        assert line in out, out
    assert int(re.search(r"report: \d+ KB, (\d+) images", out).group(1)) >= 2, out


def test_bench_collect_prints_each_figure_with_and_without_its_memo(default_ggml):
    proc = subprocess.run([sys.executable, str(BENCH / "bench_collect.py"), "--repeat", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for line in ("1 calls each: with the tree's stat memo median", "hashing the tree median",
                 "659 items, 1 runs, with the collection memo: start to exit median",
                 "659 items, 1 runs, memos removed before each run: start to exit median"):
        assert line in proc.stdout, proc.stdout


def test_worker_split_counts_every_item_once_per_xdist_worker(tmp_path):
    """What bench_gate.py prints per xdist worker comes from this plugin on the controller."""
    import json
    import os
    (tmp_path / "test_few.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_it(i):\n    pass\n")
    split = tmp_path / "split.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])),
               GRADGATE_BENCH_SPLIT=str(split))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "worker_split",
                           "-n", "2", "test_few.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    split = json.loads(split.read_text())
    workers, timeline = split["workers"], split["timeline"]
    assert set(workers) <= {"gw0", "gw1"} and sum(w["items"] for w in workers.values()) == 6, workers
    assert all(w["done_s"] > 0 for w in workers.values()), workers
    # in the order a run goes through them, from the process's start
    order = ["session_s", "collected_s", "first_s", "last_s", "finish_s"]
    assert sorted(timeline, key=timeline.get) == order and timeline["session_s"] > 0, timeline
    # each process's own CPU seconds: the workers' come back through xdist's workeroutput
    cpu = split["cpu_s"]
    assert set(cpu) == {"controller", "gw0", "gw1"} and all(v > 0 for v in cpu.values()), cpu
    import bench_gate
    controller, worker = bench_gate.by_process([split, None])
    assert controller == cpu["controller"] and min(cpu[w] for w in workers) <= worker <= max(cpu[w] for w in workers)
    assert bench_gate.by_process([None, {"workers": {}}]) is None
    # each worker's main thread's CPU in the runtest hooks, also through workeroutput: the
    # protocol holds its parts
    hooks = split["hook_cpu_s"]
    assert set(hooks) == set(workers) and all(set(h) == set(bench_gate.HOOKS) for h in hooks.values()), hooks
    for h in hooks.values():
        assert h["protocol"] >= h["setup"] + h["call"] + h["teardown"] > 0, h
    medians = bench_gate.by_hook([split, None])
    assert medians["protocol"] == pytest.approx(sorted(h["protocol"] for h in hooks.values())[len(hooks) // 2]
                                                if len(hooks) % 2 else sum(h["protocol"] for h in hooks.values()) / 2)
    assert "protocol " in bench_gate.hooks_text(medians, medians) and bench_gate.by_hook([None]) is None


def test_the_timeline_splits_each_run_before_among_and_after_its_items(capsys):
    """bench_gate.py's "where the wall time goes": medians over the runs of each part, beside
    the Runner alone's start-up and cases (its wall minus its start-up)."""
    import bench_gate

    def run(wall, first, last):
        timeline = {"session_s": 0.2, "collected_s": 0.6, "first_s": first, "last_s": last, "finish_s": last + 0.1}
        return (wall, 0, 0, 0, 0, {}, {"workers": {}, "timeline": timeline})
    runs = [(run(6.0, 0.7, 5.8), (5.0, 9.0, 0.2)), (run(6.6, 0.9, 6.4), (5.2, 9.0, 0.1)),
            (run(6.2, 0.8, 6.0), (4.8, 9.0, 0.3))]
    bench_gate.print_timeline(runs, 2)
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary == ("-n 2, where the wall time goes (medians): before the first item's report 0.80 s (the Runner "
                       "alone: its first worker up with one case, 0.20 s); from the first report to the last 5.20 s "
                       "(the Runner alone's cases after that: 4.80 s); after the last report, to the exit, 0.20 s")


def test_the_items_floor_is_items_of_the_gates_kind_with_its_outcomes(tmp_path):
    """bench_gate.py's per-item floor: pytest.Item subclasses, not Python test functions (whose
    fixtures and xfail tracebacks cost pytest more than the gate's items do, and flattered the
    gate), each outcome reached without a traceback; an error counts as a failure."""
    import bench_gate
    name = bench_gate.write_items_floor(tmp_path, {"passed": 2, "skipped": 1, "xfailed": 2, "error": 1})
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", name]
    listed = subprocess.run(run + ["--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert ids == ["floor.items::failed[0]", "floor.items::passed[0]", "floor.items::passed[1]",
                   "floor.items::skipped[0]", "floor.items::xfailed[0]", "floor.items::xfailed[1]"], listed.stdout
    proc = subprocess.run(run + ["-rA"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 failed, 2 passed, 1 skipped, 2 xfailed" in proc.stdout, proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout and "raise FloorFailure" not in proc.stdout, proc.stdout[-2000:]
