"""The run's machine-readable outputs, built from the Results collected on the controller:
the JSON report (--gradgate-json), GitHub Actions error annotations and the Markdown table
for the job's step summary. Plain functions of plain data, and the hooks that write them."""

import json
import math
import os
import platform
from pathlib import Path

import pytest

from pytest_gradgate.atomic_file import write_atomically
from pytest_gradgate.report.counts import count_text, tests_of
from pytest_gradgate.report.text import format_number as _fmt

REPORT_SCHEMA_VERSION = 1
REPORT_SCHEMA_FILE = Path(__file__).parent / "report.schema.json"

# per case, in this order; the Result's per-element values lists are left out on purpose
CASE_FIELDS = ("case_id", "name", "op", "producer", "consumer", "loss", "backend", "mode", "threads", "status", "outcome", "phase",
               "maa", "max_maa", "limit", "cosine", "power", "diagnosis", "message", "signal",
               "baseline", "skip_reason", "duration", "nodeid", "formulations", "nmse", "earlier_in_child", "rerun",
               "alloc")
PARAM_FIELDS = ("name", "shape", "producer", "maa", "limit", "cosine", "norm_ratio", "max_abs_err", "n_compared",
                "n_elements", "power", "passed", "pair", "nmse", "max_abs_diff")


def failed_results(results):
    """Results that made the gate fail: failures, crashes, timeouts and stale baseline entries.
    A case that passed in a test that then failed on its own assertion is not one of them:
    pytest reports that test's failure, and "passed in phase done" is no reason."""
    return [r for r in results if r.get("outcome") == "failed"
            and (r.get("status") != "passed" or r.get("baseline") == "stale")]


