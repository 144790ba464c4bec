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
"""

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.build import binding
from pytest_gradgate.build.cmake import BuildOptions, ensure_build
from pytest_gradgate.check.engine import run_case
from pytest_gradgate.isolation.parent import Runner
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.build.source import resolve_source

SUITE = Path(pytest_gradgate.__file__).resolve().parent / "cases.yaml"
TARGET_MS = 5.0


def passing_cases(library, n):
    loaded, errors = load_file(SUITE, builtin=True)
    if errors:
        sys.exit(f"{SUITE}: {errors[0]}")
    runner = Runner(library, isolate="case")
    passing = []
    try:
        for case in (c for entry in loaded for c in entry.cases if c.mode == "full"):
            if runner.run(case).status == "passed":
                passing.append(case)
            if len(passing) == n:
                break
    finally:
        runner.close()
    if not passing:
        sys.exit("no case of the built-in suite passes on this ggml: nothing to time")
    return [passing[i % len(passing)] for i in range(n)]


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
    """(wall s/case of each repetition, CPU s/case over all): one untimed pass first."""
    if mode == "in-process":
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
    cases = passing_cases(library, args.cases)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
