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
`run_equivalent` only return the result. All take the keys of a YAML case (inputs=, init=, loss=, eps=, max_maa=, ...), with `consumer`,
`producer` and `backend` in the singular: one call is one case. A case declared here is a user's case:
an op without a backward in the ggml under test fails it (the built-in suite skips instead).

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


class Checker:
    def __init__(self, request):
        self._request = request
        self._count = 0

    def _case(self, graph, params, name=None, consumer="none", producer="none", backend=None, **fields):
        from pytest_gradgate.declare.loader import build_cases   # yaml and the op table: only when used
        from pytest_gradgate.gate.state import state_of
        state = state_of(self._request.config)
        node = self._request.node
        self._count += 1
        if name is None:
            # test ids may hold spaces or brackets; case names may not
            name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", node.name).strip("_") + f"-{self._count}"
        raw = {"name": name, "params": params, "consumers": [consumer], "producers": [producer], **fields}
        if graph is not None:
            raw["graph"] = graph
        if backend is not None:
            raw["backends"] = [backend]
        try:
            cases = build_cases(raw, path=str(node.path), line=_caller_line(node.reportinfo()[1] + 1),
                                session_backends=state.backends)
        except CaseError as exc:
            pytest.fail(f"invalid gradgate check: {exc}", pytrace=False)
        if not cases:
            pytest.fail(f"invalid gradgate check: backend {backend!r} is not built in this session "
                        f"(--gradgate-backend gives {', '.join(state.backends)})", pytrace=False)
        from pytest_gradgate.declare.case import full_mode_problem
        too_big = full_mode_problem(cases[0])
        if too_big:
            pytest.fail(f"invalid gradgate check: {too_big}", pytrace=False)
        return state, cases[0]

    def run(self, graph, params, **fields):
        """Run one check in isolation and return its CheckResult (never fails the test)."""
        return self._run(self._case(graph, params, **fields))

    def run_equivalent(self, formulations, params, **fields):
        """Run an equivalence case (formulation name -> graph, two or more) in isolation and
        return its CheckResult (never fails the test)."""
        return self._run(self._case(None, params, equivalent=formulations, **fields))

    def _run(self, prepared):
        state, case = prepared
        try:
            state.runner()   # builds ggml on first use when --gradgate did not
        except GradgateError as exc:
            pytest.fail(f"gradgate: {exc}", pytrace=False)
        result = state.run(case)
        node = self._request.node
        # the plugin puts item.gradgate_result on the report (JSON/HTML outputs, summary);
        # with several checks in one test, the first that did not pass is the one to show
        shown = getattr(node, "gradgate_result", None)
        if shown is None or shown.status == "passed":
            node.gradgate_result = result
        return CheckResult(result)

    def check(self, graph, params, **fields):
        """Like run(), but a check that does not pass fails the test with its report."""
        return self._require(self.run(graph, params, **fields))

    def check_equivalent(self, formulations, params, **fields):
        """Like run_equivalent(), but formulations that disagree fail the test with the report."""
        return self._require(self.run_equivalent(formulations, params, **fields))

    @staticmethod
    def _require(res):
        if res.status == "skipped":     # e.g. the backend does not support an op
            pytest.skip(res.message)
        if not res.ok:
            pytest.fail(res.report(), pytrace=False)
        return res


@pytest.fixture
def gradgate(request):
    """Declare and run gradient checks from Python; see pytest_gradgate.fixtures."""
    return Checker(request)
