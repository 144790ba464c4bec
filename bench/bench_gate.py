"""What the pytest layer costs on top of the engine, for the built-in suite.

    python bench/bench_gate.py [--ggml-src DIR] [--repeat 3] [--only one,jobs1,n2,floors] [--xdist 2]

1. `pytest --gradgate` in one process, from an empty folder (cached build), as a user runs
   it: the cases run ahead of their items, one per CPU at once (gate/ahead.py). Its wall
   time, from process start to exit, against
   a. the sum of its cases' own durations (the `duration` of each case in the JSON report:
      the engine's work inside the child, isolation not included). Goal: at most 1.3x.
      With cases running side by side this flatters: each case's duration grows while it
      shares the cores, and the wall time is shared by several;
   b. the Runner alone on the same cases, in the gate's order, with as many workers (its
      workers' start on the smallest case included): the least flattering figure, the HEADLINE;
2. the same with --gradgate-jobs 1 (one case at a time, started while pytest reports the
   one before), against the sum of its durations and the Runner alone with one worker;
3. `pytest --gradgate -n 2` against the Runner alone on the same cases with 2 workers
   (worker start-up included on both sides). Goal: at most 1.3x.
   --xdist N runs it with -n N against N workers: with more workers than cores (-n 4 here)
   it shows how the gate's items are spread over xdist's workers (gate/xdist_schedule.py).
   Each such run also reports, per xdist worker, the items it ran, their call phases'
   durations and when its last item was done (bench/worker_split.py, a plugin on the controller),
   and when, from the pytest process's start, its session started, the workers' collections
   came in, the first and the last report arrived and the session finished; then, as medians,
   where the wall time goes: before the first item's report (against the Runner alone's
   first worker start with one case), from the first report to the last (against the Runner
   alone's cases), and after the last. It also prints, as medians, each pytest process's own CPU
   seconds to its session's finish (the controller's; an xdist worker's, sent back through
   xdist's workeroutput) and what the rest of the run's tree spent: the case workers, their
   children and every process's end. The floor's run of empty items under -n N gets the same.
Each pytest run is compared with the Runner alone run right before it and right after it
(their mean; consecutive pytest runs share the one between them), so that a drift of the
machine's speed cancels; the figures are medians (and ranges) of each repetition's ratio.
--only picks the parts (one, jobs1, n2, floors): fewer parts, more repetitions in the same
time. Every pytest figure includes the interpreter's start, collection
of the YAML files and every report; that is what a user waits for. So that a reader can tell
the gate's own cost from pytest's, the same pytest (same plugins, same environment) is also
timed on an empty folder, in one process and with -n 2: a floor that neither the gate nor
the engine can lower (on a machine with PYTHONDONTWRITEBYTECODE=1, it includes pytest
compiling and rewriting every plugin's modules, e.g. all of hypothesis when its plugin is
installed, in each process).
   The same pytest is also timed on as many empty items as the gate had, of the gate's kind
   (pytest.Item subclasses, not Python functions, whose skips and xfails format no
   traceback) and with the same outcomes (passed, skipped, xfailed): what pytest and
   pytest-xdist spend per item of that kind whatever a plugin does. Of the CPU a gate run spends over the Runner alone, the report
   says how much that is and how much is left for the gate's own pytest layer.
4. Where Hypothesis's pytest plugin is installed (this project's test extra brings it), 1, 2
   and 3 are also run with it blocked (-p no:hypothesispytest), side by side with the runs above:
   what pytest loads in a default install, where Hypothesis is only the explore extra. The
   HEADLINE stays the run with every installed plugin, the less flattering one.
5. CPU seconds of every process of each run (pytest's, its case workers' and their children's;
   the Runner alone's bench child and everything under it, its interpreter start included):
   what the pytest layer adds in work, whatever else the machine does. On a shared machine
   they move far less than wall time, and with both cores busy wall time follows them.
The header says which pytest-gradgate is measured: the one this Python imports. For what
`pip install .` gives, run the bench with the Python of a venv that has the wheel installed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_reference
from pytest_gradgate.library.cmake import ensure_build
from pytest_gradgate.library.options import BuildOptions
from pytest_gradgate.library.source import resolve_source


BENCH_DIR = Path(__file__).resolve().parent


def timed(cmd, cwd, env=None):
    """(wall s, CPU s of the process and every process under it, exit code, output)."""
    wall, usage, code, text = bench_reference.run_measured(cmd, cwd=cwd, env=env, stderr=subprocess.STDOUT)
    return wall, usage.ru_utime + usage.ru_stime, code, text


def with_worker_split(cmd, split_file):
    """(cmd, env) that load worker_split.py into a pytest run, writing to split_file."""
    path = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH")) if p)
    return cmd + ["-p", "worker_split"], dict(os.environ, PYTHONPATH=path, GRADGATE_BENCH_SPLIT=str(split_file))


def by_process(splits):
    """The medians over runs of worker_split's "cpu_s": (the controller's CPU s, one xdist worker's
    (the median over all the runs' workers)); None where no run has them."""
    cpus = [s.get("cpu_s") or {} for s in splits if s]
    controller = [c["controller"] for c in cpus if "controller" in c]
    workers = [v for c in cpus for k, v in c.items() if k != "controller"]
    if not controller or not workers:
        return None
    return statistics.median(controller), statistics.median(workers)


HOOKS = ("protocol", "setup", "call", "teardown", "makereport", "logreport")


def by_hook(splits):
    """The medians over runs and xdist workers of worker_split's "hook_cpu_s": {hook: CPU s of
    one worker's main thread in it}; None where no run has them."""
    per_worker = [w for s in splits if s for w in (s.get("hook_cpu_s") or {}).values()]
    if not per_worker:
        return None
    return {h: statistics.median(w.get(h, 0.0) for w in per_worker) for h in HOOKS}


def hooks_text(*columns):
    """'protocol 0.43 / 0.19 s; setup ...': one figure per column (by_hook's dicts) and hook."""
    return "; ".join(f"{h} " + " / ".join(f"{c[h]:.3f}" for c in columns) + " s" for h in HOOKS)


def pytest_run(folder, extra, split=False):
    """(wall s, the cases' durations summed, cases, exit code, CPU s of every process, {outcome: items},
    and with split=True, for a run under xdist, how its items went to the workers and when its
    session's steps happened: worker_split.py's {workers, timeline})."""
    report = Path(folder) / "r.json"
    cmd = [sys.executable, "-m", "pytest", "--gradgate", "-q", "-p", "no:cacheprovider", "--gradgate-json",
           str(report), *extra]
    env = None
    split_file = Path(folder) / "split.json"
    if split:
        cmd, env = with_worker_split(cmd, split_file)
    wall, cpu, code, text = timed(cmd, folder, env)
    if not report.is_file():
        raise SystemExit(f"pytest --gradgate did not write its report (exit {code}):\n{text[-2000:]}")
    cases = json.loads(report.read_text())["cases"]
    outcomes = {}
    for c in cases:
        outcomes[c.get("outcome")] = outcomes.get(c.get("outcome"), 0) + 1
    spread = json.loads(split_file.read_text()) if split and split_file.is_file() else None
    return wall, sum(c.get("duration") or 0.0 for c in cases), len(cases), code, cpu, outcomes, spread


# Empty items of the gate's kind: pytest.Item subclasses (not Python test functions) that reach
# each outcome the way the gate's items do (gate/items.py): pytest.skip, pytest.xfail, and a
# failure whose repr_failure is a string, so that no Python traceback is formatted. Python
# functions would cost pytest more per item than the gate's items (fixtures, the call of the
# function, a traceback formatted for every xfail) and flatter the gate: a floor must be what
# pytest spends on items like the gate's whatever the gate does, no more.
FLOOR_CONFTEST = """\
import json

import pytest

OUTCOMES = json.loads({outcomes!r})


class FloorFailure(Exception):
    pass


class FloorItem(pytest.Item):
    def __init__(self, *, outcome, **kwargs):
        super().__init__(**kwargs)
        self.outcome = outcome

    def runtest(self):
        if self.outcome == "skipped":
            pytest.skip("floor")
        if self.outcome == "xfailed":
            pytest.xfail("floor")
        if self.outcome == "failed":
            raise FloorFailure("floor")

    def repr_failure(self, excinfo):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, 0, self.name


class FloorFile(pytest.File):
    def collect(self):
        for outcome, n in sorted(OUTCOMES.items()):
            for i in range(n):
                yield FloorItem.from_parent(self, name=f"{{outcome}}[{{i}}]", outcome=outcome)


def pytest_collect_file(file_path, parent):
    if file_path.name == "floor.items":
        return FloorFile.from_parent(parent, path=file_path)
"""


def write_items_floor(folder, outcomes):
    """Write the floor's conftest.py and item file into `folder`, for {outcome: items}; any
    outcome but passed, skipped and xfailed (an error) becomes a failure, red as it was.
    Returns the name of the file to collect."""
    counts = {}
    for outcome, n in outcomes.items():
        key = outcome if outcome in ("passed", "skipped", "xfailed") else "failed"
        counts[key] = counts.get(key, 0) + n
    (Path(folder) / "conftest.py").write_text(FLOOR_CONFTEST.format(outcomes=json.dumps(counts)))
    (Path(folder) / "floor.items").write_text("")
    return "floor.items"


def items_floor(folder, outcomes, extra, split=False):
    """(wall s, CPU s, worker_split's JSON with split=True, else None) of the same pytest running
    as many empty items of the gate's kind as the gate had items, with the same outcomes: what
    pytest (and pytest-xdist) cost for that many such items, which no plugin can lower."""
    name = write_items_floor(folder, outcomes)
    cmd, env = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, name], None
    split_file = Path(folder) / "split.json"
    if split:
        split_file.unlink(missing_ok=True)
        cmd, env = with_worker_split(cmd, split_file)
    wall, cpu, _, _ = timed(cmd, folder, env)
    return wall, cpu, (json.loads(split_file.read_text()) if split and split_file.is_file() else None)


