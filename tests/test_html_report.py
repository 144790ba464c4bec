"""--gradgate-html: the self-contained HTML report with gradient heatmaps.

Every report here comes from a real `pytest --gradgate` run on a real ggml build: passes only,
a real crash (sqrt through a transpose aborts in ggml 0.15.3's CPU kernel), and the CONCAT
story on the concat-buggy variant. The screenshot test renders the story's report in headless
Chromium (skipped where no chromium is installed; .ci/run does not install it).
"""

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from xml.etree import ElementTree
from pathlib import Path

import numpy as np
import pytest

from pytest_gradgate.report import heatmap
from pytest_gradgate.report import html as report_html

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "bench" / "screenshot_report.py"

PASSING = """\
cases:
  - name: add_plain
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none, transpose]
"""
CRASHING = PASSING + """\
  - name: sqrt_through_transpose
    params: {a: [4, 3]}
    init: {a: {abs: [0.5, 1.5]}}
    graph: sqrt(a)
    consumers: [transpose]
"""
STORY = """\
cases:
  - name: concat_story
    params: {a: [4, 3, 5, 1], b: [4, 2, 5, 1]}
    graph: concat(a, b, dim=1)
    consumers: [none, permute_0213_transpose]
"""


class ReportParser(HTMLParser):
    """The parts of a report the tests look at: summary rows, images, case sections."""

    def __init__(self):
        super().__init__()
        self.rows, self.images, self.sections, self.captions, self.stderr = [], [], [], [], []
        self.counts, self.groups = None, []
        self._stack, self._text = [], None
        self._in_summary = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id") == "summary":
            self._in_summary = True
        elif tag == "tr" and self._in_summary:
            self.rows.append({"class": attrs.get("class"), "cells": [], "attrs": attrs})
        elif tag == "td" and self._in_summary and self.rows:
            self.rows[-1]["cells"].append(attrs.get("data-sort"))
        elif tag == "img":
            self.images.append(attrs)
        elif tag == "section":
            self.sections.append(attrs)
        elif tag in ("figcaption", "pre") or (tag in ("p", "h2") and attrs.get("class") in ("counts", "group"))\
                or (tag == "span" and self._in_summary):
            self._text = (tag, attrs, [])

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_summary = False
        if self._text and tag == self._text[0]:
            text = "".join(self._text[2])
            if tag == "p":
                self.counts = text
            elif tag == "h2":
                self.groups.append(text)
            elif tag == "span":
                self.rows[-1]["status_text"] = text
            else:
                (self.captions if tag == "figcaption" else self.stderr).append(text)
            self._text = None

    def handle_data(self, data):
        if self._text:
            self._text[2].append(data)


def parse(path):
    parser = ReportParser()
    parser.feed(Path(path).read_text(encoding="utf-8"))
    parser.rows = [r for r in parser.rows if r["cells"]]    # drop the header row
    return parser


def png_size(src):
    """(width, height) of a data: URI's PNG, after checking it decodes as one."""
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    data = base64.b64decode(src[len(prefix):], validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def run_gate(workdir, cases, *args, ggml_src=None):
    """A real `pytest --gradgate` in a subprocess, as CI runs it."""
    (workdir / "gradgate_cases.yaml").write_text(cases)
    cmd = [sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
           "-q", "gradgate_cases.yaml", *args]
    if ggml_src:
        cmd.append(f"--gradgate-ggml-src={ggml_src}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADGATE_")}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def story_report(tmp_path_factory, ggml_variant):
    """The story's report: CONCAT through permute_0213_transpose on the concat-buggy ggml."""
    root, _ = ggml_variant("concat-buggy")
    workdir = tmp_path_factory.mktemp("story")
    proc = run_gate(workdir, STORY, "--gradgate-html=out/report.html", ggml_src=root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return workdir / "out" / "report.html"


def test_passes_only(pytester, default_build):
    pytester.makefile(".yaml", gradgate_cases=PASSING)
    result = pytester.runpytest("--gradgate", "--gradgate-no-builtin", "--gradgate-html=report.html",
                                "gradgate_cases.yaml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gradgate: HTML report written to *report.html"])
    report = parse(pytester.path / "report.html")
    assert [r["class"] for r in report.rows] == ["passed", "passed"]
    assert report.images == [] and report.sections == []     # nothing to draw when all passed
    assert "2 passed" in (pytester.path / "report.html").read_text()


