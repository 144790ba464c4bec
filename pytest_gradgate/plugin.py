"""The pytest plugin: options, the build at session start, collection of YAML cases,
items that run cases in isolation, and the run's outputs.

Without --gradgate the plugin stays out of the way: nothing is built, no YAML file is
collected; only the `gradgate` fixture is available (it builds on first use).
"""

import dataclasses
import re
from pathlib import Path

import pytest

from . import baseline as baseline_file
from . import outputs, settings
from .build import BuildOptions, ensure_build, gpu_visible
from .errors import GradgateError
from .fixtures import gradgate  # noqa: F401  (registers the fixture)
from .isolation import BROKEN_BUILD, Runner
from .loader import load_file
from . import report_html
from .report_text import format_result
from .source import resolve_source

# the built-in suite: small cases (full mode) and realistic sizes (fast mode)
BUILTIN_FILES = [(Path(__file__).parent / n).resolve() for n in ("cases.yaml", "cases_fast.yaml")]
CASE_FILE_RE = re.compile(r"^gradgate_.*\.ya?ml$")
STATE = pytest.StashKey()


class GradgateFailure(Exception):
    """A case that did not pass; repr_failure shows its Result, not a traceback."""

    def __init__(self, result, text=None):
        super().__init__(result.message)
        self.result = result
        self.text = text


class GateState:
    """Per-session state: settings, the build, the runner, the results seen so far."""

    def __init__(self, config):
        self.config = config
        self.case_files = set()
        self.enabled = config.getoption("gradgate")
        self.settings = settings.effective(config)
        backend = self.settings["backend"]
        self.backends = ("cpu", "cuda") if backend == "all" else (backend,)
        self.source = None
        self.build = None
        self._runner = None
        self.results = []
        self.invalid_cases = []         # declarations that could not be loaded: path, line, message
        self.start_failures_in_a_row = 0
        self.baseline = None            # known failures (baseline.Baseline), see load_baseline
        self.update_baseline = config.getoption("gradgate_update_baseline")

    # -- build ---------------------------------------------------------------------------
    def build_options(self):
        return BuildOptions(build_type=self.settings["build_type"], backends=tuple(sorted(set(self.backends))),
                            cuda_arch=self.settings["cuda_arch"])

    def ensure_build(self):
        if self.build is None:
            self.source = resolve_source(self.config.getoption("gradgate_ggml_src"),
                                         self.config.getini("gradgate_ggml_src"))
            self.build = ensure_build(self.source.root, self.build_options(), progress=self._progress())
        return self.build

    def _progress(self):
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return None
        last = {"text": None, "label": None, "quarter": -1}

        def show(text):
            if text == last["text"]:
                return
            last["text"] = text
            if tr.isatty:  # one updating line
                tr.rewrite(f"gradgate: {text}", erase=True)
                return
            # a log (CI): each step's first line, then one line per quarter of the build
            label, _, counter = text.partition(" [")
            done, _, total = counter.rstrip("]%").partition("/")
            quarter = int(done) * 4 // int(total) if done.isdigit() and total.isdigit() and int(total) else -1
            if label != last["label"] or quarter > last["quarter"]:
                tr.write_line(f"gradgate: {text}")
            last["label"], last["quarter"] = label, max(quarter, last["quarter"] if label == last["label"] else -1)
        return show

    def load_baseline(self):
        """The baseline given, else the shipped one when the source is the pinned default."""
        path = self.settings["baseline"]
        if path is None and self.source.origin == "default":
            path = baseline_file.DEFAULT_BASELINE
        if self.update_baseline and path is None:
            raise GradgateError("--gradgate-update-baseline: name the file to write with --gradgate-baseline FILE "
                                "(or ini gradgate_baseline / env GRADGATE_BASELINE)")
        if path is None:
            return None
        if self.update_baseline and not Path(path).exists():
            self.baseline = baseline_file.Baseline(path)
        else:
            self.baseline = baseline_file.Baseline.load(path)
        return self.baseline

    def runner(self):
        if self._runner is None:
            build = self.ensure_build()
            self._runner = Runner(build.library, isolate=self.settings["isolate"],
                                  max_memory=self.settings["max_memory"], backtrace=self.settings["backtrace"],
                                  timeout=self.settings["timeout"] or None)
        return self._runner

    def close(self):
        if self._runner:
            self._runner.close()