def finite_json(value):
    """JSON has no NaN or Infinity: they become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def case_record(r):
    record = {"id": r["case_id"]}
    record.update((k, r.get(k)) for k in CASE_FIELDS if k != "case_id")
    origin = r.get("origin") or {}
    record["origin"] = {"path": origin.get("path"), "line": origin.get("line")}
    record["params"] = [{k: p.get(k) for k in PARAM_FIELDS} for p in r.get("params") or []]
    return record


def counts(results, key="outcome"):
    out = {}
    for r in results:
        word = r["status"] if key == "status" else (r.get("outcome") or r["status"])
        out[word] = out.get(word, 0) + 1
    return out


def report(results, facts=None, backends=(), baseline=None, exitstatus=None, invalid=()):
    """The versioned JSON document (see report.schema.json). `facts`: GateState.build_facts
    (None when no case ran, so nothing was built)."""
    facts = facts or {}
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "pytest-gradgate", "version": _version()},
        "ggml": {"label": facts.get("label"), "origin": facts.get("origin"), "root": facts.get("root"),
                 "version": facts.get("version") or facts.get("built_version")},
        "build": {"options": facts.get("options"), "library": facts.get("library"),
                  "compiler": facts.get("compiler")},
        "backends": list(backends),
        "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version()},
        "baseline": str(baseline.path) if baseline is not None else None,
        "exitstatus": int(exitstatus) if exitstatus is not None else None,
        "summary": counts(results),
        # how the cases ended (check/outcome.py Status): the summary counts pytest's outcomes,
        # where a crash and a consumer that fails on its own are both "failed"
        "statuses": counts(results, key="status"),
        "cases": [case_record(r) for r in results],
        "invalid_cases": [{"path": bad.get("path"), "line": bad.get("line"), "message": bad.get("message") or ""}
                          for bad in invalid],
    }
    return finite_json(doc)


def write_report(path, doc):
    write_atomically(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


def _version():
    try:
        from importlib.metadata import version
        return version("pytest-gradgate")
    except Exception:  # not installed (run from a checkout)
        return None


# -- GitHub Actions ----------------------------------------------------------------------
def _escape_data(text):
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text):
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _repo_path(path, workspace=None):
    """GitHub resolves annotation files relative to the repository checkout."""
    workspace = workspace or os.environ.get("GITHUB_WORKSPACE")
    if path and workspace:
        try:
            return str(Path(path).resolve().relative_to(Path(workspace).resolve()))
        except ValueError:
            pass
    return path


def one_line(r):
    """`MAA 4.44 > 1e-4: diagnosis` or `crashed in phase compute: diagnosis`."""
    if r.get("baseline") == "stale":
        return r.get("message") or "fixed: remove it from the baseline"
    if r.get("baseline") == "changed":
        return r.get("message") or "a known failure that now fails another way"
    if r.get("baseline") == "own":
        return f"{r.get('baseline_note')}: {one_line({**r, 'baseline': None})}"
    limit = r.get("limit") or r.get("max_maa")
    # a case can fail with its MAA within the limit (an alias, a nondeterministic backward):
    # then the line says where it stopped, not a comparison that is false
    why = r.get("diagnosis") or r.get("message") or ""
    # "crashed in phase X: ggml aborted in phase X: ..." said the phase twice: once is enough
    where = "" if f"in phase {r['phase']}" in why else f" in phase {r['phase']}"
    what = (f"MAA {_fmt(r.get('maa'))} > {_fmt(limit)}"
            if r["status"] == "failed" and _exceeds(r.get("maa"), limit) else
            f"NMSE {_fmt(r.get('nmse'))} > {_fmt(r.get('limit'))}"      # an equivalence case
            if r["status"] == "failed" and r.get("nmse") is not None else f"{r['status']}{where}")
    return f"{what}: {why}".rstrip(": ")


def _exceeds(maa, limit):
    try:
        return maa is not None and not float(maa) <= float(limit)    # NaN exceeds any limit
    except (TypeError, ValueError):
        return maa is not None


def _annotation(path, line, title, message, workspace=None):
    props = []
    if path:
        props.append(f"file={_escape_property(_repo_path(path, workspace))}")
        if line:
            props.append(f"line={int(line)}")
    props.append(f"title={_escape_property(title)}")
    return f"::error {','.join(props)}::{_escape_data(message)}"


def annotations(results, workspace=None, invalid=()):
    """`::error file=...,line=...,title=...::message` for each case that failed the gate, and
    for each case declaration that could not be loaded (`invalid`: dicts path, line, message)."""
    lines = []
    for r in failed_results(results):
        origin = r.get("origin") or {}
        lines.append(_annotation(origin.get("path"), origin.get("line"), "gradgate: " + r["case_id"],
                                 r["case_id"] + ": " + one_line(r), workspace))
    for bad in invalid:
        lines.append(_annotation(bad.get("path"), bad.get("line"), "gradgate: invalid case",
                                 "invalid case: " + bad["message"], workspace))
    return lines


def _cell(text):
    """Text for a Markdown table cell (or list item): one line, no column break, no HTML, no code span end."""
    text = " ".join(str(text).splitlines())
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("`", "'"))


def step_summary(results, source_label=None, tests=None):
    """A Markdown section for $GITHUB_STEP_SUMMARY. tests: pytest's outcome of each report of a
    gradgate item (report/counts.py), which its head line counts, as pytest's own line does."""
    failed = failed_results(results)
    known = [r for r in results if r.get("outcome") == "xfailed"]
    head = count_text(tests_of(results) if tests is None else tests, results)
    out = [f"## gradgate: {'FAILED' if failed else 'passed'} ({head})", ""]
    if source_label:
        out += [f"ggml: {_cell(source_label)}", ""]
    if failed:
        out += ["| case | status | phase | MAA | limit | cosine | diagnosis | declared at |",
                "|---|---|---|---|---|---|---|---|"]
        for r in failed:
            origin = r.get("origin") or {}
            where = f"{_repo_path(origin.get('path'))}:{origin.get('line')}" if origin.get("path") else "-"
            status = "stale baseline entry" if r.get("baseline") == "stale" else r["status"]
            out.append(f"| `{_cell(r['case_id'])}` | {status} | {r['phase']} | {_fmt(r.get('maa'))} | "
                       f"{_fmt(r.get('limit') or r.get('max_maa'))} | {_fmt(r.get('cosine'), '.3f')} | "
                       f"{_cell(r.get('message') if r.get('baseline') == 'stale' else r.get('diagnosis') or r.get('message') or '')} | "
                       f"{_cell(where)} |")
        out.append("")
    if known:
        out += [f"<details><summary>{len(known)} known failures (baseline)</summary>", ""]
        out += [f"- `{_cell(r['case_id'])}`: {_cell(r['status'])}: {_cell(r.get('diagnosis') or r.get('message') or '')}"
                for r in known]
        out += ["", "</details>", ""]
    return "\n".join(out) + "\n"


