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


def make_entry(entry, is_ready, produce):
    """Make sure the cache entry folder `entry` exists, producing it at most once.

    `is_ready(entry)` says whether a complete entry is there; `produce(staging)` fills a
    fresh staging folder. Under the entry's lock (so concurrent processes wait for one
    producer), leftovers of interrupted producers are swept, and the staging folder is
    published in one rename, or removed if `produce` fails. Returns True when this call
    produced the entry, False when it was already there."""
    entry = Path(entry)
    if is_ready(entry):
        return False
    with file_lock(entry.parent / f"{entry.name}.lock"):
        if is_ready(entry):  # another process produced it while we waited
            return False
        sweep_stale_staging(entry.parent, entry.name)
        staging = new_staging_dir(entry)
        try:
            produce(staging)
            if entry.exists():  # an incomplete leftover, never a valid entry
                shutil.rmtree(entry)
            publish(staging, entry)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return True