def state_of(config):
    return config.stash[STATE]


# -- hooks ---------------------------------------------------------------------------------
def pytest_addoption(parser):
    settings.add_options(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "gradgate: a gradient check declared in YAML or with the gradgate fixture")
    state = GateState(config)
    config.stash[STATE] = state
    config.pluginmanager.register(ResultCollector(state), "gradgate-results")
    config.pluginmanager.register(outputs.GateOutputs(state), "gradgate-outputs")
    if state.settings["html"]:
        # fail now, not after a long run whose report could then not be drawn
        try:
            report_html.require_matplotlib()
        except ImportError as exc:
            raise pytest.UsageError(str(exc)) from None
    if not state.enabled:
        return
    if "cuda" in state.backends and not gpu_visible():
        raise pytest.UsageError(
            f"--gradgate-backend {state.settings['backend']}: no NVIDIA GPU is visible on this machine "
            "(no /dev/nvidia0 and nvidia-smi not found); use --gradgate-backend cpu, or run on a GPU machine")
    extra = [] if config.getoption("gradgate_no_builtin") else [str(p) for p in BUILTIN_FILES if p.is_file()]
    for p in state.settings["cases"] or ():
        if not Path(p).is_file():
            raise pytest.UsageError(f"--gradgate-cases / gradgate_cases: '{p}' is not a file")
        extra.append(str(Path(p).resolve()))
    state.case_files = {str(Path(p).resolve()) for p in extra}
    # keep paths the user named or the project's testpaths (gradgate_*.yaml are discovered
    # there); drop the bare invocation directory unless a project config says it is one,
    # so that `cd /tmp && pytest --gradgate` checks the built-in suite and nothing else
    source = config.args_source
    explicit = source == pytest.Config.ArgsSource.ARGS
    keep = explicit or source == pytest.Config.ArgsSource.TESTPATHS or config.inipath is not None
    # without explicit paths `pytest --gradgate` is the gate alone: the project's Python
    # tests under testpaths are not collected, only its gradgate_*.yaml files
    state.yaml_only = not explicit
    config.args = (list(config.args) if keep else []) + [p for p in extra if p not in config.args]


def pytest_ignore_collect(collection_path, config):
    state = config.stash.get(STATE, None)
    if state is None or not state.enabled or not getattr(state, "yaml_only", False):
        return None
    if collection_path.is_file() and collection_path.suffix not in (".yaml", ".yml"):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    state = state_of(session.config)
    if not state.enabled:
        return
    try:
        state.ensure_build()
        state.load_baseline()
    except GradgateError as exc:
        raise pytest.UsageError(f"gradgate: {exc}") from None


def pytest_report_header(config):
    state = state_of(config)
    if not state.enabled or state.build is None:
        return None
    info = state.build.info
    how = "cached" if state.build.cached else f"built in {info.get('build_seconds')} s"
    # read from the library, not from the source tree; asked of the worker, because a
    # library that cannot load (truncated, foreign) kills the process that dlopens it
    version = state.runner().ggml_version() or "? (the library cannot be loaded, see below)"
    return [f"gradgate: ggml {version} from {state.source.label}",
            f"gradgate: {info['options']['build_type']} build for {', '.join(state.backends)} ({how}): "
            f"{state.build.library}",
            f"gradgate: isolate={state.settings['isolate']}"] + _baseline_header(state, info)


