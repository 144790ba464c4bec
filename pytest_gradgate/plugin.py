"""pytest-gradgate's pytest entry point: the hooks, and nothing heavy.

Loading this module costs what a small plugin costs: numpy, cffi, yaml, the build and the
engine are imported only by hooks that run with --gradgate, or by the `gradgate` fixture
when a test uses it. Without --gradgate nothing is built and no YAML file is collected.
The work itself lives in gate/ (state, selection, items, baseline) and report/.
"""

import json
from pathlib import Path

import pytest

from pytest_gradgate.fixtures import gradgate  # noqa: F401  (registers the fixture)
from pytest_gradgate.gate import settings
from pytest_gradgate.gate.state import STATE, GateState, state_of
from pytest_gradgate.printable import inline


def pytest_addoption(parser):
    settings.add_options(parser)


def pytest_addhooks(pluginmanager):
    from pytest_gradgate import hookspecs
    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # pytest chose its rootdir and config before it knew our options, so the value of
    # `--gradgate-ggml-src PATH` (with a space) was taken for a test path
    if settings.path_option_used(args):
        from pytest_gradgate.gate import rootdir
        rootdir.without_option_values(early_config, parser, args)


def pytest_configure(config):
    config.addinivalue_line("markers", "gradgate: a gradient check declared in YAML or with the gradgate fixture")
    state = GateState(config)
    config.stash[STATE] = state
    config.pluginmanager.register(ResultCollector(state, config), "gradgate-results")
    from pytest_gradgate.report import outputs     # stdlib only: JSON, GitHub annotations
    config.pluginmanager.register(outputs.GateOutputs(state), "gradgate-outputs")
    _check_report_paths(config, state)
    if not state.enabled:
        return
    _clear_old_reports(config, state)
    from pytest_gradgate.gate.declared_ops import hook_ops
    hook_ops(config)    # a bad declaration stops the run now, before anything is built
    from pytest_gradgate.library.cmake import gpu_visible
    from pytest_gradgate.errors import GradgateError
    from pytest_gradgate.gate.selection import gate_args
    from pytest_gradgate.check.precision import parse_backends
    unknown = [b for b in parse_backends(state.settings["tf32"]) if b not in ("cpu", "cuda")]
    if unknown:
        raise pytest.UsageError(f"--gradgate-tf32 / GRADGATE_TF32 / ini gradgate_tf32: '{unknown[0]}' is not a "
                                "backend; name cpu or cuda (comma-separated), or none")
    if "cuda" in state.backends and not gpu_visible():
        raise pytest.UsageError(
            f"--gradgate-backend {state.settings['backend']}: no NVIDIA GPU is visible on this machine "
            "(no /dev/nvidia0 and nvidia-smi not found); use --gradgate-backend cpu, or run on a GPU machine")
    _check_sanitize(state)
    extra = []
    for p in state.settings["cases"] or ():
        if not Path(p).is_file():
            raise pytest.UsageError(f"--gradgate-cases / gradgate_cases: '{p}' is not a file")
        extra.append(str(Path(p).resolve()))
    try:
        state.choose_source()       # a bad path is a usage error now; the default is fetched on first use
        from pytest_gradgate.gate import parity
        parity.configure(state)     # ... and so is a bad --gradgate-reference-src
        state.load_baseline()
    except GradgateError as exc:
        raise pytest.UsageError(f"gradgate: {exc}") from None
    if state.explore:
        from pytest_gradgate.gate import explore
        explore.configure(config, state)
        config.args, state.yaml_only = [], True     # its items come from the search (explore.collect)
        return
    config.args, state.yaml_only = gate_args(config, config.getoption("gradgate_no_builtin"), extra)
    state.case_files = {str(Path(a.split("::", 1)[0]).resolve()) for a in config.args} | set(extra)
    if _runs_cases_here(config) and not config.option.collectonly and state.settings["isolate"] != "none":
        state.start_early()     # the first worker starts while pytest collects


def _report_paths(config, state):
    """{option: the file it names, resolved as the run will write it} for the files a run writes."""
    here = Path(config.invocation_params.dir)
    named = {"--gradgate-json": state.settings["json"], "--gradgate-html": state.settings["html"],
             "--junitxml": getattr(config.option, "xmlpath", None), "--gradgate-baseline": state.settings["baseline"]}
    return {option: (here / Path(path).expanduser()).resolve() for option, path in named.items() if path}


