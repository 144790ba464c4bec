"""What a run's crashes cost where the user lets processes dump core.

    python bench/bench_crashes.py [--repeat 3] [-k EXPR] [--ggml-src DIR]

Many of the built-in suite's cases crash on a given ggml: on the default ggml 263 do, 189
known failures (ggml aborts building or computing the backward) and 74 ops without a
backward. A C developer's shell often has `ulimit -c unlimited`, and then each crashed
child could write its memory to a core file, or pipe it to systemd-coredump or apport.
This runs `pytest --gradgate` from an empty folder (cached build), each repetition once
with the core dump limit at 0 and once raised to the hard limit, and prints for each: wall
time, CPU seconds of every process, the crashed cases, and what was left in the folder.
The two runs of a repetition follow each other, so that both see the same machine. The
header says which core_pattern this machine has: with a pipe (`|...`) a core goes to a
helper, not the folder, and the files figure says nothing.
For a comparison between versions, run the script with each version's Python.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_reference


def core_pattern():
    try:
        return Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return "(unknown: no /proc/sys/kernel/core_pattern)"


def folder_contents(folder, keep=("r.json",)):
    """(files, bytes) in `folder` beyond the gate's own report."""
    files = [p for p in Path(folder).rglob("*") if p.is_file() and p.name not in keep]
    return len(files), sum(p.stat().st_size for p in files)


def gate_run(core_limit, extra):
    """{wall, cpu, crashed, files, bytes} of one `pytest --gradgate` whose processes start
    with RLIMIT_CORE's soft limit at `core_limit`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-crashes-") as folder:
        cmd = [sys.executable, "-m", "pytest", "--gradgate", "-q", "-p", "no:cacheprovider",
               "--gradgate-json", "r.json", *extra]
        resource.setrlimit(resource.RLIMIT_CORE, (core_limit, hard))   # inherited by pytest and its workers
        try:
            wall, usage, code, text = bench_reference.run_measured(cmd, cwd=folder, stderr=subprocess.STDOUT)
        finally:
            resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
        report = Path(folder) / "r.json"
        if not report.is_file():
            raise SystemExit(f"pytest --gradgate wrote no report (exit {code}):\n{text[-2000:]}")
        cases = json.loads(report.read_text())["cases"]
        files, size = folder_contents(folder)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "crashed": sum(c["status"] == "crashed" for c in cases),
            "files": files, "bytes": size}


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/bench_crashes.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("-k", dest="select", metavar="EXPR", help="pytest -k expression (default: the whole built-in suite)")
    p.add_argument("--ggml-src", metavar="DIR", help="ggml tree (default: the pinned default)")
    args = p.parse_args(argv)
    extra = ([f"--gradgate-ggml-src={args.ggml_src}"] if args.ggml_src else []) + (["-k", args.select] if args.select else [])
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        raise SystemExit("the hard core dump limit here is 0: nothing to compare (raise it, e.g. as root)")
    limits = {"0": 0, "unlimited" if hard == resource.RLIM_INFINITY else str(hard): hard}
    gate_run(0, extra + ["-k", "dup and none and not get_rows"])   # warm the build and the file caches
    runs = {name: [] for name in limits}
    for _ in range(args.repeat):
        for name, limit in limits.items():
            runs[name].append(gate_run(limit, extra))
    print(f"core_pattern {core_pattern()!r}; {args.repeat} repetitions, medians; {bench_reference.install_description()}")
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"core dump limit {name}: {med['wall']:.1f} s wall ({min(r['wall'] for r in rs):.1f}-"
              f"{max(r['wall'] for r in rs):.1f}), {med['cpu']:.1f} CPU s; {med['crashed']:.0f} cases crashed; "
              f"left in the folder: {med['files']:.0f} files, {med['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
