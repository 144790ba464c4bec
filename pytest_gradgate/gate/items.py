"""The pytest nodes of the gate: a case file, one item per case, one item per declaration
that could not be loaded, and how a Result becomes pytest's outcome (baseline included).

Collection only reads YAML: the build starts in the setup of the first item that runs, so
`--collect-only`, or a `-k` that selects nothing, never runs CMake.
"""

import dataclasses

import pytest

from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.errors import GradgateError
from pytest_gradgate.gate.state import state_of


class GradgateFailure(Exception):
    """A case that did not pass; repr_failure shows its Result, not a traceback."""

    def __init__(self, result, text=None):
        super().__init__(result.message)
        self.result = result
        self.text = text


class CaseFile(pytest.File):
    def collect(self):
        from pytest_gradgate.declare.case import full_mode_problem, memory_problem
        from pytest_gradgate.declare.collection_memo import load_file_remembered
        from pytest_gradgate.errors import CaseError
        from pytest_gradgate.check import precision
        from pytest_gradgate.gate import parity
        from pytest_gradgate.gate.selection import is_builtin
        from pytest_gradgate.printable import has_control, inline
        if has_control(str(self.path)):
            name = "line1[invalid]"
            yield InvalidCaseItem.from_parent(self, name=name, nodeid=self._child_id(name), error=CaseError(
                "the case file's path holds a control character (a newline?) that would break every report "
                "that names it; rename it", inline(self.path), 1))
            return
        state = state_of(self.config)
        tf32 = precision.parse_backends(state.settings["tf32"])
        from pytest_gradgate.gate.declared_ops import hook_prototypes
        loaded, errors = load_file_remembered(self.path, state.backends, builtin=is_builtin(self.path),
                                              declared_ops=hook_prototypes(self.config))
        mode = state.settings["mode"]   # --gradgate-mode overrides every case's own mode
        loaded = _without_missing_ops(loaded, errors, state, self.path)
        for entry in loaded:
            if not entry.cases:   # its backends are none of this run's: say so, do not vanish
                name = f"{entry.name}[not-built]"
                yield NotBuiltItem.from_parent(self, name=name, nodeid=self._child_id(name), entry=entry,
                                               backends=state.backends)
                continue
            # (not an equivalence case's: it compares formulations, it has no finite differences to switch)
            cases = [dataclasses.replace(c, mode=mode) if mode and c.mode != mode and not c.equivalent else c
                     for c in entry.cases]
            alloc = state.settings["alloc"]     # --gradgate-alloc: the regimes every case runs in
            cases = [c if c.alloc == alloc else dataclasses.replace(c, alloc=alloc) for c in cases]
            # the precision of each backend's matmuls, for the limits of analytic comparisons
            cases = [c if c.matmul_precision == precision.matmul_precision(c.backend, tf32) else
                     dataclasses.replace(c, matmul_precision=precision.matmul_precision(c.backend, tf32))
                     for c in cases]
            # refused now, with its cost, not after minutes of silence (the mode as overridden)
            too_big = (full_mode_problem(cases[0]) or memory_problem(cases[0], state.settings["max_memory"])
                       if cases else None)
            if too_big:   # one error for the declaration, not one per variant
                how = ", with --gradgate-mode full" if entry.cases[0].mode != cases[0].mode else ""
                errors.append(CaseError(f"case '{entry.name}'{how}: {too_big}", self.path, entry.line))
                continue
            for case in cases:
                if not state.reference:     # with a reference tree, the parity items are the run
                    name = f"{case.name}[{case.variant}]"
                    yield CaseItem.from_parent(self, name=name, nodeid=self._child_id(name), case=case)
                for against, of in parity.parity_cases(case, state.settings["reference_src"]):
                    name = f"{case.name}[{case.variant}-{against}]"
                    yield ParityItem.from_parent(self, name=name, nodeid=self._child_id(name), case=of,
                                                 against=against)
        on_line = {}
        for err in errors:      # one item per error; several on one line (a `vary` entry) get numbers
            err.line = err.line or 1    # a file-wide error (YAML too deep): at the file's first line
            n = on_line[err.line] = on_line.get(err.line, 0) + 1
            suffix = "" if n == 1 else f"-{n}"
            name = f"line{err.line or 0}[invalid{suffix}]"
            yield InvalidCaseItem.from_parent(self, name=name, nodeid=self._child_id(name), error=err)

    def _child_id(self, name):
        # given as the string pytest has always made, which pytest 9.2 parses into its structured
        # id (path, names, [params]); left to itself it makes the id of a name holding "[...]"
        # without params, which never equals the id parsed back from the cache, so --lf, --ff,
        # --nf and --sw matched no item there (tests/test_selection.py)
        return f"{self.nodeid}::{name}"