def _check_report_paths(config, state):
    """Two outputs named to one file: one would silently replace the other; say so now."""
    seen = {}
    for option, path in _report_paths(config, state).items():
        if path in seen:
            raise pytest.UsageError(f"{seen[path]} and {option} name one file ({path}): each output needs its own "
                                    "path, or one would silently replace the other")
        seen[path] = option


def _clear_old_reports(config, state):
    """A report left by an earlier run must not read as this run's when this one is killed before
    it writes its own (SIGTERM, a CI job's timeout): removed now, written again at the end."""
    if hasattr(config, "workerinput"):
        return      # under xdist the controller writes (and clears) them
    for option, path in _report_paths(config, state).items():
        if option != "--gradgate-baseline" and path.is_file():
            try:
                path.unlink()
            except OSError:
                pass    # then writing it at the end fails too, and says so


def _check_sanitize(state):
    """--gradgate-sanitize with settings it cannot run under: a usage error now, not a dead run."""
    sanitize = state.settings["sanitize"]
    if not sanitize:
        return
    if state.settings["isolate"] == "none":
        # Python is not instrumented: the runtime must be preloaded, in a worker (library/sanitizer.py)
        raise pytest.UsageError(f"--gradgate-sanitize {sanitize} needs the cases in worker processes, which start "
                                "with the sanitizer's runtime preloaded: this process cannot load the build "
                                "(--gradgate-isolate none); use --gradgate-isolate case, fresh or worker")
    if "cuda" in state.backends:
        raise pytest.UsageError(f"--gradgate-sanitize {sanitize} builds and checks the CPU backend only (CUDA's "
                                f"runtime and ASan's shadow memory do not mix); use --gradgate-backend cpu")


def _runs_cases_here(config):
    """False in an xdist controller: it hands the items to its workers, which run them."""
    if hasattr(config, "workerinput"):
        return True
    return not getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") == "no"


def pytest_collection_modifyitems(session, config, items):
    state = config.stash.get(STATE, None)
    if state is None or not state.enabled:
        return
    # the long cases first (gate/order.py); --ff and --nf still get the last word: their hooks wrap this one
    from pytest_gradgate.gate.items import CaseItem
    from pytest_gradgate.gate.order import long_first
    items[:] = long_first(items, lambda item: item.case if isinstance(item, CaseItem) else None)
    if state.explore:
        from pytest_gradgate.gate import explore
        explore.collect(session, items)


# after collection, without --gradgate, when collected tests use the fixture (tests import it)
FIXTURE_TESTS_RUN = ("gradgate: {count} {tests} the gradgate fixture, whose checks run without --gradgate: "
                     "ggml is built (or found in the cache) when the first one runs; "
                     '-m "not gradgate" leaves them out')


def pytest_report_collectionfinish(config, items):
    # a test that asks for the fixture asks for its check, so it runs without --gradgate (a skip
    # would let a plain `pytest` in CI pass unchecked); this line says why ggml gets built
    state = config.stash.get(STATE, None)
    if state is None or state.enabled:
        return None
    count = sum(1 for item in items if "gradgate" in getattr(item, "fixturenames", ()))
    if not count:
        return None
    return FIXTURE_TESTS_RUN.format(count=count, tests="test uses" if count == 1 else "tests use")


def pytest_itemcollected(item):
    # tests that use the fixture are gradient checks too: `-m gradgate` selects them with the YAML cases
    if "gradgate" in getattr(item, "fixturenames", ()):
        item.add_marker("gradgate")


def pytest_ignore_collect(collection_path, config):
    state = config.stash.get(STATE, None)
    if state is None or not state.enabled or not getattr(state, "yaml_only", False):
        return None
    if collection_path.is_file() and collection_path.suffix not in (".yaml", ".yml"):
        return True
    return None


