"""The content digest of a source tree, remembered between processes by its files' stat.

Every pytest process (each xdist worker too) needs the build's cache key, and hashing the
ggml tree (about 1,100 files, 19 MB) takes 30-40 ms of CPU; a walk that only stats the
files takes about 3 ms. So the digest is kept in a memo under the cache folder together
with each file's (path, size, mtime, ctime, inode, device), and a later walk that sees the
same list takes the memo's digest without reading a byte.

This is the rule git's index follows, its "racy" case included: a file written again
within the clock's granularity of its hashing could keep its mtime, so a memo is written
only when every file's mtime and ctime are RACY_NS older than the start of the hashing;
until then each process hashes. ctime is kept because every write moves it and nothing
sets it back (os.utime restores an mtime, not a ctime). A memo that cannot be read or
written is no memo: the digest is computed, never guessed.
"""

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from pytest_gradgate.build.cache import cache_root

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


# A memo is two lines of JSON: {version, root, digest}, then the files' stat rows. The
# first line alone says whose memo it is, so pruning reads no rows.
def _read_memo(path, rows_too=True):
    try:
        with open(path) as handle:
            head = json.loads(handle.readline())
            if not isinstance(head, dict) or head.get("version") != MEMO_VERSION or not isinstance(head.get("digest"), str):
                return None
            if rows_too:
                head["files"] = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return head


def _write_memo(path, root, digest, rows):
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune(path.parent)
        head = {"version": MEMO_VERSION, "root": str(Path(root).resolve()), "digest": digest}
        tmp.write_text(json.dumps(head) + "\n" + json.dumps(rows) + "\n")
        os.replace(tmp, path)   # a reader sees the old memo or the new one, whole
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _prune(folder):
    """Drop the memos of trees that are gone (a test's or a verify run's temporary copies),
    so the folder holds about one memo per tree that still exists."""
    for memo in folder.glob("*.json"):
        if memo.name.startswith(".tmp-"):   # another process's memo, being written
            continue
        head = _read_memo(memo, rows_too=False)
        if head is None or not os.path.isdir(head.get("root", "")):
            memo.unlink(missing_ok=True)


def tree_digest(root, names):
    """Hex sha256 of the files under root/name for each name: their relative paths and contents."""
    files = _files(root, names)
    rows = _stat_rows(files)
    path = memo_path(root, names)
    memo = _read_memo(path)
    if memo is not None and memo.get("files") == rows:
        return memo["digest"]
    started = time.time_ns()
    digest = hash_files(files)
    if all(max(row[2], row[3]) < started - RACY_NS for row in rows):
        _write_memo(path, root, digest, rows)
    return digest
