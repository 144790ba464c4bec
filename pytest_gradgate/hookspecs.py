"""pytest-gradgate's hook specifications (implemented in a conftest.py or a plugin); specs only.

Registered by plugin.py's pytest_addhooks, so pluggy checks an implementation's argument names.
"""

import pytest


@pytest.hookspec
def pytest_gradgate_ops(config):
    """Declare ops by their C prototype from Python: return {name: prototype} (or name ->
    {"c": prototype, "ranges": {arg: [lo, hi]}}), or None.

    The same as a case file's top-level `ops:` (docs/declared-ops.md), for every case file of
    the run: its cases call the ops by name, and `--gradgate-explore` draws them. A file's own
    `ops:` entry of the same name wins for that file. Every implementation's result is merged;
    one name given two prototypes, or a prototype that does not parse, stops the run with a usage
    error naming the hook.
    """