def pytest_report_header(config):
    state = state_of(config)
    if not state.enabled:
        return None
    sanitize = state.settings["sanitize"]
    lines = [f"gradgate: ggml from {state.source.label}; {state.settings['build_type']} build for "
             f"{', '.join(state.backends)}" + (f" with -fsanitize={sanitize} (--gradgate-sanitize)" if sanitize else "")
             + ", made or found when the first case runs",
             f"gradgate: isolate={state.settings['isolate']}" + _no_fork_note(state) + _jobs_note(state),
             f"gradgate: alloc={state.settings['alloc']}: " + _ALLOC_NOTES[state.settings['alloc']]]
    if state.reference is not None:
        lines.append(f"gradgate: parity against the reference ggml from {state.reference.source.label} "
                     "(--gradgate-reference-src): analytic gradients only, no finite differences")
    b = state.baseline
    if b is not None and b.upstream:
        lines.append(f"gradgate: baseline: upstream {b.upstream}'s known failures ({b.path}, {len(b)} entries), which "
                     "this tree's version says it is built on: a failure they lack is the fork's own and fails")
    elif b is not None:
        line = f"gradgate: baseline {b.path} ({len(b)} known failures"
        if b.ggml_version:
            line += f", recorded on ggml {b.ggml_version}"
        line += "; rewritten at the end of this run)" if state.update_baseline else ")"
        lines.append(line)
    if state.baseline_note:
        lines.append(f"gradgate: {state.baseline_note}")
    return lines


_ALLOC_NOTES = {
    "all": "each backward also runs laid out by ggml's graph allocator, with each in-place alias forced, and "
           "trained by ggml-opt (--gradgate-alloc)",
    "ggml-opt": "each case is also trained by ggml-opt, two micro-batches accumulated (--gradgate-alloc)",
    "graph": "each backward also runs laid out by ggml's graph allocator (--gradgate-alloc)",
    "forced": "each backward also runs with each in-place alias forced (--gradgate-alloc)",
    "own": "each backward runs in memory of its own only; training's in-place aliases are not checked "
           "(--gradgate-alloc)",
}


def _jobs_note(state):
    if state.settings["isolate"] == "none":     # in this process, one at a time
        return ""
    jobs = state.jobs
    return f"; {jobs} case{'s' if jobs > 1 else ''} at once (--gradgate-jobs)"


def _no_fork_note(state):
    from pytest_gradgate.isolation.protocol import fork_available
    if state.settings["isolate"] not in ("case", "fresh") or fork_available():
        return ""
    return " (no fork here: each case runs in the worker process, which a crash replaces)"


