"""Explore: search for backward bugs beyond the fixed suite, and shrink each to a case.

space.py draws case mappings (exactly what a YAML case file holds) from the op table, the
consumers, the losses, the parameter axes and the thread counts, with Hypothesis; search.py
runs each drawn case in the isolated worker and lets Hypothesis shrink what fails; findings.py
keys, deduplicates and marks the failures (known ones from the baseline) and writes them out
as a case file plus JSON. The `gradgate explore` command (cli/explore.py) and
`pytest --gradgate-explore=60s` (gate/explore.py) are its two front ends.

Hypothesis is imported only here, so a gate run without explore never loads it. It is an
optional extra (pytest-gradgate[explore]), not a dependency: installed, it registers a pytest
plugin that costs every pytest run of the user's, explore or not, the import of all of
Hypothesis at the terminal summary (0.7-1.0 s per process on 2 cores where bytecode is not written,
as in many CI images, since pytest then rewrites its modules in every run).
"""

import importlib.util

from pytest_gradgate.errors import UsageError

EXTRA_HINT = "pip install 'pytest-gradgate[explore]'"


def require_hypothesis(what):
    """UsageError naming `what` and the extra to install unless Hypothesis is importable.
    Asked before anything is built or run, and without importing Hypothesis."""
    if importlib.util.find_spec("hypothesis") is None:
        raise UsageError(f"{what} needs Hypothesis, which is not installed; install the explore extra: "
                         f"{EXTRA_HINT} (or pip install hypothesis)")
