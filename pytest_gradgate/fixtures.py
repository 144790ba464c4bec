"""The `gradgate` fixture: declare a check in Python, run it isolated like a YAML case.

    def test_concat(gradgate):
        gradgate.check("concat(a, b, dim=1)", params={"a": [4, 3, 5, 1], "b": [4, 2, 5, 1]},
                       consumer="permute_0213_transpose")

Two formulations of one computation, compared with each other (an equivalence case, no
finite differences; pytest_gradgate/check/equivalence.py):

    def test_chunked_attention(gradgate):
        gradgate.check_equivalent({"chunked": [...lines...], "whole": [...lines...]},
                                  params={"q": [128, 12, 256], ...}, consumer="transpose")

`check` and `check_equivalent` fail the test when the case does not pass; `run` and
`run_equivalent` only return the result. All take the keys of a YAML case, with the same meaning
(inputs=, init=, loss=, eps=, max_maa=, consumers=, producers=, vary=, ...; docs/fixtures.md), and
`consumer`, `producer` and `backend` in the singular; with neither, one layout (consumer and producer
`none`). A call that declares several cases runs and checks every one of them. A case declared here
is a user's case: an op without a backward in the ggml under test fails it (the built-in suite skips).

Importing this module is cheap (the plugin imports it on every pytest run): the loader, the
build and the runner are imported when a test first uses the fixture.
"""

import re
import sys
from pathlib import Path

import pytest

from pytest_gradgate.errors import CaseError, GradgateError

_HERE = str(Path(__file__).resolve())


class CheckResult:
    """A Result with `.ok` and a readable `.report()`; other attributes (status, maa, cosine,
    power, diagnosis, params, ...) pass through to the Result."""

    def __init__(self, result):
        self.result = result

    def __getattr__(self, name):
        return getattr(self.result, name)

    @property
    def ok(self):
        return self.result.status == "passed"

    def report(self):
        from pytest_gradgate.report.text import format_result
        return format_result(self.result)

    def __str__(self):
        return self.report()

    def __repr__(self):
        return f"<CheckResult {self.result.case_id} {self.result.status} maa={self.result.maa}>"


def _caller_line(default):
    """The line of the test code that called check()/run(), for reports and `declared at`."""
    frame = sys._getframe(1)
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()) == _HERE:
        frame = frame.f_back
    return frame.f_lineno if frame is not None else default


# the fixture's singular keys (one call, one layout) and the YAML keys they stand for
SINGULAR = {"consumer": "consumers", "producer": "producers", "backend": "backends"}


class CheckResults(list):
    """The CheckResults of a call that declared several cases (`consumers=[...]`,
    `producers=[...]`, a list of losses, `vary=`), in the order the YAML loader makes them.
    `.ok` is true when every one passed; `.report()` joins their reports."""

    @property
    def ok(self):
        return all(r.ok for r in self)

    def report(self):
        return "\n".join(r.report() for r in self)

    def __str__(self):
        return self.report()