def _baseline_header(state, info):
    b = state.baseline
    if b is None:
        return []
    line = f"gradgate: baseline {b.path} ({len(b)} known failures"
    if b.ggml_version and b.ggml_version != info.get("ggml_version"):
        line += f", recorded on ggml {b.ggml_version}"
    line += "; rewritten at the end of this run)" if state.update_baseline else ")"
    return [line]


def pytest_collect_file(file_path, parent):
    state = state_of(parent.config)
    if not state.enabled or file_path.suffix not in (".yaml", ".yml"):
        return None
    resolved = file_path.resolve()
    if resolved in BUILTIN_FILES and str(resolved) in state.case_files:
        # outside the rootdir: give it a stable, readable node id (for -k, --lf, reports)
        return CaseFile.from_parent(parent, path=file_path, nodeid=f"pytest_gradgate/{file_path.name}")
    if CASE_FILE_RE.match(file_path.name) or str(resolved) in state.case_files:
        return CaseFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if isinstance(item, InvalidCaseItem) and call.when == "setup":
        # rides on the report like results do, for the GitHub annotation on the bad line
        err = item.error
        report.gradgate_invalid = {"path": str(err.path) if err.path else None, "line": err.line,
                                   "message": err.args[0] if err.args else str(err)}
    result = getattr(item, "gradgate_result", None)
    if result is not None and call.when == "call":
        # rides on the report, so it reaches the controller under pytest-xdist
        data = result.to_dict()
        data["outcome"] = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        data["skip_reason"] = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        data["baseline"] = getattr(item, "gradgate_baseline", None)    # "known", "stale" or None
        data["nodeid"] = item.nodeid
        if data["baseline"] == "stale":
            data["message"] = getattr(item, "gradgate_stale_text", data["message"])
        report.gradgate_result = data
    return report


class ResultCollector:
    """Collects the Results riding on reports (on the xdist controller too)."""

    def __init__(self, state):
        self.state = state

    def pytest_runtest_logreport(self, report):
        result = getattr(report, "gradgate_result", None)
        if result is not None:
            self.state.results.append(result)
        invalid = getattr(report, "gradgate_invalid", None)
        if invalid is not None:
            self.state.invalid_cases.append(invalid)


def pytest_sessionfinish(session, exitstatus):
    state = state_of(session.config)
    path = state.settings["html"]
    # under xdist only the controller writes: it has every worker's results
    if not path or hasattr(session.config, "workerinput") or not (state.enabled or state.results):
        return
    meta = {"exit status": int(exitstatus)}
    if state.build is not None:
        meta["ggml"] = f"{state.build.info.get('ggml_version')} from {state.source.label}"
        meta["library"] = str(state.build.library)
    try:
        target = Path(session.config.invocation_params.dir) / path
        state.html_report = str(report_html.write(target, state.results, meta))
    except OSError as exc:
        state.html_report = exc


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = state_of(config)
    failed = outputs.failed_results(state.results)     # incl. crashes, timeouts, stale baseline entries
    blind = [r for r in state.results if r["status"] == "passed" and r.get("power") is False]
    if failed:
        terminalreporter.write_sep("=", "gradgate failures")
        for r in failed:
            terminalreporter.write_line(f"{r['case_id']}: {outputs.one_line(r)}")
    if blind:
        terminalreporter.write_sep("-", "gradgate blind cases (a scrambled gradient would pass them)")
        for r in blind:
            terminalreporter.write_line(f"{r['case_id']}: {r.get('diagnosis')}")
    written = getattr(state, "html_report", None)
    if isinstance(written, OSError):
        terminalreporter.write_line(f"gradgate: could not write the HTML report (--gradgate-html): {written}", red=True)
    elif written:
        terminalreporter.write_line(f"gradgate: HTML report written to {written}")


def pytest_unconfigure(config):
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()


