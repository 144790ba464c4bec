"""pytest-gradgate: check ggml's backward pass through non-contiguous consumers.

PYTEST_DONT_REWRITE: the package has no asserts for pytest to rewrite (see below).
"""

import sys

__version__ = "0.1.0"


def _load_as_python_does():
    """Take this package off pytest's list of plugin modules whose asserts it rewrites.

    pytest rewrites every module of an installed plugin's distribution on import: it parses
    and compiles each one again instead of loading the bytecode pip compiled, and where
    bytecode is not written (PYTHONDONTWRITEBYTECODE=1, a read-only site-packages) it does so
    in every pytest process, three of them under -n 2. The docstring marker above, pytest's
    documented opt-out, skips the rewrite but not the compile. This runs while the entry point
    imports the package, before any other module of it loads; a pytest without that list
    is left as it is (the modules are then rewritten, which costs time, not correctness)."""
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        if type(finder).__name__ == "AssertionRewritingHook" and isinstance(marked, set) and __name__ in marked:
            marked.discard(__name__)
            cache = getattr(finder, "_marked_for_rewrite_cache", None)
            if isinstance(cache, dict):
                cache.clear()    # it memoizes each name's answer


_load_as_python_does()
