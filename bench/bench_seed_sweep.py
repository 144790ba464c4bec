"""Do the verdicts hold when only the seed changes? The whole built-in suite, many seeds.

    python bench/bench_seed_sweep.py [--seeds 20] [--first-seed 0] [--ggml-src DIR]

Runs every case of the built-in suite (pytest_gradgate/cases.yaml, full mode,
cases_fast.yaml, fast mode, and cases_equivalence.yaml, formulations against each other) with `seed:` set to each of --seeds values, isolated as the gate
runs them, on the default ggml (or --ggml-src), and sorts each result against the shipped
baseline (pytest_gradgate/gate/baseline_default.json):

  unexpected failure    red, not a known failure of this ggml, not a case the built-in suite
                        skips (no backward, a consumer that fails on its own): a false alarm,
                        or a real finding that only some inputs show
  pass without evidence passed without power (a scrambled incoming gradient would pass too)
  known                 a failure recorded in the baseline
  inconclusive, numeric-unreliable, skipped   counted: nothing is claimed either way

Targets (issue 13): zero unexpected failures and zero passes without evidence. It prints the
figures, and each case behind a non-zero one (and each inconclusive or numeric-unreliable
one) with its seed and diagnosis; it exits 1 when a target is missed.
"""

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.gate.selection import builtin_nodeid
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.library.source import resolve_source
from pytest_gradgate.check.outcome import FAILING, Diagnosis, Status
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.isolation.parent import Runner

PACKAGE = Path(pytest_gradgate.__file__).resolve().parent
SUITES = (PACKAGE / "cases.yaml", PACKAGE / "cases_fast.yaml", PACKAGE / "cases_equivalence.yaml")
BASELINE = PACKAGE / "gate" / "baseline_default.json"
SKIPPED_KINDS = (Diagnosis.NO_BACKWARD, Diagnosis.CONSUMER_FAILS)   # the built-in suite skips these


def builtin_cases(suites=SUITES):
    cases = []
    for path in suites:
        loaded, errors = load_file(path, builtin=True)
        if errors:
            raise SystemExit(f"{path}: {errors[0]}")
        cases += [c for entry in loaded for c in entry.cases]
    return cases


def classify(result, known):
    """One word for a result, as the gate would treat it with the shipped baseline."""
    if result.status == Status.PASSED:
        if result.mode == "equivalence":    # power is a finite-difference notion; its evidence is the other formulation
            return "passed"
        return "pass without evidence" if result.power is not True else "passed"
    if result.status in FAILING and result.kind in SKIPPED_KINDS:
        return "skipped"
    if result.status in FAILING:
        # the baseline names built-in items by node id: the built-in file, then the case id
        nodeid = f"{builtin_nodeid(result.origin.get('path', ''))}::{result.case_id}"
        return "known" if nodeid in known else "unexpected failure"
    return str(result.status)      # skipped, inconclusive, numeric-unreliable


def sweep(library, seeds, cases=None, progress=None):
    """-> (Counter of classes, [(class, seed, case id, diagnosis)] for all but passed/known/skipped, seconds).

    progress(seed, seconds so far), when given, is called after each seed."""
    known = json.loads(BASELINE.read_text())["entries"]
    cases = builtin_cases() if cases is None else cases
    counts, flagged = Counter(), []
    started = time.perf_counter()
    runner = Runner(library, isolate="case")
    try:
        for seed in seeds:
            for case in cases:
                result = runner.run(dataclasses.replace(case, seed=seed))
                cls = classify(result, known)
                counts[cls] += 1
                if cls in ("unexpected failure", "pass without evidence", "inconclusive", "numeric-unreliable"):
                    flagged.append((cls, seed, case.id, result.diagnosis or result.message))
            if progress:
                progress(seed, time.perf_counter() - started)
    finally:
        runner.close()
    return counts, flagged, time.perf_counter() - started


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--ggml-src", default=None, help="a ggml checkout (default: the pinned default ggml)")
    ap.add_argument("--suite", action="append", choices=[p.name for p in SUITES],
                    help="only this built-in file (repeatable; default: all)")
    args = ap.parse_args(argv)
    build = ensure_build(resolve_source(args.ggml_src, None).root, BuildOptions())
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cases = builtin_cases([p for p in SUITES if not args.suite or p.name in args.suite])
    counts, flagged, seconds = sweep(build.library, seeds, cases,
                                     progress=lambda seed, s: print(f"seed {seed} done ({s:.0f} s)", file=sys.stderr))
    print(f"{len(cases)} built-in cases x {len(seeds)} seeds ({seeds.start}..{seeds.stop - 1}) = "
          f"{sum(counts.values())} runs in {seconds:.0f} s")
    for cls in ("passed", "known", "skipped", "inconclusive", "numeric-unreliable", "unexpected failure",
                "pass without evidence"):
        print(f"  {cls:24s} {counts.get(cls, 0)}")
    for cls, seed, case_id, why in flagged:
        print(f"  {cls}: seed {seed} {case_id}: {why[:200]}")
    return 1 if any(cls in ("unexpected failure", "pass without evidence") for cls, *_ in flagged) else 0


if __name__ == "__main__":
    sys.exit(main())