def pytest_floor(extra):
    """(wall s, CPU s) of the same pytest on an empty folder: start, plugins, no test."""
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-floor-") as folder:
        wall, cpu, _, _ = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra], folder)
        return wall, cpu


def print_timeline(runs, n):
    """Where each -n N run's wall time went (worker_split.py's timeline), against the Runner
    alone's start-up and cases, and the medians: before the first item, the items, after them."""
    parts = []
    for k, (r, alone) in enumerate(runs):
        t = (r[6] or {}).get("timeline") or {}
        if not {"first_s", "last_s", "finish_s"} <= set(t):
            continue
        parts.append((t["first_s"], t["last_s"] - t["first_s"], r[0] - t["last_s"], alone[2], alone[0] - alone[2]))
        print(f"  run {k + 1}, from the pytest process's start: session start {t.get('session_s', 0):.2f} s, the "
              f"workers' collections in {t.get('collected_s', 0):.2f} s, first report {t['first_s']:.2f} s, last "
              f"{t['last_s']:.2f} s, session finish {t['finish_s']:.2f} s, exit {r[0]:.2f} s")
    if parts:
        med = [statistics.median(p[i] for p in parts) for i in range(5)]
        print(f"-n {n}, where the wall time goes (medians): before the first item's report {med[0]:.2f} s (the Runner "
              f"alone: its first worker up with one case, {med[3]:.2f} s); from the first report to the last "
              f"{med[1]:.2f} s (the Runner alone's cases after that: {med[4]:.2f} s); after the last report, to "
              f"the exit, {med[2]:.2f} s")


