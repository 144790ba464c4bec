"""Build figures: cold build time, warm load time, build-cache size.

    python bench/bench_build.py [--repeat 5] [--skip-cold] [--skip-copy]

- cold build: `gradgate build` of the default ggml into an empty temporary cache, once with
  ccache disabled (a fresh machine) and once with ccache warm (a new cache entry for sources
  compiled before, e.g. a CI cache restored without the build folder);
- patched copy: `gradgate build` of a copy of the default ggml at a new path with one line added
  to src/ggml.c (what the project's tests and `gradgate verify` build), into an empty temporary
  cache, right after the same for an unpatched copy at another new path, so that ccache holds
  what the build can share and nothing else; the figure is the patched copy's alone;
- warm load: from starting `pytest --gradgate` (cache hit) to the library loaded in that
  process, measured by a conftest that loads it right after the plugin's session start;
  target < 2 s;
- build-cache size: each entry under the user cache's builds/ folder, and the sources.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.library.source import copy_tree, default_ggml_root

PROBE = '''
import time
import pytest

@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    from pytest_gradgate.library import binding
    from pytest_gradgate.plugin import state_of
    # the plugin finds its build when the first case runs (there are none here): find it now
    lib = binding.load(state_of(session.config).ensure_build().library)
    print(f"GRADGATE_LOADED {time.time():.6f} ggml {binding.ggml_version(lib)}", flush=True)
'''


def du(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) if Path(path).exists() else 0


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def cold_build(root, ccache):
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-cache-") as cache:
        env = dict(os.environ, GRADGATE_CACHE_DIR=cache)
        if not ccache:
            env["CCACHE_DISABLE"] = "1"
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", str(root)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"cold build failed:\n{proc.stderr}")
        # CPU seconds (compilers included) do not depend on how busy the machine is
        cpu_seconds = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
        return elapsed, cpu_seconds, du(Path(cache) / "builds")


def patched_copy(root):
    """(wall s, CPU s) of the patched copy's build, after the unpatched copy's (module doc)."""
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-copy-") as work:
        original = copy_tree(root, Path(work) / "original" / "ggml")
        patched = copy_tree(root, Path(work) / "patched" / "ggml")
        ggml_c = patched / "src" / "ggml.c"
        anchor = '#include "ggml.h"\n'
        ggml_c.write_text(ggml_c.read_text().replace(anchor, anchor + "int gradgate_bench_patched_copy = 1;\n", 1))
        cold_build(original, ccache=True)
        seconds, cpu, _ = cold_build(patched, ccache=True)
        return seconds, cpu


def warm_load(repeat):
    # make sure the entry exists, so that every run below is a cache hit
    subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build"], check=True, stdout=subprocess.DEVNULL)
    times = []
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-warm-") as work:
        (Path(work) / "conftest.py").write_text(PROBE)
        for _ in range(repeat):
            started = time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin",
                                   "-p", "no:cacheprovider", "-q"], cwd=work, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("GRADGATE_LOADED")), None)
            if line is None:
                sys.exit(f"the probe did not report a load:\n{proc.stdout}")
            times.append(float(line.split()[1]) - started)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="warm-load runs (default 5)")
    parser.add_argument("--skip-cold", action="store_true", help="skip the two cold builds (minutes on 2 cores)")
    parser.add_argument("--skip-copy", action="store_true", help="skip the patched copy's build (and its original's)")
    args = parser.parse_args()
    root = default_ggml_root()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if not args.skip_cold:
        seconds, cpu, size = cold_build(root, ccache=False)
        print(f"cold build, ccache off:  {seconds:6.1f} s wall, {cpu:6.1f} s CPU  (entry {mib(size)})")
        seconds, cpu, _ = cold_build(root, ccache=True)
        print(f"cold build, ccache warm: {seconds:6.1f} s wall, {cpu:6.1f} s CPU")
    if not args.skip_copy:
        seconds, cpu = patched_copy(root)
        print(f"patched copy, ccache holding its original: {seconds:6.1f} s wall, {cpu:6.1f} s CPU")
    times = warm_load(args.repeat)
    print(f"warm load (pytest start -> library loaded, cache hit): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s, max {max(times):.2f} s over {len(times)} runs (target < 2 s)")
    builds = cache_root() / "builds"
    entries = [p for p in builds.iterdir() if p.is_dir() and not p.name.startswith(".tmp-") and p.name != "failed"] \
        if builds.is_dir() else []
    print(f"build cache {builds}: {len(entries)} entries, {mib(du(builds))} in all; "
          f"sources {mib(du(cache_root() / 'sources'))}")
    for entry in sorted(entries):
        print(f"  {entry.name}: {mib(du(entry))}")


if __name__ == "__main__":
    main()