# -- collection nodes ----------------------------------------------------------------------
class CaseFile(pytest.File):
    def collect(self):
        state = state_of(self.config)
        builtin = self.path.resolve() in BUILTIN_FILES
        loaded, errors = load_file(self.path, state.backends, builtin=builtin)
        mode = state.settings["mode"]   # --gradgate-mode overrides every case's own mode
        for entry in loaded:
            for case in entry.cases:
                if mode and case.mode != mode:
                    case = dataclasses.replace(case, mode=mode)
                yield CaseItem.from_parent(self, name=f"{case.name}[{case.variant}]", case=case)
        for err in errors:
            yield InvalidCaseItem.from_parent(self, name=f"line{err.line or 0}[invalid]", error=err)


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.add_marker("gradgate")

    def runtest(self):
        state = state_of(self.config)
        result = state.runner().run(self.case)
        self.gradgate_result = result
        _track_start_failures(state, result, self.session)
        _decide(self, result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, GradgateFailure):
            return excinfo.value.text or format_result(excinfo.value.result)
        if isinstance(excinfo.value, GradgateError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.case.origin.get("line", 1) - 1, self.case.id


class InvalidCaseItem(pytest.Item):
    """A case that could not be loaded: one error at its file:line; the others still run."""

    def __init__(self, *, error, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def setup(self):
        # an ERROR (like a collection error) whose text is the file:line message, no traceback:
        # setup failures do not go through repr_failure
        pytest.fail(f"invalid case: {self.error}", pytrace=False)

    def runtest(self):
        raise self.error

    def repr_failure(self, excinfo):
        return f"invalid case: {excinfo.value}"

    def reportinfo(self):
        return self.path, (self.error.line or 1) - 1, f"invalid case at line {self.error.line}"


def _track_start_failures(state, result, session):
    """The crash cap: cases that die before ggml is even reached point at the build, not at
    the cases; stop with one message instead of N identical failures."""
    if result.phase != "startup" or result.status not in ("error", "crashed"):
        state.start_failures_in_a_row = 0
        return
    state.start_failures_in_a_row += 1
    broken = result.diagnosis == BROKEN_BUILD  # the library cannot load: no later case can run
    if broken or state.start_failures_in_a_row >= state.settings["crash_cap"]:
        why = ("the library cannot be loaded" if broken else
               f"{state.start_failures_in_a_row} cases in a row died before reaching ggml (--gradgate-crash-cap)")
        where = f" (remove {state.build.path} so that it is rebuilt)" if state.build is not None else ""
        session.shouldstop = f"gradgate: stopped early: {why}; the build looks broken{where}: {result.message}"


def _decide(item, result):
    """Turn a Result into pytest's outcome; the baseline turns known failures into xfails."""
    if result.stderr_tail:
        item.add_report_section("call", "ggml stderr", result.stderr_tail)
    if result.status == "skipped":
        pytest.skip(result.message)
    baseline = state_of(item.config).baseline
    known = baseline.get(item.case.id) if baseline is not None else None
    update = state_of(item.config).update_baseline
    if result.status == "passed":
        if result.power is False:
            item.warn(pytest.PytestWarning(f"gradgate: {item.case.id} is blind: {result.diagnosis}"))
        if known and not update:
            # like a strict xfail: a fixed case must leave the baseline, or it could regress unseen
            item.gradgate_baseline = "stale"
            item.gradgate_stale_text = baseline_file.stale_text(item.case.id, known, baseline.path)
            raise GradgateFailure(result, text=item.gradgate_stale_text)
        return
    if item.case.builtin and result.no_backward:
        pytest.skip(f"{result.diagnosis} ({result.message})")
    if update:
        item.gradgate_baseline = "known"
        pytest.xfail(f"recorded in the new baseline {baseline.path}: {baseline_file.reason_of(result)}")
    if known:
        item.gradgate_baseline = "known"
        pytest.xfail(baseline_file.xfail_reason(known, result))
    raise GradgateFailure(result)
