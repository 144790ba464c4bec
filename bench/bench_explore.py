"""gradgate explore's figures: random cases per second, and the time to first finding per bug.

    python bench/bench_explore.py [--throughput-s 30] [--find-s 60] [--seed 0] [--skip-all-ops] [--throughput-only]

1. Throughput on the default ggml: cases per second with 1 job and with 2 jobs (the target,
   issue 15: at least 50 per second on a 2-core machine), and the CPU seconds one case costs
   in all processes together (search, worker, forked children), so that the rate on two cores
   of one's own can be read off a machine that others load too: 2 / (CPU s per case).
2. For each variant of tests/ggml_variants.py that the built-in suite does not catch
   (scale-negative, rms-norm-eps, repeat-ne3): the seconds until explore first reports the
   planted bug (a new wrong-gradient finding of that op), searching that op alone, and
   searching every op of the table (unless --skip-all-ops), each with --find-s as its budget,
   plus the shrunk case's op count.
"""

import argparse
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ggml_variants import UNCAUGHT_VARIANTS, make_variant  # noqa: E402

from pytest_gradgate.library.cache import cache_root  # noqa: E402
from pytest_gradgate.library.cmake import BuildOptions, ensure_build  # noqa: E402
from pytest_gradgate.library.source import default_ggml_root  # noqa: E402
from pytest_gradgate.declare.expr import ops_used, parse_graph  # noqa: E402
from pytest_gradgate.explore import findings, search  # noqa: E402
from pytest_gradgate.gate.baseline import Baseline  # noqa: E402
from pytest_gradgate.gate.selection import PACKAGE_DIR  # noqa: E402

PLANTED_OP = {"scale-negative": "scale", "rms-norm-eps": "rms_norm", "repeat-ne3": "repeat"}
TARGET_PER_S = 50.0


def _cpu_s():
    """CPU seconds of this process and of every child it has waited for (their children too)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def variant_library(default_root, name):
    dest = cache_root() / "bench-variants" / name / "ggml"
    if not (dest / "src" / "ggml.c").is_file():
        make_variant(default_root, dest, name)
    return ensure_build(dest, BuildOptions(), progress=None).library


def first_finding(library, op, budget, seed, ops, baseline):
    found, stats = search.explore(library, budget, seed=seed, ops=ops, baseline=baseline)
    findings.mark_known(found, baseline)
    hits = [f for f in found if f.key[0] == op and f.result["status"] == "failed" and f.known is None]
    if not hits:
        return None, None, stats
    first = min(hits, key=lambda f: f.found_after_s)
    return first.found_after_s, len(ops_used(parse_graph(first.mapping["graph"]))), stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--throughput-s", type=float, default=30.0)
    p.add_argument("--find-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-all-ops", action="store_true")
    p.add_argument("--throughput-only", action="store_true", help="part 1 only (no variant builds)")
    args = p.parse_args(argv)
    default_root = default_ggml_root()
    library = ensure_build(default_root, BuildOptions()).library
    baseline = Baseline.load(PACKAGE_DIR / "gate" / "baseline_default.json")

    print(f"## Throughput on the default ggml ({args.throughput_s:g} s each)\n")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    print("| jobs | cases | cases/s | passed | failing | discarded | CPU ms per case | 2 / CPU per case |")
    print("|---|---|---|---|---|---|---|---|")
    for jobs in (1, 2):
        before = _cpu_s()
        _, stats = search.explore(library, args.throughput_s, seed=args.seed, jobs=jobs, baseline=baseline)
        c = stats["counts"]
        runs = c["cases"] + c.get("confirmations", 0)
        per_case = (_cpu_s() - before) / max(runs, 1)
        print(f"| {jobs} | {c['cases']} | {stats['cases_per_s']:.1f} | {c['passed']} | {c['findings']} | "
              f"{c['discarded']} | {per_case * 1000:.1f} | {2 / per_case:.0f}/s |", flush=True)
    print(f"\ntarget: {TARGET_PER_S:g} cases/s on 2 cores; load average after: {os.getloadavg()[0]:.2f}\n")

    if args.throughput_only:
        return 0
    print(f"## Time to first finding of each planted bug (budget {args.find_s:g} s, seed {args.seed})\n")
    print("| variant | ops searched | first finding after | ops in the shrunk case | cases/s |")
    print("|---|---|---|---|---|")
    for name in UNCAUGHT_VARIANTS:
        lib = variant_library(default_root, name)
        op = PLANTED_OP[name]
        searches = [(op, [op])] + ([] if args.skip_all_ops else [("all", None)])
        for label, ops in searches:
            after, n_ops, stats = first_finding(lib, op, args.find_s, args.seed, ops, baseline)
            when = f"{after:.1f} s" if after is not None else f"not found in {args.find_s:g} s"
            print(f"| {name} | {label} | {when} | {n_ops if n_ops else '-'} | {stats['cases_per_s']:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