def _without_missing_ops(loaded, errors, state, path):
    """The loaded cases less those calling a declared op whose function the tree's headers lack:
    one error for each such op, at its line in the file, naming the cases it kept from running.
    (Where the tree is not on disk yet, the default before its first fetch, the worker finds a
    missing function instead, in the cases that call it.)"""
    from pytest_gradgate.errors import CaseError
    from pytest_gradgate.ops.declared import header_text, missing_from_headers
    ops = {name: text for entry in loaded for case in entry.cases for name, text in case.ops.items()}
    root = state.source.root_if_present() if ops and state.source is not None else None
    if root is None:
        return loaded
    missing = missing_from_headers(ops, header_text(root))
    if not missing:
        return loaded
    kept, held = [], {name: [] for name in missing}
    for entry in loaded:
        calls = {name for case in entry.cases for name in case.ops if name in missing}
        for name in calls:
            held[name].append(entry.name)
        if not calls:
            kept.append(entry)
    for name, symbol in missing.items():
        lines = next((c.origin.get("op_lines", {}) for e in loaded for c in e.cases if name in c.ops), {})
        errors.append(CaseError(f"op '{name}': {symbol} is not declared in the headers of the ggml tree under test "
                                f"({root}/include): check the function's name, or point --gradgate-ggml-src at "
                                f"the tree that has it (cases not run because of it: {', '.join(held[name])})",
                                path, lines.get(name, next(e.line for e in loaded if e.name == held[name][0]))))
    return kept


