"""What an equivalence case costs, and how far correct formulations stay from its limit.

    python bench/bench_equivalence.py [--seeds 20] [--ggml-src DIR] [--repeat 3]

For each built-in equivalence case (pytest_gradgate/cases_equivalence.yaml), isolated as
the gate runs it: the wall time per item, against the same graph (each formulation on its
own) checked in fast mode (random directions, check/directional.py), which is what the gate
would otherwise need at such sizes; and, over --seeds seeds, the largest NMSE / limit of a
gradient that the roundoff limit (check/roundoff.py) allowed. A ratio near 1 would mean
the limit is about to false-alarm on correct formulations.

The default ggml has no CONCAT backward, so by default it runs on a copy of it with a
correct one (tests/ggml_variants.py 'concat-fixed'); --ggml-src runs on another tree.
"""

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.library.source import default_ggml_root, resolve_source
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.isolation.parent import Runner

FILE = Path(pytest_gradgate.__file__).resolve().parent / "cases_equivalence.yaml"


def library(ggml_src, workdir):
    if ggml_src:
        return ensure_build(resolve_source(ggml_src, None).root, BuildOptions()).library
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ggml_variants import make_variant
    root = make_variant(default_ggml_root(), Path(workdir) / "concat-fixed" / "ggml", "concat-fixed")
    return ensure_build(root, BuildOptions()).library


def timed(runner, case, repeat):
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = runner.run(case)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def fast_mode_twin(case, formulation):
    """The same graph as a fast-mode finite-difference case (default directions)."""
    return dataclasses.replace(case, graph=case.equivalent[formulation], equivalent={}, mode="fast")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds for the NMSE / limit figures (default 20)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per item (the median is printed)")
    ap.add_argument("--ggml-src", default=None, help="a ggml tree with a CONCAT backward (default: concat-fixed)")
    ap.add_argument("-k", default="", help="only cases whose id contains this")
    args = ap.parse_args(argv)
    loaded, errors = load_file(FILE, builtin=True)
    if errors:
        raise SystemExit(str(errors[0]))
    cases = [c for e in loaded for c in e.cases if args.k in c.id]
    with tempfile.TemporaryDirectory() as workdir:
        runner = Runner(library(args.ggml_src, workdir), isolate="case")
        try:
            print(f"{'case':58s} {'equiv s':>8s} {'fast-mode s (per formulation)':>32s} {'max NMSE/limit':>15s}")
            for case in cases:
                seconds, result = timed(runner, case, args.repeat)
                fast = []
                for name in case.equivalent:
                    s, r = timed(runner, fast_mode_twin(case, name), 1)
                    fast.append(f"{name} {s:.2f} ({r.status})")
                worst = 0.0
                for seed in range(args.seeds):
                    r = result if seed == case.seed else runner.run(dataclasses.replace(case, seed=seed))
                    if r.status != "passed":
                        print(f"  {case.id} seed {seed}: {r.status}: {r.diagnosis or r.message}")
                        continue
                    worst = max([worst] + [m["nmse"] / m["limit"] for m in r.params])
                print(f"{case.id:58s} {seconds:8.2f} {', '.join(fast):>32s} {worst:15.2e}")
        finally:
            runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
