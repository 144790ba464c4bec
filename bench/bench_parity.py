"""What a parity item costs: the KV walk at Qwen2.5-1.5B head sizes against a reference tree.

    python bench/bench_parity.py [--ggml-src DIR] [--reference-src DIR] [--repeat 3]

Runs the gate as a user would (`pytest --gradgate --gradgate-ggml-src A
--gradgate-reference-src B -k kv_walk_chunked_1p5b`, in a subprocess, builds cached) and
prints each parity item's call time from pytest's --durations, the median over --repeat
runs: both sides' backward (each formulation once, no finite differences), their transfer
through a .npz file, and the comparison. The issue's target is under 2 s per item.

Without --ggml-src / --reference-src both sides are a copy of the default ggml with a correct
CONCAT backward (tests/ggml_variants.py 'concat-fixed'): the default ggml has none, and the
walk concatenates.
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.library.source import default_ggml_root

CALL = re.compile(r"^\s*([0-9.]+)s call\s+\S*::(kv_walk_chunked_1p5b\[[^\]]+\])")


def concat_fixed(workdir):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ggml_variants import make_variant
    root = make_variant(default_ggml_root(), Path(workdir) / "concat-fixed" / "ggml", "concat-fixed")
    ensure_build(root, BuildOptions())
    return root


def call_times(tested, reference, workdir):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "-k", "kv_walk_chunked_1p5b",
                           "--gradgate-ggml-src", str(tested), "--gradgate-reference-src", str(reference),
                           "-p", "no:cacheprovider", "-p", "no:xdist", "--durations=0", "-q"],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    times = {m.group(2): float(m.group(1)) for m in map(CALL.match, proc.stdout.splitlines()) if m}
    if not times:
        raise SystemExit(f"no parity item ran:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return times, proc.returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ggml-src", help="the tree under test (default: concat-fixed)")
    p.add_argument("--reference-src", help="the reference tree (default: the tree under test)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-parity-") as workdir:
        tested = Path(args.ggml_src) if args.ggml_src else concat_fixed(workdir)
        reference = Path(args.reference_src) if args.reference_src else tested
        runs = [call_times(tested, reference, workdir) for _ in range(args.repeat)]
    print(f"parity items of kv_walk_chunked_1p5b (q [128, 12, 256], k and v [128, 2, 256]), {tested} against "
          f"{reference}, median of {args.repeat} runs (pytest exit status {runs[-1][1]}):")
    for item in runs[0][0]:
        values = [times[item] for times, _ in runs if item in times]
        print(f"  {item}: {statistics.median(values):.2f} s per item (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
