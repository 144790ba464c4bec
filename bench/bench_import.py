"""What installing pytest-gradgate costs every pytest run, and what `--gradgate` adds.

    python bench/bench_import.py [--repeat 15] [--python PATH]

1. Wall and CPU time of `pytest -q test_trivial.py` (one empty test, in an empty folder)
   with the plugin loaded, against the same run with `-p no:gradgate`; runs alternate;
   medians and minima are compared (on a shared 2-core machine wall time scatters by
   +-100 ms, CPU time much less). Target: at most 50 ms more. Both figures include the
   interpreter's start, pytest's own imports and the run; only the plugin differs.
2. Import time of pytest-gradgate's modules and what they pull in (`python -X importtime`,
   cumulative, the pytest_gradgate subtrees), without and with `--gradgate` (the latter a
   `--collect-only` of the built-in suite, so that the loader, the items and YAML load;
   nothing is built). Also which of numpy, cffi and yaml each run imported.

Use --python to measure another environment, e.g. a fresh venv with only the wheel.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("numpy", "cffi", "yaml")
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def timed(cmd, cwd):
    """(wall s, CPU s of the process) of one run."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def gradgate_import_us(stderr):
    """(µs of the pytest_gradgate subtrees, modules imported) from -X importtime's report.

    The report is post-order: a module's line comes after its children's, with less indent;
    a top pytest_gradgate line's cumulative time covers everything it pulled in."""
    pending, modules = [], set()
    for line in stderr.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        cumulative, depth, name = int(m.group(2)), len(m.group(3)), m.group(4)
        modules.add(name)
        while pending and pending[-1][0] > depth:
            pending.pop()
        pending.append((depth, name, cumulative))
    return sum(c for _, n, c in pending if n.startswith("pytest_gradgate")), modules


def importtime(python, args, cwd):
    # -s: pytest's capture would swallow what -X importtime writes during collection
    proc = subprocess.run([python, "-X", "importtime", "-m", "pytest", "-s", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return gradgate_import_us(proc.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/bench_import.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=21)
    p.add_argument("--python", default=sys.executable, help="the interpreter whose environment is measured")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-import-") as tmp:
        Path(tmp, "test_trivial.py").write_text("def test_trivial():\n    pass\n")
        base = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_trivial.py"]
        timed(base, tmp)   # warm the file cache
        runs = {"with": [], "without": []}
        for _ in range(args.repeat):
            runs["with"].append(timed(base, tmp))
            runs["without"].append(timed(base + ["-p", "no:gradgate"], tmp))
        for i, what in ((0, "wall"), (1, "CPU")):
            for stat in (statistics.median, min):
                a = stat(r[i] for r in runs["with"])
                b = stat(r[i] for r in runs["without"])
                print(f"pytest -q test_trivial.py, {what} time, {stat.__name__} of {args.repeat}: "
                      f"{a * 1e3:.0f} ms with the plugin, {b * 1e3:.0f} ms with -p no:gradgate: "
                      f"the plugin costs {(a - b) * 1e3:+.0f} ms (target: at most +50 ms)")
        off_us, off_modules = importtime(args.python, ["-q", "-p", "no:cacheprovider", "test_trivial.py"], tmp)
        on_us, on_modules = importtime(args.python, ["-q", "-p", "no:cacheprovider", "--gradgate", "--collect-only"],
                                       tmp)
        for label, us, modules in (("without --gradgate", off_us, off_modules), ("with --gradgate", on_us, on_modules)):
            heavy = [h for h in HEAVY if h in modules]
            print(f"import of pytest_gradgate and what it pulls in, {label}: {us / 1e3:.1f} ms; "
                  f"imported of {'/'.join(HEAVY)}: {', '.join(heavy) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