def test_crash_shows_message_and_stderr(tmp_path, default_build):
    """sqrt's backward through a transpose aborts in ggml 0.15.3 (GGML_ASSERT in binary-ops.cpp).

    Run under pytest-xdist: the controller writes the report with every worker's results."""
    proc = run_gate(tmp_path, CRASHING, "--gradgate-html=out/r.html", "-n", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout
    report = parse(tmp_path / "out" / "r.html")
    # the controller counts its workers' reports as pytest does (before: "1 crashed, 2 passed")
    assert report.counts == "1 failed (1 crashed), 2 passed", report.counts
    # failures first: the crash heads the table although its name sorts after add_plain
    assert [r["class"] for r in report.rows] == ["crashed", "passed", "passed"]
    assert [s["class"] for s in report.sections] == ["case crashed"]
    assert len(report.stderr) == 1 and "GGML_ASSERT" in report.stderr[0]
    text = (tmp_path / "out" / "r.html").read_text()
    assert "SIGABRT" in text and "phase compute" in text
    assert report.images == []                 # a crash has no gradients to draw


SILU_THROUGH_TRANSPOSE = """\
cases:
  - name: silu_through_transpose
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [transpose]
"""
MIXED_CASES = CRASHING + SILU_THROUGH_TRANSPOSE.removeprefix("cases:\n") + """\
  - name: invalid_keyword
    params: {a: [4, 3], b: [4, 2]}
    graph: concat(a, b, axis=1)
"""
MIXED_TESTS = """\
def test_check_through_two_consumers(gradgate):
    gradgate.check("silu(a)", params={"a": [4, 3, 2]}, consumers=["none", "transpose"])

def test_run_returns_a_failed_result(gradgate):
    r = gradgate.run("silu(a)", params={"a": [4, 3, 2]}, consumer="transpose")
    assert not r.ok

def test_check_passes(gradgate):
    gradgate.check("mul_mat(a, b)", params={"a": [4, 3, 2], "b": [4, 5, 2]})

def test_invalid_check(gradgate):
    gradgate.check("concat(a, b, axis=1)", params={"a": [4, 3], "b": [4, 2]})

def test_own_assertion_fails_after_a_pass(gradgate):
    r = gradgate.run("mul_mat(a, b)", params={"a": [4, 3, 2], "b": [4, 5, 2]})
    assert r.maa > 1
"""


def counts_of(text):
    """{outcome: n} from a summary such as "5 failed (1 crashed), 4 passed, 1 error", in
    pytester's spelling (errors, warnings); the parenthesised breakdown is left out."""
    plural = {"error": "errors", "warning": "warnings"}
    text = re.sub(r"\([^)]*\)", "", text)
    return {plural.get(word, word): int(n) for n, word in re.findall(r"(\d+) (\w+)", text)}


def test_counts_agree_with_pytest_and_run_results_are_not_failures(pytester, default_build, monkeypatch):
    """YAML cases (pass, fail, crash, invalid) and fixture tests (a check through two consumers,
    a run() result the test asserts on, an invalid check, a test's own failing assertion), and a
    plain test in a folder named gradgate, in one real run with the HTML, JSON and JUnit reports.

    Before: the HTML said "3 failed, 1 crashed, 4 passed" where pytest said "5 failed, 4 passed,
    1 error": it counted Results by status, so the items without a Result (the invalid case, the
    invalid check) were missing, a crash was not a failure, and the run() result the test
    asserted on (the test passed) was counted and drawn as a failure. The GitHub step summary's
    head line counted the same way ("4 failed, 4 passed")."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "step_summary.md"))
    pytester.makefile(".yaml", gradgate_cases=MIXED_CASES)
    pytester.makepyfile(test_fixture_checks=MIXED_TESTS)
    # not a gradgate item, though "gradgate" is one of its keywords (its folder's name)
    pytester.mkdir("gradgate")
    (pytester.path / "gradgate" / "test_plain.py").write_text("def test_plain():\n    pass\n")
    # in a subprocess, as CI runs it
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "--gradgate-html=report.html", "--gradgate-json=report.json",
                                           "--junitxml=junit.xml", "gradgate_cases.yaml", "test_fixture_checks.py",
                                           "gradgate/test_plain.py")
    pytest_counts = result.parseoutcomes()
    pytest_counts.pop("seconds", None)
    assert pytest_counts == {"failed": 5, "passed": 5, "errors": 1}, result.stdout.str()
    # the test whose case passed failed on its own assertion: pytest says so; the gate's list of
    # failures (and GitHub's annotations) does not blame the case ("passed in phase done" before)
    gate_failures = result.stdout.str().split("gradgate failures")[1].split("short test summary")[0]
    assert "test_own_assertion_fails_after_a_pass" not in gate_failures, gate_failures
    assert "test_check_through_two_consumers: MAA" in gate_failures, gate_failures
    report = parse(pytester.path / "report.html")

    # the summary's counts are pytest's for the gradgate items (all but test_plain), the case
    # statuses a breakdown of them
    assert counts_of(report.counts) == dict(pytest_counts, passed=pytest_counts["passed"] - 1), report.counts
    assert report.counts.startswith("5 failed (1 crashed), 4 passed ("), report.counts
    head = (pytester.path / "step_summary.md").read_text().splitlines()[0]
    assert head == f"## gradgate: FAILED ({report.counts})", head
    junit = ElementTree.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert (int(junit.get("tests")), int(junit.get("failures")), int(junit.get("errors"))) == (11, 5, 1)

    # one row per test item, each with pytest's outcome, the items without a Result included
    outcomes = {r["attrs"]["data-nodeid"]: r["attrs"]["data-outcome"] for r in report.rows}
    assert len(outcomes) == len(report.rows) == 10
    assert outcomes["test_fixture_checks.py::test_invalid_check"] == "failed"
    assert [o for n, o in outcomes.items() if "invalid" in n and n.startswith("gradgate_cases")] == ["error"]
    assert outcomes["test_fixture_checks.py::test_own_assertion_fails_after_a_pass"] == "failed"
    # ... the same outcomes as the JSON report's, for every case it has
    doc = json.loads((pytester.path / "report.json").read_text())
    assert {c["nodeid"]: c["outcome"] for c in doc["cases"]}.items() <= outcomes.items()

    # the run() result: shown as what the test got back, not as a failed test
    returned = next(r for r in report.rows if r["attrs"]["data-nodeid"].endswith("test_run_returns_a_failed_result"))
    assert returned["class"] == "returned" and returned["attrs"]["data-outcome"] == "passed"
    assert "gradgate.run()" in returned["status_text"] and "test passed" in returned["status_text"]
    failed_sections = [s["id"] for s in report.sections if s["class"] != "case returned"]
    assert len(failed_sections) == 3        # silu through transpose, the sqrt crash, the two-consumer check
    assert [s["class"] for s in report.sections].count("case returned") == 1
    assert any(g.startswith("Results returned by gradgate.run()") for g in report.groups), report.groups


@pytest.mark.slow
def test_story_failure_has_heatmaps(story_report):
    """The CONCAT story: both params fail, every (i2, i3) slice is drawn, named and decodable.

    With the fix (concat-fixed) the case passes and there would be no section and no image;
    here the checks fail if images are missing, empty, unnamed or undecodable."""
    report = parse(story_report)
    assert [r["class"] for r in report.rows] == ["failed", "passed"]
    assert [s["class"] for s in report.sections] == ["case failed"]
    slices = [f"{p}[:, :, {i2}, 0]" for p in "ab" for i2 in range(5)]
    for name in slices:
        assert any(c.startswith(name + " ") for c in report.captions), name
    assert {i["alt"] for i in report.images} == set(slices) | {"a: all slices", "b: all slices"}
    for img in report.images:
        # measured: slices 510-526 x 174-180 (a, 4 x 3 cells of 30 pixels) and 510-526 x
        # 143-147 (b), the overviews 593 x 469 and 593 x 397
        width, height = png_size(img["src"])
        assert 400 <= width <= 1500 and 100 <= height <= 1000, (img["alt"], width, height)
    text = story_report.read_text()
    assert text.count("<br>diagnosis: ") == 2                                 # one per failed param
    assert text.count("index [i0, i1, i2, i3]") == 2                           # worst elements, per param


def test_the_report_needs_no_matplotlib(tmp_path, default_build):
    """The pictures are the package's own: with matplotlib unimportable, a run with a failed
    case writes its report, heatmaps included, and ends as the run does (1: a case failed).
    Before, this was a usage error asking for the [report] extra.

    matplotlib is made unimportable the way a missing package is: a meta-path finder that a
    `-p` plugin installs before pytest configures anything (works whether or not matplotlib
    is installed here)."""
    (tmp_path / "no_matplotlib.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "sys.meta_path.insert(0, Block())\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    check = subprocess.run([sys.executable, "-c", "import no_matplotlib, matplotlib"], env=env,
                           capture_output=True, text=True)
    assert "No module named 'matplotlib'" in check.stderr        # the block is real
    (tmp_path / "gradgate_cases.yaml").write_text(SILU_THROUGH_TRANSPOSE)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no_matplotlib", "-p", "no:cacheprovider",
                           "--gradgate", "--gradgate-no-builtin", "--gradgate-html=r.html", "gradgate_cases.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "1 failed" in proc.stdout and "HTML report written to" in proc.stdout, proc.stdout
    report = parse(tmp_path / "r.html")
    assert [s["class"] for s in report.sections] == ["case failed"]
    # a [4, 3, 2] param: its two slices and their overview
    assert [i["alt"] for i in report.images] == ["a: all slices", "a[:, :, 0, 0]", "a[:, :, 1, 0]"]
    for img in report.images:
        width, height = png_size(img["src"])
        assert width > 200 and height > 100, (img["alt"], width, height)


def test_everything_from_a_case_is_escaped():
    """Names, messages and stderr come from users and from ggml: none may become markup."""
    evil = '<script>alert("x")</script>'
    result = {"case_id": evil, "name": evil, "consumer": "none", "loss": "sqr", "backend": "cpu", "op": evil,
              "status": "crashed", "phase": "compute", "diagnosis": evil, "message": evil, "signal": "SIGABRT",
              "stderr_tail": evil + "\n", "params": [], "origin": {"path": evil, "line": 1}}
    text = report_html.render([result], meta={evil: evil})
    assert "<script>alert" not in text and text.count("&lt;script&gt;") >= 6


def test_slices_follow_ggml_index_order():
    """Values come in ggml's logical order (i0 fastest); a slice a[:, :, i2, i3] is drawn with
    rows i1 and columns i0. Reading them i3-fastest would draw a transposed, wrong picture."""
    values = list(range(4 * 3 * 2))
    t = report_html.as_array(values, [4, 3, 2])
    assert t.shape == (1, 2, 3, 4)
    assert t[0, 1, 2, 3] == 3 + 4 * 2 + 12 * 1              # element (i0=3, i1=2, i2=1)
    assert t[0, 1].tolist()[0] == [12, 13, 14, 15]         # slice [:, :, 1, 0], row i1=0
    pairs, total = report_html.pick_slices(t, t * 0, limit=1)
    assert (pairs, total) == ([(1, 0)], 2)                 # the slice with the larger error


def _failed(case_id, values):
    n = len(values)
    return {"case_id": case_id, "consumer": "transpose", "loss": "sqr", "backend": "cpu", "op": "concat",
            "status": "failed", "phase": "done", "maa": 1.0, "cosine": 0.0, "diagnosis": "scrambled",
            "params": [{"name": "a", "shape": [n, 1, 1, 1], "passed": False, "maa": 1.0,
                        "analytic_values": values[::-1], "numeric_values": values}]}


def test_pictures_are_capped_and_go_to_new_failures_first(monkeypatch):
    """Past MAX_CASES_WITH_PICTURES cases, the report keeps the numbers, draws nothing; the
    pictures go to the cases whose test failed before those the baseline knows (xfailed), and a
    crash (nothing to draw) takes none of them. Before, they went to the first 20 sections, known
    or not, crashes included: on the concat-buggy ggml's whole suite, 4 known failures and 6 of
    the 17 new failures with values to draw had pictures, the other 11 (concat_dim2 ...) none."""
    monkeypatch.setattr(report_html, "MAX_CASES_WITH_PICTURES", 1)
    text = report_html.render([_failed("one", [1.0, 2.0, 3.0]), _failed("two", [1.0, -1.0, 0.5])])
    parser = ReportParser()
    parser.feed(text)
    assert [i["alt"] for i in parser.images] == ["a[:, :, 0, 0]"]
    assert text.count("no pictures: those of 1 cases are drawn") == 1
    assert text.count('class="worst"') == 2

    crash = {"case_id": "a_crash", "status": "crashed", "outcome": "failed", "params": []}
    new_b = dict(_failed("b_new", [1.0, 2.0, 3.0]), outcome="failed")
    new_c = dict(_failed("c_new", [1.0, 2.0]), outcome="failed")
    monkeypatch.setattr(report_html, "MAX_CASES_WITH_PICTURES", 1)
    text = report_html.render([crash, new_b, new_c])
    sections = {m.group(1): m.group(2) for m in re.finditer(r'<h3>.*?</span> (\w+)</h3>(.*?)</section>', text, re.S)}
    assert list(sections) == ["b_new", "c_new", "a_crash"]              # the sections' order is kept
    assert [s.count("<img") for s in sections.values()] == [1, 0, 0]   # the crash took no picture
    assert "no pictures" in sections["c_new"]


def test_known_failures_are_rows_without_sections():
    """A failure the baseline knows (its test xfailed) is a row of the table, unlinked, with no
    section and no picture; a note says how many and where their details are. Issue 52: a fork's
    run has hundreds of them, and their sections were most of the file (on the concat-buggy
    ggml's whole suite 647 of 1517 KB, 264 sections beside 30 new ones)."""
    known = dict(_failed("b_known", [1.0, 2.0, 3.0]), outcome="xfailed")
    new = dict(_failed("c_new", [1.0, 2.0]), outcome="failed")
    text = report_html.render([known, new])
    report = ReportParser()
    report.feed(text)
    assert [s["id"] for s in report.sections] == ["case-1"]
    assert {i["alt"] for i in report.images} == {"a[:, :, 0, 0]"}
    assert '<a href="#case-1">c_new</a>' in text and '<a href="#case-0">' not in text
    assert "1 known failure(s), which the baseline records" in text
    row = next(r for r in report.rows if r["attrs"].get("data-nodeid") == "b_known")
    assert row["attrs"]["data-outcome"] == "xfailed"


# -- the pictures themselves: decoded here, independently of report/png.py ----------------------
def decode_png(data):
    """(RGB array [row, column, channel], chunk types) of a palette PNG with filter 0 rows, after
    checking the signature, every chunk's CRC and the IHDR fields that report/png.py writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind}"
        chunks.append((kind, body))
        pos += 12 + length
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"PLTE" in kinds and b"IDAT" in kinds, kinds
    width, height, depth, colour_type, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour_type, compression, filtering, interlace) == (8, 3, 0, 0, 0)
    palette = np.frombuffer(dict(chunks)[b"PLTE"], dtype=np.uint8).reshape(-1, 3)
    raw = np.frombuffer(zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT")), dtype=np.uint8)
    rows = raw.reshape(height, width + 1)
    assert (rows[:, 0] == 0).all()                       # filter type 0 on every row
    return palette[rows[:, 1:]], kinds


def test_png_encoder_round_trips_with_valid_crcs():
    from pytest_gradgate.report import png
    pixels = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.uint8)
    rgb, kinds = decode_png(png.encode_indexed(pixels, [(255, 0, 0), (0, 255, 0), (0, 0, 255)]))
    assert kinds == [b"IHDR", b"PLTE", b"IDAT", b"IEND"]
    assert rgb.tolist() == [[[255, 0, 0], [0, 255, 0], [0, 0, 255]], [[0, 0, 255], [0, 255, 0], [255, 0, 0]]]
    with pytest.raises(ValueError, match="past the palette"):
        png.encode_indexed(pixels, [(0, 0, 0), (1, 1, 1)])


def _cells(picture, rgb, title, i1, i0, block=0):
    y0, y1, x0, x1 = picture.panels[title].cell(i1, i0, block)
    return rgb[y0:y1, x0:x1]


def _edge(block):
    """A cell's pixel next to its top-left corner: never covered by its printed value."""
    return tuple(int(c) for c in block[1, 1])


def _map(t):
    """The colour map's RGB at t in [-1, 1] (the nearest of its 2 * HALF + 1 levels),
    interpolated here between its anchors."""
    t = np.rint(t * heatmap.HALF) / heatmap.HALF
    xs = [a for a, _ in heatmap.ANCHORS]
    return [float(np.interp(t, xs, [c[k] for _, c in heatmap.ANCHORS])) for k in range(3)]


def test_cells_have_the_colour_of_the_map_and_nan_is_grey():
    analytic = np.array([[2.0, -2.0, 0.0], [1.0, -0.7, np.nan]])
    numeric = np.array([[2.0, -2.0, 0.0], [1.0, -0.7, 0.5]])
    picture = heatmap.slice_picture("a", analytic, numeric)
    rgb, _ = decode_png(picture.png())
    for (i1, i0), t in {(0, 0): 1.0, (0, 1): -1.0, (0, 2): 0.0, (1, 0): 0.5, (1, 1): -0.35}.items():
        for title in ("analytic", "numeric"):
            got = _edge(_cells(picture, rgb, title, i1, i0))
            assert np.allclose(got, _map(t), atol=1), (title, i1, i0, got, _map(t))
    assert _edge(_cells(picture, rgb, "analytic", 1, 2)) == (221, 221, 221)          # NaN: light grey
    assert _edge(_cells(picture, rgb, "numeric", 1, 2)) != (221, 221, 221)
    assert _edge(_cells(picture, rgb, "analytic - numeric", 1, 2)) == (221, 221, 221)
    # the ends are saturated enough for the screenshot test's red and blue
    r, g, b = _edge(_cells(picture, rgb, "analytic", 0, 0))
    assert r > 150 and g < 110 and b < 110
    r, g, b = _edge(_cells(picture, rgb, "analytic", 0, 1))
    assert b > 130 and r < 90 and g < 130


def test_analytic_and_numeric_share_one_scale_and_the_difference_has_its_own():
    """The numeric gradient's largest value is 1, the analytic's 4: a 1 in both is one colour
    in both panels (a quarter of the way to red), and the difference (at most 0.5) has its own."""
    analytic = np.array([[4.0, 1.0], [0.0, 0.5]])
    numeric = np.array([[3.5, 1.0], [0.0, 0.5]])
    picture = heatmap.slice_picture("a", analytic, numeric)
    rgb, _ = decode_png(picture.png())
    one_a = _edge(_cells(picture, rgb, "analytic", 0, 1))
    one_n = _edge(_cells(picture, rgb, "numeric", 0, 1))
    assert one_a == one_n and np.allclose(one_a, _map(0.25), atol=1), (one_a, one_n)
    assert np.allclose(_edge(_cells(picture, rgb, "numeric", 0, 0)), _map(3.5 / 4), atol=1)
    assert np.allclose(_edge(_cells(picture, rgb, "analytic - numeric", 0, 0)), _map(1.0), atol=1)
    assert picture.panels["analytic"].limit == picture.panels["numeric"].limit == 4.0
    assert picture.panels["analytic - numeric"].limit == 0.5
    # each scale's limits are printed beside its colour bar
    ink = (rgb == 0).all(axis=2)
    assert _found(ink, heatmap.text_mask("+4")) == 2 and _found(ink, heatmap.text_mask("-4")) == 2
    assert _found(ink, heatmap.text_mask("+0.5")) == 1 and _found(ink, heatmap.text_mask("-0.5")) == 1


def _found(ink, mask):
    """How many times `mask` is inked exactly (its blank pixels blank too) in `ink`."""
    from numpy.lib.stride_tricks import sliding_window_view
    windows = sliding_window_view(ink, mask.shape)
    return int((windows == mask).all(axis=(2, 3)).sum())


def test_values_are_printed_in_small_slices_only():
    analytic = np.array([[1.5, -0.25, 0.0], [0.004, 12.5, -3.0]])
    picture = heatmap.slice_picture("a", analytic, analytic)
    rgb, _ = decode_png(picture.png())
    for (i1, i0), text in {(0, 0): "1.50", (0, 1): "-0.25", (0, 2): "0", (1, 0): "4e-3", (1, 1): "12.5",
                           (1, 2): "-3.00"}.items():
        for title in ("analytic", "numeric"):
            block = _cells(picture, rgb, title, i1, i0)
            background = block[1, 1]
            text_pixels = (block != background).any(axis=2)
            assert _found(text_pixels, heatmap.text_mask(text)) == 1, (title, text)
    # white on strong colours, black on light ones
    block = _cells(picture, rgb, "analytic", 1, 1)                    # 12.5: the end of the scale
    assert ((block == 255).all(axis=2)).sum() == heatmap.text_mask("12.5").sum()
    block = _cells(picture, rgb, "analytic", 0, 1)                    # -0.25: pale
    assert ((block == 0).all(axis=2)).sum() == heatmap.text_mask("-0.25").sum()
    # past MAX_ANNOTATED cells, each cell is one colour
    big = np.arange(heatmap.MAX_ANNOTATED + 1, dtype=float).reshape(1, -1)
    picture = heatmap.slice_picture("a", big, big)
    rgb, _ = decode_png(picture.png())
    for i0 in (0, 50, heatmap.MAX_ANNOTATED):
        block = _cells(picture, rgb, "analytic", 0, i0)
        assert (block == block[0, 0]).all()


def test_indices_are_printed_beside_small_dimensions():
    data = np.zeros((3, 12))
    picture = heatmap.slice_picture("a", data, data)
    rgb, _ = decode_png(picture.png())
    ink = (rgb == 0).all(axis=2)
    panel = picture.panels["numeric"]
    for i0 in range(12):         # above each column, its index
        _, _, x0, x1 = panel.cell(0, i0)
        above = ink[panel.y - heatmap.TEXT_HEIGHT - 4:panel.y - 1, x0:x1]
        assert _found(above, heatmap.text_mask(str(i0))) == 1, i0
    for i1 in range(3):          # left of each row, its index
        y0, y1, _, _ = panel.cell(i1, 0)
        beside = ink[y0:y1, panel.x - 3 * heatmap.GAP:panel.x - 1]
        assert _found(beside, heatmap.text_mask(str(i1))) == 1, i1
    # 64 columns of 4 pixels: no room for their indices
    wide = np.zeros((40, 64))
    picture = heatmap.slice_picture("a", wide, wide)
    rgb, _ = decode_png(picture.png())
    panel = picture.panels["numeric"]
    above = (rgb[panel.y - heatmap.TEXT_HEIGHT - 4:panel.y - 1, panel.x:panel.x + 64 * panel.sx] == 0).all(axis=2)
    assert above.sum() == heatmap.text_mask("i0").sum() and _found(above, heatmap.text_mask("i0")) == 1   # its name only


def test_values_at_swapped_positions_differ_between_the_panels_there_only():
    """A gradient with two values at each other's places: the analytic and numeric panels
    differ at those two cells and are the same picture elsewhere; the difference is 0 elsewhere."""
    rng = np.random.default_rng(7)
    for shape in ((3, 4), (20, 30)):           # with values printed, and without
        numeric = rng.normal(size=shape)
        analytic = numeric.copy()
        analytic[0, 1], analytic[2, 3] = numeric[2, 3], numeric[0, 1]
        picture = heatmap.slice_picture("a", analytic, numeric)
        rgb, _ = decode_png(picture.png())
        zero = tuple(int(round(c)) for c in _map(0.0))
        for i1 in range(shape[0]):
            for i0 in range(shape[1]):
                same = np.array_equal(_cells(picture, rgb, "analytic", i1, i0), _cells(picture, rgb, "numeric", i1, i0))
                swapped = (i1, i0) in ((0, 1), (2, 3))
                assert same != swapped, (shape, i1, i0)
                assert (_edge(_cells(picture, rgb, "analytic - numeric", i1, i0)) == zero) != swapped


def test_overview_draws_every_slice_with_grey_gaps():
    t = heatmap.as_array(np.arange(4 * 3 * 5, dtype=float) - 30, [4, 3, 5])
    pairs = [(1, 0), (3, 0), (4, 0)]
    picture = heatmap.overview_picture("a", t, t * 0.5, pairs)
    rgb, _ = decode_png(picture.png())
    for title, data, limit in (("analytic", t, 30.0), ("numeric", t * 0.5, 30.0),
                               ("analytic - numeric", t * 0.5, 15.0)):
        panel = picture.panels[title]
        assert panel.limit == limit
        for block, (i2, i3) in enumerate(pairs):
            for i1 in range(3):
                for i0 in range(4):
                    got = _edge(_cells(picture, rgb, title, i1, i0, block))
                    assert np.allclose(got, _map(data[i3, i2, i1, i0] / limit), atol=1), (title, block, i1, i0)
            if block:       # the gap before this block
                _, _, x0, _ = panel.cell(0, 0, block)
                _, _, _, x1 = panel.cell(0, 3, block - 1)
                assert x1 < x0 and (rgb[panel.y, x1:x0] == 221).all()
            # above each block, which slice it is
            x0, x1 = panel.cell(0, 0, block)[2], panel.cell(0, 3, block)[3]
            above = (rgb[panel.y - heatmap.TEXT_HEIGHT - 4:panel.y - 1, x0 - 4:x1 + 4] == 0).all(axis=2)
            assert _found(above, heatmap.text_mask(f"[:,:,{i2},{i3}]")) == 1, (title, block)


needs_chromium = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")),
    reason="no chromium installed (apt-get install chromium); .ci/run does not install it")


def _colour_pixels(png):
    """Pixels of the heatmaps' saturated reds and blues (the colour map's outer quarters, see
    test_cells_have_the_colour_of_the_map_and_nan_is_grey) in a screenshot."""
    from PIL import Image    # pillow: the test extra
    image = Image.open(png).convert("RGB")
    rgb = np.asarray(image).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    red = (r > 150) & (g < 110) & (b < 110)
    blue = (b > 130) & (r < 90) & (g < 130)
    return image.size, int((red | blue).sum())


@needs_chromium
@pytest.mark.slow
def test_screenshot_shows_the_heatmaps(story_report, tmp_path):
    """Render the story's report headless: the heatmaps are on screen, legibly large.

    Control: the same page with the image data removed renders (nearly) none of the heatmap
    colours, so the count really measures the drawn images, not the page's badges."""
    shot = tmp_path / "shot.png"
    proc = subprocess.run([sys.executable, str(SCREENSHOT), str(story_report), str(shot), "--height", "1600"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    size, coloured = _colour_pixels(shot)
    assert size == (1400, 1600)
    blank = tmp_path / "blank.html"
    blank.write_text(story_report.read_text().replace("data:image/png;base64,", "data:image/png;base64,x"))
    subprocess.run([sys.executable, str(SCREENSHOT), str(blank), str(tmp_path / "blank.png"), "--height", "1600"],
                   check=True, capture_output=True, timeout=300)
    _, coloured_blank = _colour_pixels(tmp_path / "blank.png")
    # measured: 71k heatmap pixels with images, 2.4k without (badges and links); matplotlib's
    # larger pictures had 112k
    assert coloured > 30000 and coloured_blank < coloured / 10, (coloured, coloured_blank)


def _sorted_twice_in_a_browser(story_report, tmp_path, col):
    """The report in headless Chromium, its summary's column `col` clicked twice: the class of the
    first row after each click, as "asc:CLASS desc:CLASS" (the page's title, from --dump-dom)."""
    page = story_report.read_text().replace(
        "</body>", "<script>var th = document.querySelector('#summary th[data-col=\"%d\"]');"
        " th.click(); document.title = 'asc:' + document.querySelector('#summary tbody tr').className;"
        " th.click(); document.title += ' desc:' + document.querySelector('#summary tbody tr').className;"
        "</script></body>" % col)
    (tmp_path / "sort.html").write_text(page)
    chromium = next(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n))
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           (tmp_path / "sort.html").as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r"<title>(.*?)</title>", proc.stdout)
    return found.group(1) if found else proc.stdout[:500]


@needs_chromium
@pytest.mark.slow
def test_summary_sorts_in_a_browser(story_report, tmp_path):
    """The inline script sorts by a clicked column (MAA ascending, then descending)."""
    title = _sorted_twice_in_a_browser(story_report, tmp_path, 5)
    assert title == "asc:passed desc:failed", title


@needs_chromium
@pytest.mark.slow
def test_summary_sorts_text_columns_by_their_text(story_report, tmp_path):
    """The case column has no sort key of its own (its text is the key): ascending puts
    concat_story[none-...] (passed) before concat_story[permute_...] (failed)."""
    title = _sorted_twice_in_a_browser(story_report, tmp_path, 0)
    assert title == "asc:passed desc:failed", title
