"""The HTML report: one self-contained file a reviewer can open from a CI artifact.

Its counts are pytest's own outcomes of the gradgate items (YAML cases and tests that use the
fixture), with the cases' statuses as a breakdown ("5 failed (1 crashed)"; report/counts.py).
Then a summary table of every item (failures first, sortable by a tiny inline script), then one
section per case that did not pass: for each failed parameter, heatmaps of the analytic
gradient, the numeric gradient and their difference, one 2-D slice (ne0 x ne1) per (i2, i3),
plus the worst elements; for a crash, ggml's message and the tail of its stderr. A result that
the fixture's run() returned is what its test got back, not a failure: its section comes
under a heading of its own.

Why pictures: a gradient read from the wrong places has the right values in the wrong cells,
which a list of numbers hides and a heatmap shows at once (the CONCAT story in DESIGN.md).

The pictures are drawn with numpy and encoded as PNG by the package itself (report/heatmap.py,
report/png.py): a few milliseconds each, where matplotlib took 0.1-0.5 s, so the report needs no
extra. They are base64-embedded, so the file has no dependencies and survives being downloaded
from an artifact store. Everything that comes from a case or from ggml is escaped.
"""

import base64
import html
import time
from pathlib import Path

import numpy as np

from pytest_gradgate.atomic_file import write_atomically
from pytest_gradgate.report.counts import count_text, item_outcomes, returned_to_test, tests_of
from pytest_gradgate.report.heatmap import (as_array, difference, heatmap_png, limit_text, overview_png, pick_slices,
                                            slice_name, symmetric_limit)
from pytest_gradgate.report.text import format_number as _num

# failures first; the order in which groups appear in the table and the sections (xpassed and
# xfailed: the outcome of an item without a case result, e.g. a fixture test marked xfail)
STATUS_ORDER = ("failed", "crashed", "timeout", "error", "consumer-failed", "producer-failed", "xpassed",
                "numeric-unreliable", "inconclusive", "xfailed", "skipped", "passed")
NOT_PASSED = ("failed", "crashed", "timeout", "error", "consumer-failed", "producer-failed")
# a broken ggml can fail hundreds of cases. A picture takes a few milliseconds now, but 3-6 KB of
# the file (base64; 15 KB for a slice of 64 printed values), and a case draws one overview and up
# to 8 slices per failed param: the concat-buggy ggml's cases take 5 to 25 KB each. Pictures for
# 40 cases (the new failures first) stay within about 1 MB; the rest get their numbers only
MAX_CASES_WITH_PICTURES = 40
N_WORST = 10


def _e(value):
    return html.escape("" if value is None else str(value), quote=True)


def _rank(result):
    if returned_to_test(result):       # not a failure of its test: among the passes, ahead of them
        return STATUS_ORDER.index("passed") - 0.5
    status = result.get("status", "error")
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else 0


def _anchor(index):
    return f"case-{index}"


def _img(png, alt):
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


# -- sections ----------------------------------------------------------------------------------
def _worst_rows(param, analytic=None, numeric=None):
    """The worst elements: from the values when present (more of them), else the Result's."""
    if analytic is not None:
        a, n = analytic.reshape(-1), numeric.reshape(-1)
        err = np.abs(a - n)
        ne = (list(param.get("shape") or []) + [1, 1, 1, 1])[:4]
        rows = []
        for flat in np.argsort(-err, kind="stable")[:N_WORST]:
            idx, rest = [], int(flat)
            for size in ne:
                idx.append(rest % size)
                rest //= size
            rows.append((idx, float(a[flat]), float(n[flat])))
        return rows
    a_key, n_key = (param.get("labels") or ["analytic", "numeric"])[:2]     # an equivalence case: its formulations
    return [(w["index"], w[a_key], w[n_key]) for w in param.get("worst") or []]