def pytest_collect_file(file_path, parent):
    state = state_of(parent.config)
    if not state.enabled or file_path.suffix not in (".yaml", ".yml"):
        return None
    from pytest_gradgate.gate.items import CaseFile
    from pytest_gradgate.gate.selection import CASE_FILE_RE, builtin_nodeid, is_builtin, project_nodeid
    resolved = str(file_path.resolve())
    if is_builtin(file_path) and resolved in state.case_files:
        # outside the rootdir: a stable, readable node id (for -k, --lf, reports, pasting back).
        # Its parent is the session, not the folders pytest made on the way to the installed
        # package: their names (site-packages, lib, the venv's) would be keywords of every
        # built-in item, so `-k lib` or `-k "not venv"` picked by where pytest-gradgate is
        # installed, and every report carried them (under xdist, serialized three times an item)
        node = CaseFile.from_parent(parent.session, path=file_path, nodeid=builtin_nodeid(file_path))
        node.gradgate_builtin = True
        return node
    if CASE_FILE_RE.fullmatch(file_path.name) or resolved in state.case_files:
        # outside the rootdir (pytest run from elsewhere, as the reusable workflow does): an id
        # with its file part, the same as when pytest runs in the project (gate/selection.py)
        nodeid = project_nodeid(file_path, parent.config.rootpath)
        from pytest_gradgate.printable import has_control
        if has_control(str(file_path)):
            # a newline in a file's name would start a line of its own in every report: the
            # file is one error under an id that prints on one line (CaseFile.collect)
            if nodeid is None:
                nodeid = file_path.relative_to(parent.config.rootpath).as_posix()
            return CaseFile.from_parent(parent, path=file_path, nodeid=inline(nodeid))
        if nodeid is not None:
            return CaseFile.from_parent(parent, path=file_path, nodeid=nodeid)
        return CaseFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector):
    # `--lf` skips every file that its last failures' node ids do not point into. The ids of
    # the built-in files point into the rootdir (pytest_gradgate/cases.yaml), not to where
    # the package is installed, so --lf would skip them: collect them ourselves, as pytest
    # would (its LF wrapper and modifyitems still pick the failed items by node id)
    if getattr(collector, "gradgate_builtin", False):
        from _pytest.runner import pytest_make_collect_report as collect_as_pytest_does
        return collect_as_pytest_does(collector)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # the xdist controller's: deal the gate's items so that its long cases go to different
    # workers (gate/xdist_schedule.py); None leaves the choice to xdist
    state = config.stash.get(STATE, None)
    if state is None or not state.enabled:
        return None
    from pytest_gradgate.gate import xdist_schedule
    return xdist_schedule.make(config, log)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # an xdist worker knows only its next item: the one whose case it may start early (gate/ahead.py)
    if getattr(item, "gradgate_wants_next", False):
        item.gradgate_next = nextitem
    try:
        return (yield)
    finally:
        session = item.session
        if session.shouldfail or session.shouldstop:    # -x, --maxfail, the crash cap: no item runs after this
            state = item.config.stash.get(STATE, None)
            if state is not None:
                state.stop_ahead()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if item.get_closest_marker("gradgate") is not None:
        # a gradgate item (YAML, or a test that uses the fixture): ResultCollector counts its
        # outcome. Not report.keywords: a folder named gradgate would make every test in it one
        report.gradgate_item = True
    err = getattr(item, "gradgate_invalid_error", None)    # an InvalidCaseItem's (no import per test)
    if call.when == "setup" and err is not None:
        # rides on the report like results do, for the GitHub annotation on the bad line
        report.gradgate_invalid = {"path": str(err.path) if err.path else None, "line": err.line,
                                   "message": inline(err.args[0] if err.args else str(err))}
    if (call.when == "call" and report.skipped and isinstance(report.longrepr, tuple)
            and getattr(item, "gradgate_skips_at_declaration", False)):
        # the skip is the case's (no backward in this ggml, an op the backend lacks...): shown at
        # the case's file:line, as pytest shows a skip mark at its test, not at the line of
        # gate/items.py that raised it (all -rs said before, for every case)
        path, line, _ = item.reportinfo()
        report.longrepr = (str(path), line + 1, report.longrepr[2])
    result = getattr(item, "gradgate_result", None)
    if result is not None and call.when == "call":
        # rides on the report, so it reaches the controller under pytest-xdist
        data = result.to_dict()
        data["outcome"] = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        data["skip_reason"] = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        data["baseline"] = getattr(item, "gradgate_baseline", None)    # "known", "stale", "changed", "own" or None
        data["nodeid"] = item.nodeid
        # the fixture's run(): the test asserts on the result, its outcome is the test's own
        data["returned_to_test"] = getattr(item, "gradgate_result_returned", False)
        data["baseline_key"] = getattr(item, "gradgate_baseline_key", None)   # gate items only
        if data["baseline"] in ("stale", "changed"):
            data["message"] = getattr(item, "gradgate_baseline_text", data["message"])
        elif data["baseline"] == "own":
            # said before the failure's own line, which stays as it is (the JSON's message included)
            data["baseline_note"] = getattr(item, "gradgate_baseline_text", "")
        report.gradgate_result = data
        state = state_of(item.config)
        facts = state.build_facts
        if facts is not None and facts is not state.build_facts_sent:
            # once per process and whenever they change: under pytest-xdist every field of
            # every report is a string that execnet serializes, and the controller needs them once
            report.gradgate_build = facts
            state.build_facts_sent = facts
    return report


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    # how pytest-xdist sends a report to its controller: as one string, the result costs its
    # serializer one item instead of one per field and value (5% of the CPU that pytest's
    # three processes spend under -n 2)
    data = yield
    if isinstance(data, dict) and isinstance(data.get("gradgate_result"), dict):
        data["gradgate_result"] = json.dumps(data["gradgate_result"])
    return data


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config, data):
    if isinstance(data, dict) and isinstance(data.get("gradgate_result"), str):
        data["gradgate_result"] = json.loads(data["gradgate_result"])   # in place: the hook's own data
    return (yield)


