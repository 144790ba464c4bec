"""Isolation overhead per case: fork-per-case and worker vs in-process, on the same cases.

    python bench/bench_isolation.py [--cases 100] [--repeat 5] [--ggml-src DIR]

Takes the first --cases cases of the built-in suite (pytest_gradgate/cases.yaml) that pass
on the ggml under test (found by one isolated pass first, so no case can kill the bench
in-process; the list is cycled if the suite passes fewer), then times the whole list
--repeat times in each mode, each with a started, warm worker:

  in-process   run_case() in this process (the engine's own cost)
  worker       isolate=worker: a JSON round trip to a worker that runs the case itself
  fresh        isolate=fresh: the worker forks a fresh child for every case
  case         isolate=case (the default): forked children, each taking case after case
               (every case here passes, so one child runs them all, up to its limit)

and prints per-case medians and the overhead of each mode over in-process. The target
(issue 4) is an isolate=case overhead under 5 ms per case on a 2-core CI machine.

Then what a red verdict costs: the suite's cases that fail (a wrong gradient, not a crash) on
the ggml under test, at most --cases of them, timed the same way in-process and each in a
fresh child, as the default runs every red verdict (a known failure starts there at once:
Runner.run(case, fresh=True)). The fresh child inherits only what the worker ran, so this is
where first-use costs that the worker's warm-up does not reach show (isolation/worker.py).
"""

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.library import binding
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.check.engine import run_case
from pytest_gradgate.isolation.parent import Runner
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.library.source import resolve_source

SUITE = Path(pytest_gradgate.__file__).resolve().parent / "cases.yaml"
TARGET_MS = 5.0


def suite_cases(library, n):
    """(n passing cases, at most n failing ones) of the built-in suite's full-mode cases, as
    one isolated pass finds them on this ggml; the passing list is cycled to n."""
    loaded, errors = load_file(SUITE, builtin=True)
    if errors:
        sys.exit(f"{SUITE}: {errors[0]}")
    runner = Runner(library, isolate="case")
    passing, failing = [], []
    try:
        for case in (c for entry in loaded for c in entry.cases if c.mode == "full"):
            status = runner.run(case).status
            if status == "passed" and len(passing) < n:
                passing.append(case)
            elif status == "failed" and len(failing) < n:
                failing.append(case)
            if len(passing) == len(failing) == n:
                break
    finally:
        runner.close()
    if not passing:
        sys.exit("no case of the built-in suite passes on this ggml: nothing to time")
    return [passing[i % len(passing)] for i in range(n)], failing


def cpu_seconds(worker_pid=None):
    """CPU time of this process, plus the worker's and that of the children it reaped.

    Wall time on a shared machine measures the neighbours too; CPU time is what a case
    costs whoever else is running (the worker's share read from /proc, in clock ticks)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    if worker_pid is not None:
        fields = Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    return total


def time_mode(mode, cases, library, repeat):
    """(wall s/case of each repetition, CPU s/case over all): one untimed pass first. Mode
    "red": isolate=case with every case in a fresh child, as the default runs red verdicts."""
    if mode == "red":
        runner = Runner(library, isolate="case")
        run, close = (lambda case: runner.run(case, fresh=True)), runner.close
        pid = lambda: runner.worker.proc.pid  # noqa: E731
    elif mode == "in-process":
        lib = binding.load(library)
        run = lambda case: run_case(case, lib)  # noqa: E731
        close = lambda: None  # noqa: E731
        pid = lambda: None  # noqa: E731
    else:
        runner = Runner(library, isolate=mode)
        run, close = runner.run, runner.close
        pid = lambda: runner.worker.proc.pid  # noqa: E731
    try:
        for case in cases:
            run(case)
        worker_pid = pid()
        cpu_started = cpu_seconds(worker_pid)
        per_case = []
        for _ in range(repeat):
            started = time.perf_counter()
            for case in cases:
                run(case)
            per_case.append((time.perf_counter() - started) / len(cases))
        if pid() != worker_pid:
            sys.exit(f"{mode}: the worker was replaced during the timing (a case crashed?)")
        return per_case, (cpu_seconds(worker_pid) - cpu_started) / (repeat * len(cases))
    finally:
        close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ggml-src", default=None, help="ggml under test (default: the pinned ggml)")
    args = parser.parse_args(argv)

    source = resolve_source(args.ggml_src, None)
    library = ensure_build(source.root, BuildOptions()).library
    cases, failing = suite_cases(library, args.cases)
    print(f"ggml {source.version} ({source.label}); {len(cases)} cases "
          f"({len({c.id for c in cases})} distinct) from {SUITE.name}; median of {args.repeat} repetitions; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    medians, cpus = {}, {}
    print(f"  {'mode':<11} {'wall ms/case':>12} {'(min..max)':>16} {'overhead':>9} {'CPU ms/case':>12} {'overhead':>9}")
    for mode in ("in-process", "worker", "fresh", "case"):
        runs, cpus[mode] = time_mode(mode, cases, library, args.repeat)
        medians[mode] = statistics.median(runs)
        spread = f"({min(runs) * 1e3:.2f}..{max(runs) * 1e3:.2f})"
        wall_over = (medians[mode] - medians["in-process"]) * 1e3
        cpu_over = (cpus[mode] - cpus["in-process"]) * 1e3
        print(f"  {mode:<11} {medians[mode] * 1e3:12.2f} {spread:>16} {wall_over:9.2f} {cpus[mode] * 1e3:12.2f} "
              f"{cpu_over:9.2f}")
    fork_overhead = (medians["case"] - medians["in-process"]) * 1e3
    verdict = "meets" if fork_overhead < TARGET_MS else "MISSES"
    print(f"isolate=case overhead {fork_overhead:.2f} ms/case wall, "
          f"{(cpus['case'] - cpus['in-process']) * 1e3:.2f} ms/case CPU: {verdict} the {TARGET_MS:g} ms target "
          f"(load average {os.getloadavg()[0]:.2f} at the end)")
    if not failing:
        print("red verdicts: no case of the built-in suite fails on this ggml without crashing: not timed")
        return 0
    red = {}
    for mode in ("in-process", "red"):
        runs, cpu = time_mode(mode, failing, library, args.repeat)
        red[mode] = (statistics.median(runs), cpu)
    (wall_in, cpu_in), (wall_red, cpu_red) = red["in-process"], red["red"]
    print(f"red verdicts: {len(failing)} cases of {SUITE.name} that fail on this ggml; in-process "
          f"{wall_in * 1e3:.2f} ms/case wall, {cpu_in * 1e3:.2f} CPU; each in a fresh child (as the default runs a "
          f"red verdict) {wall_red * 1e3:.2f} ms/case wall, {cpu_red * 1e3:.2f} CPU: {(wall_red - wall_in) * 1e3:.2f} ms "
          f"wall, {(cpu_red - cpu_in) * 1e3:.2f} ms CPU a red verdict over in-process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
