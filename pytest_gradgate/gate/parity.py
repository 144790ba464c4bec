"""Parity items: a case's analytic gradients on two sides, compared (check/parity.py).

- With --gradgate-reference-src PATH every case is a parity item `name[variant-vs-reference]`:
  the tree under test against the reference tree, both built with the same options. Two
  builds of ggml export the same symbols, so each side runs in workers of its own: the
  tested side in the gate's runners, the reference side in a Runner on the reference build,
  at the same time.
- A case on the CUDA backend gets a parity item `name[variant-vs-cpu]` next to its own item:
  the same build's CUDA backend against its CPU backend, one after the other in the gate's
  runner (the CUDA side in the worker itself, as any CUDA case).

Neither side takes finite differences: one backward each, so these run at real sizes.
"""

import dataclasses
import itertools
import os
import shutil
import tempfile

from pytest_gradgate.errors import GradgateError

VS_REFERENCE, VS_CPU = "vs-reference", "vs-cpu"
TESTED, REFERENCE = "tested", "reference"


class Reference:
    """The reference tree: its source, its build (made when the first parity item runs), its runner."""

    def __init__(self, source, state):
        self.source, self.state = source, state
        self.build = None
        self.build_error = None
        self.runner = None
        self._ahead = None

    @classmethod
    def choose(cls, value, state):
        from pytest_gradgate.library.source import resolve_source
        # the setting's precedence (option > env > ini) is applied already: one value, named as the option
        return cls(resolve_source(value, None, env={}, option_name="--gradgate-reference-src"), state)

    def ensure_runner(self):
        if self.build_error is not None:
            raise self.build_error
        if self.runner is None:
            from pytest_gradgate.library.cmake import ensure_build
            try:
                self.build = ensure_build(self.source.root, self.state.build_options(),
                                          progress=self.state._progress())
            except GradgateError as exc:
                self.build_error = GradgateError(f"the reference tree (--gradgate-reference-src "
                                                 f"{self.source.label}): {exc}")
                raise self.build_error from None
            from pytest_gradgate.isolation.parent import Runner
            s = self.state.settings
            # never in this process: the tested library may be loaded here (isolate=none)
            isolate = s["isolate"] if s["isolate"] != "none" else "worker"
            self.runner = Runner(self.build.library, isolate=isolate, max_memory=s["max_memory"],
                                 backtrace=s["backtrace"], timeout=s["timeout"] or None)
        return self.runner

    def ahead(self):
        """The reference runner behind a thread that lives as long as the run: a worker dies with
        the thread that started it (isolation/prctl.py), so not one thread per item."""
        if self._ahead is None:
            from pytest_gradgate.gate.ahead import Ahead
            self._ahead = Ahead([self.ensure_runner()])
        return self._ahead

    def close(self):
        if self._ahead is not None:
            self._ahead.close()
        if self.runner is not None:
            self.runner.close()


def parity_cases(case, reference_src):
    """(kind, case) of the parity items of `case` in a run with this --gradgate-reference-src."""
    if reference_src is not None:
        return [(VS_REFERENCE, case)]
    if case.backend != "cpu":
        return [(VS_CPU, case)]
    return []


def configure(state):
    """The reference tree of --gradgate-reference-src, chosen now (a bad path is an error now)."""
    value = state.settings["reference_src"]
    if value is not None:
        state.reference = Reference.choose(value, state)


def sides_of(against, case):
    return (TESTED, REFERENCE) if against == VS_REFERENCE else (case.backend, "cpu")


def run(state, case, against):
    """The parity item's Result: both sides run, their gradient sets compared."""
    from pytest_gradgate.check import parity
    sides = sides_of(against, case)
    folder = _scratch(state)
    cases = [_side_case(state, case, folder, sides[0], case.backend),
             _side_case(state, case, folder, sides[1], case.backend if against == VS_REFERENCE else "cpu")]
    try:
        outcomes = _both_at_once(state, cases) if against == VS_REFERENCE else [state.run(c) for c in cases]
        loaded = [(r, _read(r, c)) for r, c in zip(outcomes, cases)]
    finally:
        for c in cases:
            if os.path.exists(c.gradients_out):
                os.unlink(c.gradients_out)
    result = parity.judge(case, sides, loaded)
    # the item's id, not the case's: a CUDA case's own item and its parity item both report
    result.case_id = f"{case.name}[{case.variant}-{against}]"
    return result


def _side_case(state, case, folder, side, backend):
    from pytest_gradgate.check import precision
    tf32 = precision.parse_backends(state.settings["tf32"])
    return dataclasses.replace(case, backend=backend, mode="parity",
                               matmul_precision=precision.matmul_precision(backend, tf32),
                               gradients_out=os.path.join(folder, f"{next(_numbers)}-{side}.npz"))


_numbers = itertools.count()


def _scratch(state):
    folder = getattr(state, "parity_folder", None)
    if folder is None:
        folder = state.parity_folder = tempfile.mkdtemp(prefix="gradgate-parity-")
        state.config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


def _both_at_once(state, cases):
    """The tested side in the gate's runners, the reference side in its own, at the same time."""
    tested, reference = cases
    ahead = state.reference.ahead()
    key = reference.gradients_out
    ahead.submit(key, reference)
    return [state.run(tested), ahead.result(key, reference)]


def _read(result, case):
    from pytest_gradgate.check import analytic
    from pytest_gradgate.check.outcome import Status
    if result.status != Status.PASSED:
        return None
    return analytic.read_sets(case.gradients_out)
