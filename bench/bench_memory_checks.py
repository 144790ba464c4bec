"""What the memory checks cost (issues 44, 51): guard zones, unwritten elements, the backward
run again on one thread, and the allocation regimes (check/memory.py, check/determinism.py,
check/regimes.py).

    python bench/bench_memory_checks.py [--repeat 3] [--ggml-src DIR] [--before-python PATH]

1. Their share of the engine's time: every full-mode case of the built-in suite, run through
   the Runner (isolate=case) once, and the seconds the engine itself spent in the checks
   (Result.timings "memory-checks", "determinism" and "allocation") against the sum of the cases' durations
   (the engine's work inside the child; isolation and pytest not included, so the share is of
   the smallest total, the least flattering one).
2. The built-in suite's wall time as a user runs it, `pytest --gradgate -q -p no:cacheprovider`
   in one process from an empty folder (cached build, interpreter start and collection
   included), --repeat times. With --before-python, the same command with another install's
   Python (a venv with the release before the checks: `pip install -e` of that commit),
   interleaved with this one's so a drift of the machine's speed falls on both; the ratio
   after/before is the median of each repetition's ratio.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.isolation.parent import Runner
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.library.source import resolve_source

SUITE = Path(pytest_gradgate.__file__).resolve().parent / "cases.yaml"


def engine_share(library):
    """(seconds in the memory checks, in the determinism run, in the allocation regimes (ggml-opt's
    run included), in ggml-opt's run alone, sum of durations, cases)."""
    loaded, errors = load_file(SUITE, builtin=True)
    if errors:
        sys.exit(f"{SUITE}: {errors[0]}")
    cases = [c for entry in loaded for c in entry.cases if c.mode == "full"]
    memory = determinism = alloc = opt = total = 0.0
    runner = Runner(library, isolate="case")
    try:
        for case in cases:
            r = runner.run(case)
            memory += r.timings.get("memory-checks", 0.0)
            determinism += r.timings.get("determinism", 0.0)
            alloc += r.timings.get("allocation", 0.0) + r.timings.get("ggml-opt", 0.0)
            opt += r.timings.get("ggml-opt", 0.0)
            total += r.duration
    finally:
        runner.close()
    return memory, determinism, alloc, opt, total, len(cases)


def suite_wall(python, ggml_src):
    """Seconds of one `pytest --gradgate` run of the built-in suite from an empty folder."""
    cmd = [python, "-m", "pytest", "--gradgate", "-q", "-p", "no:cacheprovider"]
    if ggml_src:
        cmd.append(f"--gradgate-ggml-src={ggml_src}")
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        took = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took, done.stdout.strip().splitlines()[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ggml-src", default=None, help="ggml under test (default: the pinned ggml)")
    parser.add_argument("--before-python", default=None,
                        help="the Python of another install, timed on the same suite for comparison")
    args = parser.parse_args(argv)
    source = resolve_source(args.ggml_src, None)
    library = ensure_build(source.root, BuildOptions()).library
    print(f"ggml {source.version} ({source.label}); {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at start")
    memory, determinism, alloc, opt, total, n = engine_share(library)
    print(f"engine: {n} full-mode cases, {total:.2f} s of case durations; memory checks {memory:.3f} s "
          f"({100 * memory / total:.1f}%), determinism run {determinism:.3f} s ({100 * determinism / total:.1f}%), "
          f"allocation regimes {alloc:.3f} s ({100 * alloc / total:.1f}%; ggml-opt's run {opt:.3f} s of it)")
    after, before = [], []
    for _ in range(args.repeat):
        if args.before_python:
            before.append(suite_wall(args.before_python, args.ggml_src))
        after.append(suite_wall(sys.executable, args.ggml_src))
    walls = [t for t, _ in after]
    print(f"suite, one process: {statistics.median(walls):.2f} s median ({min(walls):.2f}..{max(walls):.2f}) "
          f"over {args.repeat} runs with {pytest_gradgate.__file__}; last line: {after[-1][1]}")
    if before:
        old = [t for t, _ in before]
        ratios = [a / b for a, b in zip(walls, old)]
        print(f"  before ({args.before_python}): {statistics.median(old):.2f} s median ({min(old):.2f}..{max(old):.2f}); "
              f"last line: {before[-1][1]}")
        print(f"  after / before: {statistics.median(ratios):.2f}x median ({min(ratios):.2f}..{max(ratios):.2f})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