PARTS = ("one", "jobs1", "n2", "floors")


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/bench_gate.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ggml-src", metavar="DIR", help="ggml tree (default: the pinned default)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default=",".join(PARTS), metavar="PARTS",
                   help=f"comma-separated, of {', '.join(PARTS)} (default: all): fewer parts, more repetitions "
                        "in the same time")
    p.add_argument("--xdist", type=int, default=2, metavar="N",
                   help="the n2 part runs -n N against the Runner alone with N workers (default 2); more "
                        "workers than cores shows how the items are spread over xdist's workers")
    args = p.parse_args(argv)
    n = args.xdist
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        p.error(f"--only: {', '.join(unknown) or 'nothing'} is not one of {', '.join(PARTS)}")
    extra = [f"--gradgate-ggml-src={args.ggml_src}"] if args.ggml_src else []
    source = resolve_source(args.ggml_src)
    library = ensure_build(source.root, BuildOptions()).library
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cases = bench_reference.suite_cases()
    # the workers start on the smallest case: the gate's first is a long one (gate/order.py)
    smallest = min(range(len(cases)), key=lambda i: cases[i].n_param_elements())
    # the gate runs the baseline's known failures in a fresh child at once: so does the Runner alone
    known = bench_reference.known_failure_indexes(cases) if args.ggml_src is None else []

    # Each pytest run is compared with the Runner alone run right before it and right after
    # it (their mean), with as many workers: this machine's speed drifts (the same suite took
    # 13 to 18 CPU seconds within minutes), and a Runner alone taken a run or two away moved
    # a ratio by more than the gaps measured. Consecutive pytest runs share the run between them.
    last_alone = {}

    def runner_alone(workers):
        r = bench_reference.run_ours(cases, library, workers, warm=smallest, fresh=known)[0]
        last_alone[workers] = (r["startup_s"] + r["wall_s"], r["cpu_s"], r["startup_s"])
        return last_alone[workers]

    def bracketed(workers, run):
        """(run(), (wall, CPU s, start-up s) of the Runner alone: the mean of the runs before
        and after; start-up: its first worker's start with one case, within the wall)."""
        before = last_alone.get(workers) or runner_alone(workers)
        measured = run()
        after = runner_alone(workers)
        return measured, tuple((b + a) / 2 for b, a in zip(before, after))
    variants = bench_reference.plugin_variants()
    # each: [(pytest_run's tuple, the Runner alone's (wall, CPU s, start-up s)), ...] per variant
    ahead, two, one = {v: [] for v in variants}, {v: [] for v in variants}, {v: [] for v in variants}
    floors = {v: ([], []) for v in variants}
    floor_cpu = {v: ([], []) for v in variants}
    # the same pytest with as many empty items of the same outcomes: one process, -n N
    item_floors = {v: ([], []) for v in variants}
    outcomes_seen = {}
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-gate-") as folder, \
            tempfile.TemporaryDirectory(prefix="gradgate-bench-items-") as items_folder:
        pytest_run(folder, extra + ["-k", "dup and none and not get_rows"])   # warm caches
        for _ in range(args.repeat):
            for v in variants:
                if "one" in parts:
                    ahead[v].append(bracketed(jobs, lambda: pytest_run(folder, extra + list(v))))
                if "n2" in parts:
                    two[v].append(bracketed(n, lambda: pytest_run(folder, extra + ["-n", str(n)] + list(v), split=True)))
                if "jobs1" in parts:
                    one[v].append(bracketed(1, lambda: pytest_run(folder, extra + ["--gradgate-jobs", "1"] + list(v))))
            if "floors" in parts:
                for v in variants:
                    for k, floor in enumerate((pytest_floor(list(v)), pytest_floor(["-n", str(n)] + list(v)))):
                        floors[v][k].append(floor[0])
                        floor_cpu[v][k].append(floor[1])
                    if v not in outcomes_seen:   # the gate's outcomes, from one full run
                        runs = ahead[v] or two[v] or one[v]
                        outcomes_seen[v] = runs[-1][0][5] if runs else pytest_run(folder, extra + list(v))[5]
                    for k, mode in enumerate(([], ["-n", str(n)])):
                        item_floors[v][k].append(items_floor(items_folder, outcomes_seen[v], mode + list(v),
                                                             split=bool(mode)))

    def med(values):
        return statistics.median(values)

    def ratio(runs, k):
        """Median and range of each run's [k] over its Runner alone's (k 0: wall, 4: CPU s)."""
        each = [r[k] / a[0 if k == 0 else 1] for r, a in runs]
        return bench_reference.spread(each), med(each)

    def against_durations(runs):
        """ratio() of each run's wall time over the sum of its own cases' durations."""
        return ratio([(r, (r[1], None)) for r, _ in runs], 0)

    def alone_of(runs, k=0):
        return med(a[k] for _, a in runs)

    def field(runs, k):
        return med(r[k] for r, _ in runs)
    any_runs = next((runs for runs in (ahead[()], two[()], one[()]) if runs), None)
    n_cases = any_runs[0][0][2] if any_runs else sum(outcomes_seen[()].values())
    print(f"ggml {source.version} from {source.label}; {n_cases} cases; {args.repeat} repetitions, "
          f"medians and ranges over them; each pytest run against the mean of the Runner alone runs right "
          f"before and after it; {jobs} CPUs; {bench_reference.install_description()}")
    if ahead[()]:
        runs = ahead[()]
        by_durations, h1 = against_durations(runs)
        by_alone, h2 = ratio(runs, 0)
        print(f"pytest --gradgate, one process, {jobs} cases at once: {field(runs, 0):.1f} s wall; (a) against its "
              f"cases' own durations ({field(runs, 1):.1f} s): {by_durations} (goal: at most 1.3x; flattered by "
              f"cases sharing the cores); (b) against the Runner alone, {jobs} workers, same cases "
              f"({alone_of(runs):.1f} s): {by_alone}; exit {runs[0][0][3]}")
        print(f"HEADLINE one process: {max(h1, h2):.2f}x")

    def jobs_one(v):
        runs = one[v]
        return (f"{field(runs, 0):.1f} s wall; against its cases' durations ({field(runs, 1):.1f} s): "
                f"{against_durations(runs)[0]} (goal: at most 1.3x); against the Runner "
                f"alone, 1 worker ({alone_of(runs):.1f} s): {ratio(runs, 0)[0]}")
    if one[()]:
        print(f"pytest --gradgate --gradgate-jobs 1: {jobs_one(())}")
    if two[()]:
        print(f"pytest --gradgate -n {n}: {field(two[()], 0):.1f} s wall; against the Runner alone, {n} workers, "
              f"same cases ({alone_of(two[()]):.1f} s): {ratio(two[()], 0)[0]} (goal: at most 1.3x)")
        print(f"HEADLINE -n {n}: {ratio(two[()], 0)[1]:.2f}x")
        for k, (r, _) in enumerate(two[()]):
            workers = (r[6] or {}).get("workers")
            if workers:
                ends = [w["done_s"] for w in workers.values()]
                print(f"  run {k + 1}, per xdist worker (items; their call phases' durations; last item done, from "
                      f"the session's start): " + "; ".join(
                          f"{name} {w['items']}, {w['call_s']:.1f} s, {w['done_s']:.1f} s" for name, w in
                          sorted(workers.items())) + f"; the last worker done {max(ends) - min(ends):.1f} s after the first")
        print_timeline(two[()], n)
        procs = by_process([r[6] for r, _ in two[()]])
        if procs is not None:
            rest = field(two[()], 4) - procs[0] - n * procs[1]
            print(f"-n {n}, CPU seconds by process (medians): the controller {procs[0]:.2f} s; each xdist worker "
                  f"{procs[1]:.2f} s (its own process to its session's finish: its case worker not included); the "
                  f"rest of the tree, {rest:.1f} s: the case workers and their children, and every process's end")
        gate_hooks = by_hook([r[6] for r, _ in two[()]])
        if gate_hooks is not None:
            print(f"-n {n}, CPU seconds of each xdist worker's main thread inside pytest's runtest hooks (medians; "
                  f"a wait for a case spends none): {hooks_text(gate_hooks)}")
    if "floors" in parts:
        f1, f2 = floors[()]

        def beyond(runs, floor):
            each = [(r[0] - f) / a[0] for (r, a), f in zip(runs, floor)]
            return f"{med(each):.2f}x" if each else "not run"
        print(f"pytest's floor here (same pytest and plugins, empty folder): {med(f1):.1f} s in one process, "
              f"{med(f2):.1f} s with -n {n}; beyond it, against the Runner alone: one process "
              f"{beyond(ahead[()], f1)}, --gradgate-jobs 1 {beyond(one[()], f1)}, -n {n} {beyond(two[()], f2)}")
    # CPU seconds: what every process of a run did, whatever else the machine was doing. On a
    # shared machine they move far less than wall time; with the cores saturated (the Runner
    # alone keeps both busy) wall time follows them
    for v in variants:
        label = "as installed" if v == () else " ".join(v)
        shown = []
        if ahead[v]:
            shown.append(f"one process {field(ahead[v], 4):.1f} s, {ratio(ahead[v], 4)[0]} the Runner alone's "
                         f"({alone_of(ahead[v], 1):.1f} s, its process start included)")
        if two[v]:
            shown.append(f"-n {n} {field(two[v], 4):.1f} s, {ratio(two[v], 4)[0]} the Runner alone's with {n} workers "
                         f"({alone_of(two[v], 1):.1f} s)")
        if "floors" in parts:
            shown.append(f"pytest's floor {med(floor_cpu[v][0]):.1f} s / {med(floor_cpu[v][1]):.1f} s")
        if shown:
            print(f"CPU seconds of every process ({label}): " + "; ".join(shown))
    # pytest's cost per item, measured on empty items: of what a gate run costs over the
    # Runner alone, the part that is pytest's whatever a plugin does, and the rest
    if "floors" in parts:
        for v in variants:
            label = "as installed" if v == () else " ".join(v)
            (w1, w2), outcomes = item_floors[v], outcomes_seen[v]
            shown = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            cpu1, cpu2 = med(f[1] for f in w1), med(f[1] for f in w2)
            over = []
            if ahead[v]:
                over1 = field(ahead[v], 4) - alone_of(ahead[v], 1)
                over.append(f"one process {over1:.1f} s ({over1 - cpu1:+.1f} s beyond the empty items')")
            if two[v]:
                over2 = field(two[v], 4) - alone_of(two[v], 1)
                over.append(f"-n {n} {over2:.1f} s ({over2 - cpu2:+.1f} s beyond)")
            print(f"pytest's floor with {sum(outcomes.values())} empty items of the gate's outcomes ({shown}; {label}): "
                  f"one process {med(f[0] for f in w1):.1f} s wall, {cpu1:.1f} CPU s; -n {n} {med(f[0] for f in w2):.1f} s "
                  f"wall, {cpu2:.1f} CPU s." + (f" The gate's CPU over the Runner alone's: {', '.join(over)}" if over else ""))
            procs = by_process([f[2] for f in w2])
            if procs is not None:
                print(f"  the empty items under -n {n}, CPU seconds by process (medians): the controller {procs[0]:.2f} s; "
                      f"each xdist worker {procs[1]:.2f} s (as for the gate's runs above)")
            floor_hooks = by_hook([f[2] for f in w2])
            gate_hooks = by_hook([r[6] for r, _ in two[v]]) if two[v] else None
            if floor_hooks is not None and gate_hooks is not None:
                # the same pytest code, per hook: what it costs beside the cases' compute, against alone
                print(f"  each xdist worker's main thread inside pytest's runtest hooks, CPU s (medians; the gate's "
                      f"run / the empty items'): {hooks_text(gate_hooks, floor_hooks)}")
    blocked = bench_reference.NO_HYPOTHESIS
    if blocked in ahead:
        shown = []
        if ahead[blocked]:
            shown.append(f"one process {field(ahead[blocked], 0):.1f} s: {ratio(ahead[blocked], 0)[0]} the Runner alone")
        if two[blocked]:
            shown.append(f"-n {n} {field(two[blocked], 0):.1f} s: {ratio(two[blocked], 0)[0]}")
        if "floors" in parts:
            g1, g2 = floors[blocked]
            shown.append(f"pytest's floor {med(g1):.1f} s / {med(g2):.1f} s")
        if one[blocked]:
            shown.append(f"--gradgate-jobs 1: {jobs_one(blocked)}")
        print(f"default install (Hypothesis's pytest plugin blocked, {' '.join(blocked)}; Hypothesis is only the "
              f"explore extra): " + "; ".join(shown))
    else:
        print("Hypothesis's pytest plugin is not installed here: the figures above are a default install's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