def _param_section(param, draw=True):
    name = param.get("name", "?")
    if param.get("nmse") is not None:       # an equivalence case: two formulations, no numeric gradient
        measured = (f'{_e(param.get("pair"))}: NMSE {_e(_num(param.get("nmse")))} (limit {_e(_num(param.get("limit")))}), '
                    f'cosine {_e(_num(param.get("cosine"), ".4f"))}, norm ratio {_e(_num(param.get("norm_ratio"), ".4g"))}, '
                    f'max |difference| {_e(_num(param.get("max_abs_diff")))} over {_e(param.get("n_elements"))} elements')
    else:
        measured = (f'MAA {_e(_num(param.get("maa")))} (limit {_e(_num(param.get("limit")))}), '
                    f'cosine {_e(_num(param.get("cosine"), ".4f"))}, norm ratio {_e(_num(param.get("norm_ratio"), ".4g"))}, '
                    f'max |a&minus;n| {_e(_num(param.get("max_abs_err")))}, compared {_e(param.get("n_compared"))} '
                    f'of {_e(param.get("n_elements"))}')
    out = [f'<div class="param"><h4>param {_e(name)} {_e(param.get("shape"))}</h4>',
           '<p class="metrics">' + measured
           + (f'<br>diagnosis: {_e(param.get("diagnosis"))}' if param.get("diagnosis") else "") + "</p>"]
    analytic = numeric = None
    has_values = param.get("analytic_values") is not None and param.get("numeric_values") is not None
    if has_values:
        analytic = as_array(param["analytic_values"], param["shape"])
        numeric = as_array(param["numeric_values"], param["shape"])
    if has_values and not draw:
        out.append(f'<p class="note">no pictures: those of {MAX_CASES_WITH_PICTURES} cases are drawn, the ones '
                   "whose test failed first</p>")
    elif has_values:
        pairs, total = pick_slices(analytic, numeric)
        vmax = symmetric_limit(analytic, numeric)
        if len(pairs) < total:
            out.append(f'<p class="note">showing {len(pairs)} of {total} slices: those with the largest '
                       "|analytic &minus; numeric|</p>")
        if len(pairs) > 1:
            label = f"{name}: all slices"
            out.append(f'<figure class="overview">{_img(overview_png(name, analytic, numeric, pairs), label)}'
                       f"<figcaption>{_e(label)} side by side, each block labelled with its slice (rows i1, "
                       "columns i0 within each slice)</figcaption></figure>")
        for i2, i3 in pairs:
            label = slice_name(name, i2, i3)
            a, n = analytic[i3, i2], numeric[i3, i2]
            png = heatmap_png(label, a, n, vmax=vmax)
            scales = (f"analytic and numeric on one scale &plusmn;{_e(limit_text(vmax))}, "
                      f"analytic &minus; numeric &plusmn;{_e(limit_text(symmetric_limit(difference(a, n))))}")
            out.append(f'<figure class="slice">{_img(png, label)}<figcaption>{_e(label)} '
                       f"(rows i1, columns i0; {scales})</figcaption></figure>")
    elif not param.get("passed", True) and param.get("nmse") is None:
        out.append('<p class="note">no per-element values (fast mode compares directional derivatives)</p>')
    worst = _worst_rows(param, analytic, numeric)
    if worst:
        a_label, n_label = (param.get("labels") or ["analytic", "numeric"])[:2]
        out.append(f'<table class="worst"><thead><tr><th>index [i0, i1, i2, i3]</th><th>{_e(a_label)}</th>'
                   f"<th>{_e(n_label)}</th><th>{'|difference|' if param.get('labels') else '|a&minus;n|'}</th>"
                   "</tr></thead><tbody>")
        for idx, a, n in worst:
            out.append(f"<tr><td>{_e(list(idx))}</td><td>{_e(_num(a, '+.6g'))}</td><td>{_e(_num(n, '+.6g'))}</td>"
                       f"<td>{_e(_num(abs(a - n), '.3g'))}</td></tr>")
        out.append("</tbody></table>")
    out.append("</div>")
    return "\n".join(out)


