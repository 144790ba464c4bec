"""What --gradgate-html costs a run with many failures, and how big its file is.

    python bench/bench_html_report.py [--repeat 3] [-k concat] [--keep DIR]
    python bench/bench_html_report.py -k ""          # the whole built-in suite

It makes the concat-buggy variant of the default ggml (a patched copy; its build is cached like
any other), then runs the built-in suite's items selected by -k (default: concat) on it, in an
empty folder, as a user would:

    pytest --gradgate --gradgate-ggml-src=ROOT -k concat -p no:cacheprovider -q

once without and once with --gradgate-html=report.html, alternating, --repeat times each. It
prints the number of failures; each side's wall time (process start to exit: interpreter,
plugin, collection, the cases, and for the second side the report written); their difference,
which is what the report costs; the report's size and number of images.

Then the report's rendering alone: one more run (not timed) keeps the Results and pytest's
outcomes that the report is drawn from (this file, loaded as a pytest plugin, pickles them at
the end of the session), and this process times html.render on them: the pictures, the PNG
encoding, base64 and the page, without writing the file.
"""

import argparse
import os
import pickle
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DUMP_VARIABLE = "GRADGATE_BENCH_HTML_DUMP"
FAILED = re.compile(r"(\d+) failed")


def pytest_sessionfinish(session, exitstatus):
    """As a pytest plugin (-p bench_html_report): pickle what the HTML report is drawn from."""
    target = os.environ.get(DUMP_VARIABLE)
    if not target:
        return
    from pytest_gradgate.gate.state import state_of
    state = state_of(session.config)
    with open(target, "wb") as f:
        pickle.dump({"results": state.results, "tests": state.gate_reports}, f)


def gate_command(root, expression, *extra):
    return [sys.executable, "-m", "pytest", "--gradgate", f"--gradgate-ggml-src={root}", "-k", expression,
            "-p", "no:cacheprovider", "-q", *extra]


def run_once(command, folder, env=None):
    """(wall seconds, number of failures) of one pytest run, start to exit."""
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"pytest ended with exit status {proc.returncode}:\n{proc.stdout[-3000:]}")
    found = FAILED.findall(proc.stdout.splitlines()[-1] if proc.stdout.strip() else "")
    return wall, int(found[0]) if found else 0


def seconds(values):
    return (f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, "
            f"{len(values)} runs)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench/bench_html_report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("-k", dest="expression", default="concat", help="which built-in items (default: concat)")
    parser.add_argument("--keep", help="keep the work folder (the variant, the last report) here")
    args = parser.parse_args(argv)

    from pytest_gradgate.library.cmake import BuildOptions, ensure_build
    from pytest_gradgate.library.source import default_ggml_root
    from pytest_gradgate.report import html
    sys.path.insert(0, str(REPO / "tests"))
    from ggml_variants import make_variant

    workdir = Path(args.keep or tempfile.mkdtemp(prefix="gradgate-bench-html-"))
    workdir.mkdir(parents=True, exist_ok=True)
    root = make_variant(default_ggml_root(), workdir / "ggml-concat-buggy", "concat-buggy")
    started = time.perf_counter()
    ensure_build(root, BuildOptions())
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; python {sys.executable}")
    print(f"concat-buggy build ready in {time.perf_counter() - started:.1f} s")
    folder = workdir / "run"
    folder.mkdir(exist_ok=True)
    report = folder / "report.html"
    print("command (in an empty folder): " + shlex.join(["python"] + gate_command(root, args.expression)[1:])
          + " [--gradgate-html=report.html]")

    without, with_html, failures = [], [], set()
    for _ in range(args.repeat):
        wall, failed = run_once(gate_command(root, args.expression), folder)
        without.append(wall)
        failures.add(failed)
        report.unlink(missing_ok=True)
        wall, failed = run_once(gate_command(root, args.expression, "--gradgate-html=report.html"), folder)
        with_html.append(wall)
        failures.add(failed)
        if not report.is_file():
            sys.exit("no report was written")
    text = report.read_text(encoding="utf-8")
    images = len(re.findall(r'<img [^>]*src="data:image/png;base64,', text))
    print(f"failures: {', '.join(map(str, sorted(failures)))}")
    print(f"without --gradgate-html (start to exit): {seconds(without)}")
    print(f"with --gradgate-html (start to exit, the report written): {seconds(with_html)}")
    pairs = [w - wo for w, wo in zip(with_html, without)]
    print(f"the report's cost (with - without, pair by pair): {seconds(pairs)}; "
          f"of the medians: {statistics.median(with_html) - statistics.median(without):+.2f} s")
    print(f"report: {report.stat().st_size / 1024:.0f} KB, {images} images")

    # the rendering alone, on the Results of one more run
    dump = workdir / "results.pickle"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")])))
    env[DUMP_VARIABLE] = str(dump)
    run_once(gate_command(root, args.expression, "-p", "bench_html_report"), folder, env)
    with open(dump, "rb") as f:
        kept = pickle.load(f)
    renders = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        page = html.render(kept["results"], {"exit status": 1}, kept["tests"])
        renders.append(time.perf_counter() - started)
    print(f"html.render alone, in this process ({len(kept['results'])} results, {len(page) / 1024:.0f} KB of HTML): "
          f"{seconds(renders)}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
