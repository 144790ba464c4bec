"""What each pytest process (each pytest-xdist worker too) pays before its first case, with
the memos that carry it from one process to the next and without them.

    python bench/bench_collect.py [--repeat 9]

1. The build's cache key for the default ggml, in this process: cache_key() with the tree's
   digest taken from its stat memo (library/tree_digest.py), against the same key with the
   tree hashed (1,100 files, 19 MB), as it was for every process before the memo. Both
   include the compiler identity (two `--version` runs), which the memo does not carry.
2. `pytest --gradgate --collect-only -q` of the built-in suite in an empty folder, start to
   exit, with the collection memo (declare/collection_memo.py) in the cache, against the same
   run with the memos removed before it (so it loads the YAML and writes them again; the
   build's key is not computed here, nothing is built). Runs alternate; also pytest's own
   "collected in" figure, which leaves out its start-up.

Run it with the Python of the environment to measure (a venv with the wheel, as for
bench_gate.py); it uses the user cache and the build of the default ggml in it.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from pytest_gradgate.library import tree_digest
from pytest_gradgate.library.cmake import BuildOptions, cache_key
from pytest_gradgate.library.source import default_ggml_root
from pytest_gradgate.declare import collection_memo

COLLECTED = re.compile(r"(\d+) tests? collected in ([0-9.]+)s")


def key_seconds(root, repeat):
    """(with the memo, hashed): seconds per cache_key() call, each the median of `repeat`."""
    cache_key(root, BuildOptions())            # writes the memo (the default tree is old)
    with_memo = []
    for _ in range(repeat):
        started = time.perf_counter()
        cache_key(root, BuildOptions())
        with_memo.append(time.perf_counter() - started)
    real_read = tree_digest._read_memo
    tree_digest._read_memo = lambda *args, **kwargs: None    # every call hashes, as before the memo
    try:
        hashed = []
        for _ in range(repeat):
            started = time.perf_counter()
            cache_key(root, BuildOptions())
            hashed.append(time.perf_counter() - started)
    finally:
        tree_digest._read_memo = real_read
    return with_memo, hashed


def collect_once(folder):
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:hypothesispytest"], cwd=folder, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300)
    wall = time.perf_counter() - started
    found = COLLECTED.search(proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"pytest --gradgate --collect-only failed:\n{proc.stdout[-2000:]}")
    return wall, float(found.group(2)), int(found.group(1))


def ms(values):
    return f"median {statistics.median(values) * 1e3:.0f} ms (min {min(values) * 1e3:.0f})"


def main():
    parser = argparse.ArgumentParser(prog="bench/bench_collect.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    root = default_ggml_root()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; python {sys.executable}")
    with_memo, hashed = key_seconds(root, args.repeat)
    print(f"build key of {root}, {args.repeat} calls each: with the tree's stat memo {ms(with_memo)}; "
          f"hashing the tree {ms(hashed)}")
    memos = collection_memo.memo_dir()
    runs = {"memo": [], "none": []}
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-collect-") as folder:
        collect_once(folder)          # the memos are there for the first "memo" run
        for _ in range(args.repeat):
            runs["memo"].append(collect_once(folder))
            shutil.rmtree(memos, ignore_errors=True)
            runs["none"].append(collect_once(folder))
    items = runs["memo"][0][2]
    for name, label in (("memo", "with the collection memo"), ("none", "memos removed before each run")):
        print(f"pytest --gradgate --collect-only, {items} items, {args.repeat} runs, {label}: start to exit "
              f"{ms([r[0] for r in runs[name]])}; pytest's 'collected in' {ms([r[1] for r in runs[name]])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
