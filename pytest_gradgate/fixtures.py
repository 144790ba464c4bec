"""The `gradgate` fixture: declare a check in Python, run it isolated like a YAML case.

    def test_concat(gradgate):
        gradgate.check("concat(a, b, dim=1)", params={"a": [4, 3, 5, 1], "b": [4, 2, 5, 1]},
                       consumer="permute_0213_transpose")

`check` fails the test when the case does not pass; `run` only returns the result.
"""

import pytest

from .errors import CaseError
from .loader import build_cases
from .report_text import format_result


class CheckResult:
    """A Result with `.ok` and a readable `.report()`; other attributes pass through."""

    def __init__(self, result):
        self.result = result

    def __getattr__(self, name):
        return getattr(self.result, name)

    @property
    def ok(self):
        return self.result.status == "passed"

    def report(self):
        return format_result(self.result)

    def __repr__(self):
        return f"<CheckResult {self.result.case_id} {self.result.status} maa={self.result.maa}>"


class Checker:
    def __init__(self, request):
        self._request = request
        self._count = 0

    def _case(self, graph, params, name=None, consumer="none", **fields):
        from .plugin import state_of
        state = state_of(self._request.config)
        self._count += 1
        raw = {"name": name or f"{self._request.node.name.replace('[', '_').replace(']', '')}-{self._count}",
               "graph": graph, "params": params, "consumers": [consumer], **fields}
        cases = build_cases(raw, path=str(self._request.node.path), line=self._request.node.reportinfo()[1] + 1,
                            session_backends=state.backends)
        if not cases:
            raise CaseError(f"no backend of this session ({', '.join(state.backends)}) is in {fields.get('backends')}")
        return state, cases[0]

    def run(self, graph, params, **fields):
        """Run one check in isolation and return its CheckResult (never fails the test)."""
        state, case = self._case(graph, params, **fields)
        result = state.runner().run(case)
        state.results.append(result.to_dict())
        return CheckResult(result)

    def check(self, graph, params, **fields):
        """Like run(), but a check that does not pass fails the test with its report."""
        res = self.run(graph, params, **fields)
        if not res.ok:
            pytest.fail(res.report(), pytrace=False)
        return res


@pytest.fixture
def gradgate(request):
    """Declare and run gradient checks from Python; see pytest_gradgate.fixtures."""
    return Checker(request)