class CaseItem(pytest.Item):
    # plugin.pytest_runtest_protocol sets gradgate_next: under xdist, the one item known to come next
    gradgate_wants_next = True
    # plugin.pytest_runtest_makereport: a skip it decides is reported at the case's declaration
    gradgate_skips_at_declaration = True

    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.gradgate_next = None
        self.add_marker("gradgate")

    def setup(self):
        # the build (and the default source's fetch) happen here, for the first item that runs
        _start_runners(self)

    def runtest(self):
        state = state_of(self.config)
        result = state.run(self.case, key=self.nodeid, upcoming=_upcoming(self, state))
        if self.case.ops:
            _name_the_asserts_function(result, state)
        self.gradgate_result = result
        _track_start_failures(state, result, self.session)
        _decide(self, result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, pytest.xfail.Exception):
            return str(excinfo.value)   # a known failure: its reason says it all, no traceback to format
        if isinstance(excinfo.value, GradgateFailure):
            from pytest_gradgate.report.text import format_result
            return excinfo.value.text or format_result(excinfo.value.result)
        if isinstance(excinfo.value, GradgateError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.case.origin.get("line", 1) - 1, self.case.id


def _name_the_asserts_function(result, state):
    """A declared op's abort names ggml's file and line; add the ggml function that holds it, read
    from the tree under test (a fork's op calls several of ggml's: which one refused?)."""
    from pytest_gradgate.library.source_site import abort_site, enclosing_function
    if result.kind != Diagnosis.GGML_ABORT or not result.diagnosis:
        return
    site = abort_site(result.diagnosis)
    root = state.source.root_if_present() if state.source is not None else None
    function = enclosing_function(root, *site) if site and root else None
    if function:
        result.diagnosis += f" (in ggml's {function}, {site[0]}:{site[1]} of the tree under test)"


class ParityItem(CaseItem):
    """A case's analytic gradients on two sides, compared (gate/parity.py): the tree under test
    against --gradgate-reference-src's, or a CUDA case against the CPU."""

    gradgate_wants_next = False     # its sides are not the case's own check: nothing to start ahead

    def __init__(self, *, against, **kwargs):
        super().__init__(**kwargs)
        self.against = against

    def setup(self):
        from pytest_gradgate.gate import parity
        _start_runners(self, reference=self.against == parity.VS_REFERENCE)

    def runtest(self):
        from pytest_gradgate.gate import parity
        state = state_of(self.config)
        result = parity.run(state, self.case, self.against)
        self.gradgate_result = result
        _decide(self, result)

    def reportinfo(self):
        return self.path, self.case.origin.get("line", 1) - 1, f"{self.case.id} {self.against}"


class InvalidCaseItem(pytest.Item):
    """A case that could not be loaded: one error at its file:line; the others still run."""

    def __init__(self, *, error, **kwargs):
        super().__init__(**kwargs)
        self.error = error
        self.add_marker("gradgate")      # a gradgate item: -m gradgate, and the reports' counts

    @property
    def gradgate_invalid_error(self):
        return self.error

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


class NotBuiltItem(pytest.Item):
    """A case for backends this run does not build (a cuda-only case on a CPU run): a skip,
    reported where it is declared, that says how to run it."""

    gradgate_skips_at_declaration = True

    def __init__(self, *, entry, backends, **kwargs):
        super().__init__(**kwargs)
        self.entry, self.backends = entry, backends
        self.add_marker("gradgate")

    def runtest(self):
        # (reported at the case's file:line: plugin.pytest_runtest_makereport)
        pytest.skip(f"case '{self.entry.name}' is for other backends than this run's ({', '.join(self.backends)}); "
                    "run it with --gradgate-backend cuda or all")

    def reportinfo(self):
        return self.path, self.entry.line - 1, f"{self.entry.name} (not built)"


def _upcoming(item, state):
    """(key, case) of the gate items pytest will run after `item`, as far as this process
    knows: the next 2 x jobs of session.items, or under xdist the one item it was given next.
    Items that a skip marker will skip are left out."""
    if hasattr(item.config, "workerinput"):
        following = [item.gradgate_next] if item.gradgate_next is not None else []
    else:
        session = item.session
        index = getattr(session, "gradgate_index", None)
        if index is None or len(index) != len(session.items):
            index = session.gradgate_index = {id(it): i for i, it in enumerate(session.items)}
        at = index.get(id(item))
        following = session.items[at + 1:at + 1 + 2 * state.jobs] if at is not None else []
    return [(it.nodeid, it.case) for it in following if isinstance(it, CaseItem) and not isinstance(it, ParityItem)
            and it.get_closest_marker("skip") is None and it.get_closest_marker("skipif") is None]


def _track_start_failures(state, result, session):
    """The crash cap: cases that die before ggml is even reached point at the build, not at
    the cases; stop with one message instead of N identical failures."""
    if result.phase != Phase.STARTUP or result.status not in (Status.ERROR, Status.CRASHED):
        state.start_failures_in_a_row = 0
        return
    state.start_failures_in_a_row += 1
    broken = result.kind == Diagnosis.BROKEN_BUILD  # the library cannot load: no later case can run
    if broken or state.start_failures_in_a_row >= state.settings["crash_cap"]:
        why = ("the library cannot be loaded" if broken else
               f"{state.start_failures_in_a_row} cases in a row died before reaching ggml (--gradgate-crash-cap)")
        where = f" (remove {state.build.path} so that it is rebuilt)" if state.build is not None else ""
        session.shouldstop = f"gradgate: stopped early: {why}; the build looks broken{where}: {result.message}"


def _decide(item, result):
    """Turn a Result into pytest's outcome; the baseline turns known failures into xfails."""
    from pytest_gradgate.gate import baseline as baseline_file
    if result.stderr_tail:
        item.add_report_section("call", "ggml stderr", result.stderr_tail)
    if result.status == Status.SKIPPED:
        pytest.skip(result.message)
    if result.status == Status.INCONCLUSIVE:
        pytest.skip(f"inconclusive: {result.diagnosis}")
    if result.status == Status.NUMERIC_UNRELIABLE:
        # nothing was verified, either way: neither a pass nor a failure of the backward
        pytest.skip(result.diagnosis)     # "<param>: numeric gradient unreliable at ...: use ..."
    state = state_of(item.config)
    baseline = state.baseline
    item.gradgate_baseline_key = baseline_file.key_of(item)
    recorded = baseline.get(item.gradgate_baseline_key) if baseline is not None else None
    known = baseline.known(item.gradgate_baseline_key) if baseline is not None else None
    if result.status == Status.PASSED:
        if result.power is False:
            item.warn(pytest.PytestWarning(f"gradgate: {item.case.id} is blind: {result.diagnosis}"))
        if result.rerun:
            item.warn(pytest.PytestWarning(
                f"gradgate: {item.case.id} did not pass in a child that had run earlier cases, and passed in a "
                "fresh one: its outcome depends on what ran before it in the process (state that leaks from "
                "case to case in ggml, or a flaky check); --gradgate-isolate fresh runs every case in a fresh child"))
        if recorded and baseline.upstream:
            # upstream's failure, fixed in this fork: good news, and not the fork's file to shrink
            item.warn(pytest.PytestWarning(f"gradgate: {item.case.id} passes here; upstream {baseline.upstream} "
                                           "records it as a known failure"))
            return
        if known and known.get("phase") in (str(Phase.ALLOCATION), str(Phase.GGML_OPT)) and item.case.alloc != "all":
            # recorded in an allocation regime this run did not select: not seen, so neither fixed nor known
            pytest.skip(f"not checked: the baseline records a failure in an allocation regime that "
                        f"--gradgate-alloc {item.case.alloc} leaves out ({known['status']}: {known.get('reason') or '-'})")
        if known and not state.update_baseline:
            # like a strict xfail: a fixed case must leave the baseline, or it could regress unseen
            item.gradgate_baseline = "stale"
            item.gradgate_baseline_text = baseline_file.stale_text(item.gradgate_baseline_key, known, baseline.path)
            raise GradgateFailure(result, text=item.gradgate_baseline_text)
        return
    if item.case.builtin and result.no_backward:
        pytest.skip(f"{result.diagnosis} ({result.message})")
    if item.case.builtin and result.status in (Status.CONSUMER_FAILED, Status.PRODUCER_FAILED):
        # the built-in suite checks ops; a consumer this ggml cannot run says nothing about the op
        # (the consumer's ops have their own cases, e.g. view_offset_gap through transpose)
        pytest.skip(result.diagnosis)
    if state.update_baseline:
        item.gradgate_baseline = "known"
        pytest.xfail(f"recorded in the new baseline {baseline.path}: {baseline_file.reason_of(result)}")
    if known:
        changed = baseline_file.changed_kind(item.gradgate_baseline_key, known, result, baseline.path)
        if changed:
            item.gradgate_baseline = "changed"
            item.gradgate_baseline_text = changed
            raise GradgateFailure(result, text=changed)
        item.gradgate_baseline = "known"
        pytest.xfail(baseline_file.xfail_reason(known, result))
    own = baseline_file.own_text(recorded, baseline) if baseline is not None else None
    if own:
        from pytest_gradgate.report.text import format_result
        item.gradgate_baseline = "own"
        item.gradgate_baseline_text = own
        raise GradgateFailure(result, text=f"{own}\n{format_result(result)}")
    raise GradgateFailure(result)


def _start_runners(item, reference=False):
    """Build (or find) the library the item's case runs on, and the reference tree's too; a
    build that fails is the item's failure and stops the session."""
    state = state_of(item.config)
    try:
        state.runner()
        if reference:
            state.reference.ensure_runner()
        return
    except GradgateError as exc:
        failure = f"gradgate: {exc}"
    # outside the except block: the report shows the message, not "during handling of..."
    item.session.shouldfail = "gradgate: the ggml build failed (see the first error above)"
    pytest.fail(failure, pytrace=False)
