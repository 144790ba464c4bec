"""Per-session state of the gate: its settings, the ggml source, the build (made when the
first case is about to run, never at collection), the runner and the results seen so far.

Cheap to create: nothing here imports numpy, cffi, yaml or the engine until a case runs.
"""

import functools
from pathlib import Path

import pytest

from pytest_gradgate.errors import GradgateError
from pytest_gradgate.gate import settings

STATE = pytest.StashKey()
# each job is a worker process with its own copy of the library (and, for CUDA cases, which
# run in the worker, its own CUDA context): a big machine's default stays bounded
DEFAULT_MAX_JOBS = 8


def state_of(config):
    return config.stash[STATE]


class GateState:
    def __init__(self, config):
        self.config = config
        self.case_files = set()
        self.settings = settings.effective(config)
        # --gradgate-explore=60s is a gate run too, whose items are the search's findings
        self.explore = bool(self.settings["explore"])
        self.enabled = config.getoption("gradgate") or self.explore
        backend = self.settings["backend"]
        self.backends = ("cpu", "cuda") if backend == "all" else (backend,)
        self.source = None
        self.build = None
        self.reference = None           # gate/parity.py: the reference tree's source, build and runner
        self.build_error = None         # a GradgateError from the build: every later case reports it
        self.build_facts = None         # what the reports say of the build (ours, or an xdist worker's)
        self.build_facts_sent = None    # the facts a report of this process last carried (plugin.py)
        self._runner = None
        self._early_thread = None       # start_early: the first worker, started while pytest collects
        self._early = None              # ... and what it made: (build, runner, ggml version)
        self._early_ready = None        # set once it is done
        self._early_release = None      # set at close: its thread may end (its worker is closed)
        self._ahead = None              # gate/ahead.py: the coming items' cases, run in the background
        self._extra_runners = []        # the Ahead's runners beyond the first (self._runner)
        self.results = []
        # pytest's outcome of each report of a gradgate item (plugin.py ResultCollector): what
        # the HTML report counts, so that its counts are pytest's own
        self.gate_reports = []
        self.invalid_cases = []         # declarations that could not be loaded: path, line, message
        self.start_failures_in_a_row = 0
        self.baseline = None            # known failures (baseline.Baseline), see load_baseline
        self.baseline_note = None       # why --gradgate-update-baseline did not keep the old entries
        self.upstream = None            # a fork's upstream's shipped baseline (load_baseline)
        self.update_baseline = config.getoption("gradgate_update_baseline")

    # -- source and build ----------------------------------------------------------------
    def choose_source(self):
        """The source the options name (a bad path is an error now); nothing is fetched."""
        if self.source is None:
            from pytest_gradgate.library.source import resolve_source
            self.source = resolve_source(self.config.getoption("gradgate_ggml_src"),
                                         self.config.getini("gradgate_ggml_src"))
        return self.source

    def build_options(self):
        from pytest_gradgate.library.options import BuildOptions, build_backends
        return BuildOptions(build_type=self.settings["build_type"], backends=build_backends(self.backends),
                            cuda_arch=self.settings["cuda_arch"], sanitize=self.settings["sanitize"] or "")

    def ensure_build(self):
        """The build, made on first call; a failure is kept and raised again for every caller."""
        if self.build_error is not None:
            raise self.build_error
        if self.build is None:
            from pytest_gradgate.library.cmake import ensure_build
            try:
                source = self.choose_source()
                self.build = ensure_build(source.root, self.build_options(), progress=self._progress())
            except GradgateError as exc:
                self.build_error = exc
                raise
            except OSError as exc:   # the source's cache (a fetch of the default) cannot be written
                from pytest_gradgate.library.cmake import cache_write_error
                self.build_error = cache_write_error(exc)
                raise self.build_error from None
        return self.build

    def runner(self):
        if self._runner is None:
            self._take_early_start()
            if self._runner is None:
                build = self.ensure_build()
                self._runner = self._new_runner()
                self.build_facts = self._facts(build, self._runner.ggml_version())
            if self._runner.library_unloadable and self.build.cached:
                self._rebuild_unloadable()
        return self._runner

    def _rebuild_unloadable(self):
        """The cached build's library cannot be loaded (a full disk or a killed copy left it
        half written): move it aside and build it again, once, saying so in one line. If the
        fresh one cannot be loaded either, the first case reports it and the run stops there
        (gate/items.py), as it did before this second chance."""
        from pytest_gradgate.library.cmake import cache_write_error, set_aside
        broken, why = self.build, self._runner.start_error
        self._runner.close()
        try:
            aside = set_aside(broken)
        except OSError as exc:
            self.build_error = cache_write_error(exc)
            raise self.build_error from None
        where = f"moved it to {aside}" if aside is not None else "another process has set it aside"
        self._say(f"gradgate: the cached build {broken.path} cannot be loaded ({why}); {where}, "
                  "building it again")
        self.build = None
        self.ensure_build()
        self._runner = self._new_runner()
        self.build_facts = self._facts(self.build, self._runner.ggml_version())
        # plain data, so that it rides to the summary under xdist too: where the broken one went
        self.build_facts["rebuilt"] = {"set_aside": str(aside) if aside is not None else None}

    def start_early(self):
        """Start the first worker in the background while pytest collects, when the build is
        in the cache already: a worker takes a few tenths of a second to start (numpy, cffi,
        the library), which the first case waited for after collection. Nothing is fetched
        or built here; without a cached build (or on any error) the first item's setup does
        it all, as before. The thread parses no Python (see gate/ahead.py): what it calls is
        imported now."""
        import threading
        from pytest_gradgate.library import cmake
        from pytest_gradgate.isolation import parent  # noqa: F401  (imported here, not in the thread)
        if "cuda" in self.backends:
            import ctypes.util  # noqa: F401  (the CUDA toolkit's part of the build's key)
            import importlib.util  # noqa: F401
        options = self.build_options()

        ready = self._early_ready = threading.Event()
        self._early_release = threading.Event()

        def start():
            try:
                root = self.source.root_if_present()
                build = cmake.find_build(root, options) if root is not None else None
                if build is not None:
                    runner = self._new_runner(build.library)
                    self._early = (build, runner, runner.ggml_version())
            except Exception:   # noqa: BLE001  the setup's own attempt reports what is wrong
                self._early = None
            finally:
                ready.set()
            # the worker dies with the thread that started it (PR_SET_PDEATHSIG is the thread's,
            # not the process's): this one lives until the session closes
            self._early_release.wait()
        self._early = None
        self._early_thread = threading.Thread(target=start, name="gradgate-early-start", daemon=True)
        self._early_thread.start()

    def _take_early_start(self):
        """What start_early made, once it is done (build, runner, facts); nothing if it found no build."""
        if self._early_thread is None:
            return
        self._early_ready.wait()
        if self._early is not None:
            self.build, self._runner, version = self._early
            self._early = None
            self.build_facts = self._facts(self.build, version)

    def _new_runner(self, library=None):
        from pytest_gradgate.isolation.parent import Runner
        return Runner(library or self.build.library, isolate=self.settings["isolate"], max_memory=self.settings["max_memory"],
                      backtrace=self.settings["backtrace"], timeout=self.settings["timeout"] or None)

    @functools.cached_property
    def jobs(self):
        """Cases run at once by this pytest process: --gradgate-jobs, else one per CPU it may
        use, at most DEFAULT_MAX_JOBS; one in an xdist worker (-n already runs a process per CPU)."""
        if self.settings["jobs"]:
            return self.settings["jobs"]
        if hasattr(self.config, "workerinput"):
            return 1
        import os
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:   # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(cpus, DEFAULT_MAX_JOBS))

    def run(self, case, key=None, upcoming=()):
        """The Result of `case`; `upcoming`: (key, case) of the items pytest runs next, started
        now in the background (gate/ahead.py). key=None: a case no item will ask for again
        (the gradgate fixture's), run before anything queued."""
        runner = self.runner()
        if self.settings["isolate"] == "none":   # in this process: one at a time, no threads
            return runner.run(case)
        if self._ahead is None:
            from pytest_gradgate.gate.ahead import Ahead
            self._extra_runners = [self._new_runner() for _ in range(self.jobs - 1)]
            self._ahead = Ahead([runner, *self._extra_runners], expected_red=self._known_failure)
        if key is not None:
            self._ahead.submit(key, case)     # before the items after it
        for next_key, next_case in upcoming:
            self._ahead.submit(next_key, next_case)
        return self._ahead.result(key if key is not None else object(), case)

    def _known_failure(self, key):
        """Is the item `key` in the baseline (gate/baseline.py keys are node ids)?"""
        return self.baseline is not None and self.baseline.get(key) is not None

    def _facts(self, build, version):
        """What the reports say of the build: plain data, so it rides on reports under xdist."""
        info = build.info
        return {"label": self.source.label, "origin": self.source.origin, "root": str(self.source.root),
                "version": version, "library": str(build.library), "cached": build.cached,
                "build_seconds": info.get("build_seconds"), "options": info.get("options"),
                "compiler": info.get("compiler"), "built_version": info.get("ggml_version")}

    def _say(self, line):
        """One line in the terminal now, past pytest's capture (the build runs in an item's
        setup); nothing in an xdist worker, whose facts carry it to the summary instead."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if capture is None:
            tr.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            tr.ensure_newline()
            tr.write_line(line)

    def _progress(self):
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return None
        # the build runs in the first item's setup, where pytest captures output
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        last = {"text": None, "label": None, "quarter": -1}

        def show(text):
            if capture is None:
                return write(text)
            with capture.global_and_fixture_disabled():
                write(text)

        def write(text):
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

    # -- baseline ------------------------------------------------------------------------
    def load_baseline(self):
        """The baseline given, else the shipped one when the source is a pinned one."""
        from pytest_gradgate.gate import baseline as baseline_file
        path = self.settings["baseline"]
        source = self.choose_source()
        pinned = source.pinned
        if path is None and pinned is not None and not (self.update_baseline and source.by_content):
            path = baseline_file.shipped_baseline(pinned)
        # a fork (a tree that is not pinned) of a version whose upstream baseline is shipped starts
        # from upstream's known failures: what they lack is the fork's own, red until accepted
        upstream = baseline_file.upstream_baseline(source)
        if upstream is not None:
            self.upstream = upstream
            if path is None and not self.update_baseline:
                self.baseline = self.upstream
                return self.baseline
        if self.update_baseline and path is None:
            raise GradgateError("--gradgate-update-baseline: name the file to write with --gradgate-baseline FILE "
                                "(or ini gradgate_baseline / env GRADGATE_BASELINE)")
        if path is None:
            return None
        if self.update_baseline and not Path(path).exists():
            self.baseline = baseline_file.Baseline(path)
        elif self.update_baseline:
            try:
                self.baseline = baseline_file.Baseline.load(path)
            except baseline_file.BaselineError as exc:
                # the user asked for it to be rewritten: an unreadable one is replaced, not an error
                self.baseline = baseline_file.Baseline(path)
                self.baseline_note = f"{exc}; it is rewritten from this run's results alone"
        else:
            self.baseline = baseline_file.Baseline.load(path)
        return self.baseline

    def stop_ahead(self):
        """The run stops early: the cases started ahead are of items that will not run."""
        if self._ahead is not None:
            self._ahead.close()

    def close(self):
        self._take_early_start()   # a run with no case to run still closes the worker it started
        if self._ahead is not None:
            self._ahead.close()
        for runner in self._extra_runners:
            runner.close()
        if self.reference is not None:
            self.reference.close()
        if self._runner:
            self._runner.close()
        if self._early_thread is not None:    # its worker is closed: it may end now
            self._early_release.set()
            self._early_thread.join(timeout=10)
            self._early_thread = None