def _case_section(index, r, draw=True):
    status = r.get("status", "error")
    origin = r.get("origin") or {}
    out = [f'<section class="case {"returned" if returned_to_test(r) else _e(status)}" id="{_anchor(index)}">',
           f'<h3><span class="badge {_e(status)}">{_e(status)}</span> {_e(r.get("case_id"))}</h3>',
           f'<p>op {_e(r.get("op") or "?")}, producer {_e(r.get("producer") or "none")}, '
           f'consumer {_e(r.get("consumer"))}, loss {_e(r.get("loss"))}, '
           f'backend {_e(r.get("backend"))}, phase {_e(r.get("phase"))}'
           + (f', declared at {_e(origin.get("path"))}:{_e(origin.get("line"))}' if origin.get("path") else "")
           + "</p>"]
    if r.get("diagnosis"):
        out.append(f'<p class="diagnosis">diagnosis: {_e(r["diagnosis"])}</p>')
    if r.get("message") and r.get("message") != r.get("diagnosis"):
        out.append(f'<p class="message">{_e(r["message"])}</p>')
    if status in ("crashed", "timeout", "error", "consumer-failed", "producer-failed"):
        if r.get("signal"):
            out.append(f'<p class="signal">signal: {_e(r["signal"])}</p>')
        tail = r.get("stderr_tail") or ""
        out.append('<h4>stderr (tail)</h4><pre class="stderr">' + (_e(tail) if tail.strip() else "(empty)") + "</pre>")
    for param in r.get("params") or []:
        if not param.get("passed", True):
            out.append(_param_section(param, draw))
    out.append("</section>")
    return "\n".join(out)