def on_github_actions(env=None):
    env = os.environ if env is None else env
    return env.get("GITHUB_ACTIONS") == "true"


def append_step_summary(text, env=None):
    env = os.environ if env is None else env
    path = env.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)
    return True


# -- the hooks that write them (registered by plugin.py) -----------------------------------
class GateOutputs:
    """Writes the outputs at the end of the session. Under pytest-xdist only the controller
    does: it is the one process that has every worker's results."""

    def __init__(self, state):
        self.state = state
        self.json_written = None

    def _active(self, config):
        return (self.state.enabled or self.state.results) and not hasattr(config, "workerinput")

    def pytest_sessionfinish(self, session, exitstatus):
        state = self.state
        if not self._active(session.config):
            return
        path = state.settings["json"]
        self.write_errors = []
        if path:
            # like --gradgate-html: relative to where pytest was started, and a path that
            # cannot be written is one line in the summary, not an INTERNALERROR
            path = Path(session.config.invocation_params.dir) / path
            doc = report(state.results, state.build_facts, state.backends, state.baseline, exitstatus,
                         state.invalid_cases)
            try:
                write_report(path, doc)
                self.json_written = path
            except OSError as exc:
                self.write_errors.append(f"could not write the JSON report (--gradgate-json): {exc}")
        if state.update_baseline and state.baseline is not None:
            version = (state.build_facts or {}).get("built_version")
            from pytest_gradgate.gate import baseline as baseline_file
            ran, upstream = state.baseline, getattr(state, "upstream", None)

            def change(current):
                # this run's explore findings and results, over the file as other runs left it
                current.record_explore(ran.explore_added)
                return current.updated(state.results, version, upstream)
            try:
                state.baseline = baseline_file.record(ran.path, change)
            except OSError as exc:
                self.write_errors.append(f"could not write the baseline (--gradgate-baseline): {exc}")
                state.baseline = None
        if on_github_actions():
            append_step_summary(step_summary(state.results, state.source.label if state.source else None,
                                             state.gate_reports))
        if self.write_errors and session.exitstatus == 0:
            # an output the run was asked for is missing: CI must not read that as a pass
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if not self._active(config):
            return
        if self.json_written:
            terminalreporter.write_line(f"gradgate: JSON report written to {self.json_written}")
        for error in getattr(self, "write_errors", ()):
            terminalreporter.write_line(f"gradgate: {error}", red=True)
        if self.state.update_baseline and self.state.baseline is not None:
            b = self.state.baseline
            upstream = getattr(self.state, "upstream", None)
            if upstream is None:
                terminalreporter.write_line(f"gradgate: baseline written to {b.path} ({len(b)} known failures)")
            else:
                own = b.own_unaccepted()
                theirs = sum(1 for e in b.entries.values() if e.get("upstream"))
                terminalreporter.write_line(
                    f"gradgate: baseline written to {b.path}: {len(b)} entries, {theirs} of them upstream "
                    f"{upstream.upstream}'s known failures; {len(own)} the fork's own, not accepted: each stays red "
                    "until its entry is given an \"accepted\": \"<why>\" reason", yellow=bool(own))
                for key in own:
                    terminalreporter.write_line(f"  the fork's own: {key}: {b.entries[key].get('reason')}")
        if on_github_actions():
            for line in annotations(self.state.results, invalid=self.state.invalid_cases):
                terminalreporter.write_line(line)
