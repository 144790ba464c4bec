"""Look at an HTML report as a person would: render it in headless Chromium, save a PNG.

    python bench/screenshot_report.py report.html out.png [--width 1400 --height 2400]
    python bench/screenshot_report.py --demo out.png     # the CONCAT story on the buggy variant

--demo makes the concat-buggy variant of the default ggml (patched copy, cached build), runs
the story's case (concat(a, b, dim=1), a [4,3,5,1], b [4,2,5,1], through
permute_0213_transpose, loss sqr) plus a crashing case (sqrt through a transpose aborts in
ggml's CPU kernel) with `pytest --gradgate --gradgate-html`, and screenshots the report.

Needs Debian's `chromium` (apt-get install chromium).
Prints the figures it measured: report size, number of images, render and screenshot times.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMO_CASES = """\
cases:
  - name: concat_story
    params: {a: [4, 3, 5, 1], b: [4, 2, 5, 1]}
    graph: concat(a, b, dim=1)
    consumers: [none, permute_0213_transpose]
  - name: sqrt_through_transpose
    params: {a: [4, 3]}
    init: {a: {abs: [0.5, 1.5]}}
    graph: sqrt(a)
    consumers: [transpose]
"""
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html_path, png_path, width=1400, height=2400, chromium=None, timeout=120):
    """Render `html_path` headless into `png_path` (the top width x height pixels of the page).

    Flags: no sandbox (root in containers), no GPU, and nothing that reaches the network."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no chromium found; install it with: apt-get install chromium")
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    if png_path.exists():
        png_path.unlink()
    with tempfile.TemporaryDirectory(prefix="gradgate-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={png_path}",
               f"--window-size={width},{height}", Path(html_path).resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not png_path.is_file():
        raise RuntimeError(f"chromium failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return png_path


def make_demo_report(workdir):
    """Run the story's cases on the concat-buggy variant; return the report's path."""
    from pytest_gradgate.library.cmake import BuildOptions, ensure_build
    from pytest_gradgate.library.source import default_ggml_root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ggml_variants import make_variant

    workdir = Path(workdir)
    root = make_variant(default_ggml_root(), workdir / "ggml-concat-buggy", "concat-buggy")
    started = time.perf_counter()
    ensure_build(root, BuildOptions())
    print(f"concat-buggy build ready in {time.perf_counter() - started:.1f} s")
    (workdir / "gradgate_story.yaml").write_text(DEMO_CASES)
    report = workdir / "report.html"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin",
                           f"--gradgate-ggml-src={root}", f"--gradgate-html={report}", "-q",
                           "-p", "no:cacheprovider", "gradgate_story.yaml"],
                          cwd=workdir, capture_output=True, text=True)
    print(f"pytest --gradgate (exit {proc.returncode}, 1 = cases failed as expected) "
          f"in {time.perf_counter() - started:.1f} s")
    if not report.is_file():
        sys.exit(f"no report was written:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", nargs="?", help="the report to render (omit with --demo)")
    parser.add_argument("png", help="where to save the screenshot")
    parser.add_argument("--demo", action="store_true", help="make the CONCAT story's report first")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("--keep", help="with --demo: keep the work directory here")
    args = parser.parse_args(argv)
    if args.demo == bool(args.html):
        parser.error("give either an HTML file or --demo")
    if find_chromium() is None:
        print("no chromium found; install it with: apt-get install chromium", file=sys.stderr)
        return 2
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="gradgate-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    html_path = make_demo_report(workdir) if args.demo else Path(args.html)
    text = html_path.read_text(encoding="utf-8")
    images = re.findall(r'<img [^>]*src="data:image/png;base64,', text)
    print(f"report: {html_path} ({os.path.getsize(html_path) / 1024:.0f} KiB, {len(images)} images)")
    started = time.perf_counter()
    png = screenshot(html_path, args.png, args.width, args.height)
    print(f"screenshot: {png} ({args.width}x{args.height}) in {time.perf_counter() - started:.1f} s")
    if args.demo and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
