"""The user cache directory, a cross-process lock, and atomic publication.

Everything pytest-gradgate keeps between runs (the default ggml source, builds) lives
under one folder. Entries are written into a temporary sibling and renamed into place,
so a reader either sees a complete entry or none; an interrupted writer leaves only a
`.tmp-*` folder that is never mistaken for an entry and is swept on the next write.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def cache_root():
    """$GRADGATE_CACHE_DIR, else $XDG_CACHE_HOME/pytest-gradgate, else ~/.cache/pytest-gradgate."""
    explicit = os.environ.get("GRADGATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-gradgate"


@contextlib.contextmanager
def file_lock(path):
    """Hold an exclusive lock on `path` (created if needed) for the duration of the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def new_staging_dir(final):
    """A fresh temporary folder beside `final`, on the same file system (rename is atomic)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))


def publish(staging, final):
    """Move a completed staging folder into place in one rename."""
    os.replace(staging, final)


def sweep_stale_staging(parent, name):
    """Remove staging folders that interrupted writers of `name` left behind.

    Only called while holding the entry's lock, so no live writer owns them."""
    parent = Path(parent)
    if not parent.is_dir():
        return
    for leftover in parent.glob(f".tmp-{name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
