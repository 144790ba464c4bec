"""The content digest of a source tree, remembered between processes by its files' stat.

Every pytest process (each xdist worker too) needs the build's cache key, and hashing the
ggml tree (about 1,100 files, 19 MB) took 31-38 ms of CPU here; a walk that only stats
the files took 9 ms. So the digest is kept in a memo under the cache folder together
with each file's (path, size, mtime, ctime, inode, device), and a later walk that sees the
same list takes the memo's digest without reading a byte.

This is the rule git's index follows, its "racy" case included: a file written again
within the clock's granularity of its hashing could keep its mtime, so a memo is written
only when every file's mtime and ctime are RACY_NS older than the start of the hashing;
until then each process hashes. ctime is kept because every write moves it and nothing
sets it back (os.utime restores an mtime, not a ctime). A memo that cannot be read or
written is no memo: the digest is computed, never guessed.
"""

import hashlib
import json
import os
import time
from pathlib import Path

from pytest_gradgate.library import memo_file
from pytest_gradgate.library.cache import cache_root

RACY_NS = 2_000_000_000
MEMO_VERSION = 1


def _walk(top, rel):
    """(relative path, path, stat) of each file below `top`, by os.scandir: on the ggml tree
    pathlib's rglob alone took 27 ms, this walk with its stat calls 9 ms. Python's bytecode
    caches are nobody's input, and they are written while a run imports."""
    found = []
    with os.scandir(top) as entries:
        for entry in entries:
            if entry.name == "__pycache__":
                continue
            if entry.is_dir(follow_symlinks=False):
                found += _walk(entry.path, f"{rel}/{entry.name}")
            elif entry.is_file():
                found.append((f"{rel}/{entry.name}", entry.path, entry.stat()))
    return found


def _files(root, names):
    """(relative path, path, stat) of the files under root/name for each name, in hashing order."""
    files = []
    for name in names:
        top = os.path.join(root, name)
        if os.path.isfile(top):
            files.append((name, top, os.stat(top)))
        elif os.path.isdir(top):
            files += sorted(_walk(top, name))
    return files


def _stat_rows(files):
    return [[rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev] for rel, _, st in files]


def hash_files(files):
    """sha256 over each file's relative path and content (the digest the memo keeps)."""
    digest = hashlib.sha256()
    for rel, path, _ in files:
        digest.update(rel.encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read())
        digest.update(b"\0")
    return digest.hexdigest()


def memo_path(root, names):
    ident = json.dumps([str(Path(root).resolve()), list(names)])
    return memo_dir() / (hashlib.sha256(ident.encode()).hexdigest()[:24] + ".json")


def memo_dir():
    return cache_root() / "tree-digests"


# The memo's body is the files' stat rows, as JSON (see memo_file.py for its head).
def _read_memo(path):
    """(digest, stat rows) of the memo at `path`, or None."""
    found = memo_file.read(path, MEMO_VERSION)
    if found is None or not isinstance(found[0].get("digest"), str):
        return None
    try:
        return found[0]["digest"], json.loads(found[1])
    except ValueError:
        return None


def _write_memo(path, root, digest, rows):
    head = {"version": MEMO_VERSION, "owner": str(Path(root).resolve()), "digest": digest}
    memo_file.write(path, head, json.dumps(rows).encode())


def tree_digest(root, names):
    """Hex sha256 of the files under root/name for each name: their relative paths and contents."""
    files = _files(root, names)
    rows = _stat_rows(files)
    path = memo_path(root, names)
    memo = _read_memo(path)
    if memo is not None and memo[1] == rows:
        return memo[0]
    started = time.time_ns()
    digest = hash_files(files)
    if all(max(row[2], row[3]) < started - RACY_NS for row in rows):
        _write_memo(path, root, digest, rows)
    return digest