class ResultCollector:
    """Collects the Results riding on reports (on the xdist controller too), and pytest's own
    outcome of every report of a gradgate item, so that the HTML report counts what pytest
    counts, items without a Result (an invalid case, a test that failed before its check) too."""

    def __init__(self, state, config):
        self.state = state
        self.config = config

    def pytest_runtest_logreport(self, report):
        if getattr(report, "gradgate_item", False):     # plugin.pytest_runtest_makereport
            # the category pytest's terminal summary counts the report under ("" for a passed setup)
            outcome = self.config.hook.pytest_report_teststatus(report=report, config=self.config)[0]
            if outcome:
                self.state.gate_reports.append({"nodeid": report.nodeid, "outcome": outcome,
                                                "message": "" if report.passed else _short_reason(report)})
        result = getattr(report, "gradgate_result", None)
        if result is not None:
            self.state.results.append(result)
        facts = getattr(report, "gradgate_build", None)
        if facts:       # each process's first report carries them (plugin: pytest_runtest_makereport)
            self.state.build_facts = facts
        invalid = getattr(report, "gradgate_invalid", None)
        if invalid is not None:
            self.state.invalid_cases.append(invalid)


def _short_reason(report):
    """One line of why a report did not pass: the exception's message, or a skip's reason."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):     # a skip: (path, line, reason)
        text = report.longrepr[2]
    else:
        text = str(report.longrepr or "")
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def pytest_sessionfinish(session, exitstatus):
    state = state_of(session.config)
    path = state.settings["html"]
    # under xdist only the controller writes: it has every worker's results
    if not path or hasattr(session.config, "workerinput") or not (state.enabled or state.gate_reports):
        return
    from pytest_gradgate.report import html
    meta = {"exit status": int(exitstatus)}
    facts = state.build_facts
    if facts is not None:
        meta["ggml"] = f"{facts['version']} from {facts['label']}"
        meta["library"] = facts["library"]
    try:
        target = Path(session.config.invocation_params.dir) / path
        state.html_report = str(html.write(target, state.results, meta, state.gate_reports))
    except OSError as exc:
        state.html_report = exc


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = state_of(config)
    if not (state.enabled or state.results):
        return
    from pytest_gradgate.report import outputs
    facts = state.build_facts
    if facts is not None:
        how = "cached" if facts["cached"] else f"built in {facts['build_seconds']} s"
        rebuilt = facts.get("rebuilt")
        if rebuilt:     # state.py _rebuild_unloadable
            how = ("rebuilt by another process" if facts["cached"] else f"rebuilt in {facts['build_seconds']} s") + \
                ", the cached one could not be loaded" + \
                (f"; set aside to {rebuilt['set_aside']}" if rebuilt.get("set_aside") else "")
        opts = facts.get("options") or {}
        terminalreporter.write_sep("-", "gradgate")
        terminalreporter.write_line(f"gradgate: ggml {facts['version'] or '? (the library cannot be loaded)'} "
                                    f"from {facts['label']}")
        sanitized = f" with -fsanitize={opts['sanitize']}" if opts.get("sanitize") else ""
        terminalreporter.write_line(f"gradgate: {opts.get('build_type')} build for "
                                    f"{', '.join(opts.get('backends') or ())}{sanitized} ({how}): {facts['library']}")
    if state.explore:
        from pytest_gradgate.gate import explore
        explore.summary(terminalreporter, state)
    failed = outputs.failed_results(state.results)     # incl. crashes, timeouts, stale baseline entries
    blind = [r for r in state.results if r["status"] == "passed" and r.get("power") is False]
    if failed:
        terminalreporter.write_sep("=", "gradgate failures")
        for r in failed:
            # the node id: two files may hold cases of the same name
            # on one line: under GitHub Actions a line of its own that starts with :: is a command
            line = " ".join(outputs.one_line(r).splitlines())
            terminalreporter.write_line(f"{r.get('nodeid') or r['case_id']}: {line}")
        if state.baseline is None and state.source is not None and state.source.pinned is None:
            # a fork's first run: its upstream bugs are all red until it records them, once
            from pytest_gradgate.gate.baseline import DEFAULT_FILE, first_run_text
            record = (f"pytest --gradgate --gradgate-ggml-src={state.source.label} --gradgate-update-baseline "
                      f"--gradgate-baseline={DEFAULT_FILE} (with this run's other options)")
            terminalreporter.write_line(f"gradgate: {first_run_text(state.source.label, record)}", yellow=True)
    if blind:
        terminalreporter.write_sep("-", "gradgate blind cases (a backward reading its incoming gradient from other positions would pass them)")
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