def _summary_table(ordered, with_section=None):
    head = ("case", "op", "consumer", "backend", "status", "MAA", "cosine", "diagnosis", "phase")
    out = ['<table id="summary"><thead><tr>'
           + "".join(f'<th data-col="{i}" title="click to sort">{h}</th>' for i, h in enumerate(head))
           + "</tr></thead><tbody>"]
    for index, r in ordered:
        status = r.get("status", "error")
        outcome = r.get("outcome") or status
        shown, row_class = status, status
        if returned_to_test(r):
            shown, row_class = f"{status} (gradgate.run(); test {outcome})", "returned"
        elif outcome in ("passed", "failed"):
            if (outcome == "passed") != (status == "passed"):
                shown = f"{status} (test {outcome})"   # e.g. a case that passed, then the test's own assert
        elif outcome != status:
            shown = f"{status} ({outcome})"            # e.g. failed but xfailed by the baseline
        name = _e(r.get("case_id"))
        if index in (with_section or ()):
            name = f'<a href="#{_anchor(index)}">{name}</a>'
        maa, cos = r.get("maa"), r.get("cosine")
        # a sort key only where it is not the cell's text (the script sorts the others by their
        # text): repeating each name and diagnosis in an attribute made the table half again as big
        cells = [
            (name, None),
            (_e(r.get("op")), None),
            (_e(r.get("consumer")), None),
            (_e(r.get("backend")), None),
            (f'<span class="badge {_e(row_class)}">{_e(shown)}</span>', str(_rank(r))),
            (_e(_num(maa)), repr(float(maa)) if maa is not None else "-1"),
            (_e(_num(cos, ".4f")), repr(float(cos)) if cos is not None else "-9"),
            (_e(r.get("diagnosis") or r.get("message") or ""), None),
            (_e(r.get("phase")), None),
        ]
        out.append(f'<tr class="{_e(row_class)}" data-nodeid="{_e(r.get("nodeid") or r.get("case_id"))}" '
                   f'data-outcome="{_e(outcome)}">'
                   + "".join(f'<td data-sort="{key}">{text}</td>' if key is not None else f"<td>{text}</td>"
                             for text, key in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.2em 2em; color: #222; }
h1 { font-size: 1.4em; } h3 { margin-bottom: 0.2em; } h4 { margin: 0.8em 0 0.2em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
#summary th { cursor: pointer; background: #eee; user-select: none; }
.badge { padding: 0 5px; border-radius: 3px; color: #fff; font-size: 0.9em; white-space: nowrap; }
.badge.passed { background: #2a7a2a; } .badge.skipped { background: #888; }
.badge.failed { background: #c0392b; } .badge.crashed, .badge.timeout, .badge.error { background: #7b2d8b; }
.badge.returned { background: #4a6a8a; }
section.case { border-top: 2px solid #bbb; margin-top: 1.5em; }
figure { margin: 0.4em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-family: monospace; font-size: 0.85em; }
pre.stderr { background: #f6f6f6; border: 1px solid #ddd; padding: 0.5em; overflow-x: auto; max-height: 30em; }
.note, .meta { color: #555; font-size: 0.9em; }
"""

# click a header to sort by it; a second click reverses. Status sorts by the failures-first rank,
# MAA and cosine by their values (data-sort), the other columns by their text.
_JS = """
function key(td) { return td.dataset.sort !== undefined ? td.dataset.sort : td.textContent; }
document.querySelectorAll('#summary th').forEach(function (th) {
  th.addEventListener('click', function () {
    var col = +th.dataset.col, body = th.closest('table').tBodies[0];
    var dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return dir * c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def _to_draw(shown):
    """Indices of the cases whose gradients are drawn: MAX_CASES_WITH_PICTURES of those with
    values to draw, the ones whose test failed first (a new failure, not one the baseline
    knows, whose test xfailed), each kind in the order of the sections."""
    drawable = [(i, r) for i, r in shown
                if any(not p.get("passed", True) and p.get("analytic_values") is not None
                       and p.get("numeric_values") is not None for p in r.get("params") or [])]
    drawable.sort(key=lambda ir: ir[1].get("outcome") != "failed")          # stable: section order kept
    return {i for i, _ in drawable[:MAX_CASES_WITH_PICTURES]}


def render(results, meta=None, tests=None):
    """The report as one HTML string. results: Result dicts (Result.to_dict(), plus the
    plugin's "outcome", "nodeid" and "returned_to_test"); meta: optional {label: value} lines for
    the header; tests: pytest's outcome of each report of a gradgate item ({nodeid, outcome,
    message}, the plugin's ResultCollector), which the counts are; without them, the Results'."""
    tests = tests_of(results) if tests is None else tests
    outcome_of = item_outcomes(tests)
    # each row shows its item's outcome as pytest counted it (copies: the Results stay as given)
    rows = [dict(r, outcome=outcome_of.get(r.get("nodeid") or r.get("case_id"), r.get("outcome"))) for r in results]
    with_result = {r.get("nodeid") or r.get("case_id") for r in results}
    messages = {}
    for t in tests:
        messages.setdefault(t["nodeid"], t.get("message") or "")
    for nodeid, outcome in outcome_of.items():
        if nodeid not in with_result:
            # an item without a Result (an invalid case, a test that failed before its check): a
            # row with pytest's outcome and reason, so that the table holds every item counted
            rows.append({"case_id": nodeid, "nodeid": nodeid, "status": outcome, "outcome": outcome,
                         "message": messages.get(nodeid, ""), "no_result": True})
    indexed = list(enumerate(rows))
    ordered = sorted(indexed, key=lambda ir: (_rank(ir[1]), str(ir[1].get("case_id"))))
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>gradgate report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>gradgate: ggml backward-pass report</h1>",
             f'<p class="counts">{_e(count_text(tests, results))}</p>']
    lines = dict(meta or {})
    lines.setdefault("generated", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    parts.append('<p class="meta">' + "<br>".join(f"{_e(k)}: {_e(v)}" for k, v in lines.items()) + "</p>")
    not_passed = [(i, r) for i, r in ordered if r.get("status") in NOT_PASSED and not r.get("no_result")]
    # a failure the baseline knows (its test xfailed) is a row of the table, not a section: the
    # report is for what is new, and a fork's run has hundreds of known failures (issue 52: their
    # sections were most of a 5.3 MB file); the JSON report (--gradgate-json) has every case's details
    known = [(i, r) for i, r in not_passed if r.get("outcome") == "xfailed" and not returned_to_test(r)]
    known_rows = {i for i, _ in known}
    shown = [(i, r) for i, r in not_passed if i not in known_rows]
    parts.append(_summary_table(ordered, {i for i, _ in shown}))
    failing = [(i, r) for i, r in shown if not returned_to_test(r)]
    returned = [(i, r) for i, r in shown if returned_to_test(r)]
    drawn = _to_draw(failing + returned)
    if known:
        parts.append(f'<p class="note known">{len(known)} known failure(s), which the baseline records and whose tests '
                     "xfailed, are rows of the table above, without a section of their own (the JSON report, "
                     "--gradgate-json, has the details of every case)</p>")
    for group, heading in ((failing, f"Cases that did not pass ({len(failing)})"),
                           (returned, f"Results returned by gradgate.run() that did not pass ({len(returned)}): "
                                      "their tests assert on them, so they are not failures of those tests")):
        if group:
            parts.append(f'<h2 class="group">{_e(heading)}</h2>')
            for i, r in group:
                parts.append(_case_section(i, r, draw=i in drawn))
    parts.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(parts)


def write(path, results, meta=None, tests=None):
    """Render and write atomically (a half-written report is worse than none)."""
    path = Path(path)
    write_atomically(path, render(results, meta, tests))    # its temp file is removed on every path
    return path