class Checker:
    def __init__(self, request):
        self._request = request
        self._count = 0

    def _cases(self, graph, params, name=None, **fields):
        """The Cases one call declares: the keys of a YAML case, with `consumer`, `producer` and
        `backend` accepted in the singular too. Every case the call stands for is returned (and
        run): a consumer list is checked through each consumer, never through its first alone."""
        from pytest_gradgate.declare import vary   # yaml and the op table: only when used
        from pytest_gradgate.declare.case import full_mode_problem, memory_problem
        from pytest_gradgate.declare.loader import build_cases
        from pytest_gradgate.gate.state import state_of
        state = state_of(self._request.config)
        node = self._request.node
        self._count += 1
        line = _caller_line(node.reportinfo()[1] + 1)
        where = f"{node.path}:{line}"
        problem = None
        for one, many in SINGULAR.items():
            if one in fields and many in fields:
                problem = (f"{where}: {one}= and {many}= both given; give one {one}, or the list "
                           f"{many}=[...]")
                break
        if problem:
            pytest.fail(f"invalid gradgate check: {problem}", pytrace=False)
        if name is None:
            # test ids may hold spaces or brackets; case names may not
            name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", node.name).strip("_") + f"-{self._count}"
        raw = {"name": name, "params": params}
        for one, many in SINGULAR.items():
            if one in fields:
                raw[many] = [fields.pop(one)]
        # without a consumer named, one layout: contiguous in and out (YAML's default is four)
        raw.setdefault("consumers", ["none"])
        raw.update(fields)
        if graph is not None:
            raw["graph"] = graph
        cases, problem = [], None
        try:
            for variant in vary.expand(raw, (str(node.path), line)):
                cases += build_cases(variant, path=str(node.path), line=line, session_backends=state.backends)
        except CaseError as exc:
            problem = str(exc)
        # outside the except block: the report shows the message once, not "During handling..."
        if problem is None and not cases:
            wanted = raw.get("backends")
            problem = (f"{where}: backend {', '.join(map(str, wanted or ()))} is not built in this session "
                       f"(--gradgate-backend gives {', '.join(state.backends)})")
        if problem is None:
            problem = next((f"{where}: {why}" for c in cases
                            for why in (full_mode_problem(c), memory_problem(c, state.settings["max_memory"]))
                            if why), None)
        if problem:
            pytest.fail(f"invalid gradgate check: {problem}", pytrace=False)
        return state, cases

    def run(self, graph, params, **fields):
        """Run the check in isolation and return its CheckResult (never fails the test); a call
        that declares several cases (a list of consumers, producers or losses, `vary`) runs
        every one and returns their CheckResults."""
        return self._run(*self._cases(graph, params, **fields), returned=True)

    def run_equivalent(self, formulations, params, **fields):
        """Run an equivalence case (formulation name -> graph, two or more) in isolation and
        return its CheckResult (never fails the test)."""
        return self._run(*self._cases(None, params, equivalent=formulations, **fields), returned=True)

    def _run(self, state, cases, returned):
        """returned: the results go back to the test to assert on (run(), run_equivalent()), so
        the test's outcome is its own assertions', not the results' (the reports say so)."""
        problem = None
        try:
            state.runner()   # builds ggml on first use when --gradgate did not
        except GradgateError as exc:
            problem = f"gradgate: {exc}"
        if problem:
            pytest.fail(problem, pytrace=False)
        node = self._request.node
        results = CheckResults()
        for case in cases:
            result = state.run(case)
            # the plugin puts item.gradgate_result on the report (JSON/HTML outputs, summary);
            # with several checks in one test, the first that did not pass is the one to show
            shown = getattr(node, "gradgate_result", None)
            if shown is None or shown.status == "passed":
                node.gradgate_result = result
                node.gradgate_result_returned = returned
            results.append(CheckResult(result))
        return results[0] if len(results) == 1 else results

    def check(self, graph, params, **fields):
        """Like run(), but a case that does not pass fails the test with its report."""
        return self._require(self._run(*self._cases(graph, params, **fields), returned=False))

    def check_equivalent(self, formulations, params, **fields):
        """Like run_equivalent(), but formulations that disagree fail the test with the report."""
        return self._require(self._run(*self._cases(None, params, equivalent=formulations, **fields),
                                       returned=False))

    @staticmethod
    def _require(res):
        every = res if isinstance(res, CheckResults) else [res]
        bad = [r for r in every if not r.ok and r.status != "skipped"]
        if bad:     # every case that did not pass, not the first alone
            pytest.fail("\n".join(r.report() for r in bad), pytrace=False)
        skipped = [r for r in every if r.status == "skipped"]
        if skipped:     # e.g. the backend does not support an op: not verified, so not a pass
            pytest.skip("; ".join(f"{r.case_id}: {r.message}" if len(every) > 1 else r.message for r in skipped))
        return res


@pytest.fixture
def gradgate(request):
    """Declare and run gradient checks from Python; see pytest_gradgate.fixtures."""
    return Checker(request)
