"""Ops declared from Python: the pytest_gradgate_ops hook (hookspecs.py), asked once per run.

What the implementations return is merged and checked like a case file's top-level `ops:`
(explore/declared.py), and kept in config.stash: the case files' collection (gate/items.py)
gives the ops to every file, and --gradgate-explore draws them (gate/explore.py).
"""

import pytest

from pytest_gradgate.errors import UsageError

HOOK_OPS = pytest.StashKey()
WHERE = "pytest_gradgate_ops hook"


def hook_ops(config):
    """{name: {"c": prototype, "ranges": {...}}} the hook's implementations declare; a
    pytest.UsageError for a bad one, at the first call (pytest_configure)."""
    if HOOK_OPS not in config.stash:
        from pytest_gradgate.explore.declared import merge, normalise
        declared = {}
        try:
            for returned in config.hook.pytest_gradgate_ops(config=config):
                if returned:
                    merge(declared, normalise(returned, WHERE), WHERE)
        except UsageError as exc:
            raise pytest.UsageError(f"gradgate: {exc}") from None
        config.stash[HOOK_OPS] = declared
    return config.stash[HOOK_OPS]


def hook_prototypes(config):
    """{name: prototype} of the hook's ops: what a case file's `ops:` gives its cases."""
    from pytest_gradgate.explore.declared import prototypes
    return prototypes(hook_ops(config))
