"""A case file's loaded cases, remembered between processes.

Every pytest process (each xdist worker too) loads the built-in case files at collection.
Parsing and validating cases.yaml took 50-70 ms of that, importing the loader (PyYAML) 25
ms more; unpickling the loaded cases takes about 5 ms. The memo's key is everything that
load_file's result depends on: the file's bytes and path, the session's backends, whether
it is a built-in file, the Python version, and the digest of this package's own files (a
stat walk, see build/tree_digest.py). A memo is therefore only ever what load_file would
return now, and an edit of the file or of the loader is a miss.

Only a load without errors is kept: a file with mistakes is read again every time, so the
errors shown are always this run's own. There is one memo per case file and session kind
(its name says which, the key inside it says for what content); the memos of files that
are gone are dropped whenever one is written.
"""

import contextlib
import functools
import hashlib
import json
import os
import pickle
import sys
from pathlib import Path

from pytest_gradgate.build.cache import cache_root
from pytest_gradgate.build.tree_digest import tree_digest

MEMO_VERSION = 1
PACKAGE = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def package_digest():
    # once per process: what matters is the code this process imported, not later edits
    return tree_digest(PACKAGE.parent, (PACKAGE.name,))


def memo_dir():
    return cache_root() / "collections"


def memo_path(path, session_backends, builtin):
    ident = json.dumps([str(path), list(session_backends), bool(builtin), sys.version])
    return memo_dir() / (hashlib.sha256(ident.encode()).hexdigest()[:24] + ".pickle")


def memo_key(raw, path, session_backends, builtin):
    head = json.dumps([MEMO_VERSION, sys.version, package_digest(), str(path), list(session_backends),
                       bool(builtin)])
    return hashlib.sha256(head.encode() + b"\0" + raw).hexdigest()


def load_file_remembered(path, session_backends=("cpu",), builtin=False):
    """load_file(path, session_backends, builtin), from the memo when it holds this very input."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):   # load_file words these
        return _load(path, session_backends, builtin)
    key = memo_key(raw, path, session_backends, builtin)
    where = memo_path(path, session_backends, builtin)
    remembered = _read(where, key)
    if remembered is not None:
        return remembered
    loaded, errors = _load(path, session_backends, builtin, text)
    if not errors:
        _write(where, path, key, loaded)
    return loaded, errors


def _load(path, session_backends, builtin, text=None):
    from pytest_gradgate.declare.loader import load_file
    return load_file(path, session_backends, builtin=builtin, text=text)


# A memo: one line of JSON ({version, path, key}), then the pickle of the loaded cases. The
# first line alone says whose memo it is and for what content.
def _read(where, key, whole=True):
    try:
        with open(where, "rb") as handle:
            head = json.loads(handle.readline())
            if not isinstance(head, dict) or head.get("version") != MEMO_VERSION:
                return None
            if not whole:
                return head
            if head.get("key") != key:
                return None
            loaded = pickle.load(handle)
    except Exception:   # noqa: BLE001  unreadable, truncated, or of classes since changed: no memo
        return None
    return loaded, []


def _write(where, path, key, loaded):
    for entry in loaded:     # the op of each case, parsed from its graph, travels in the memo too
        for case in entry.cases:
            with contextlib.suppress(Exception):
                case.op  # noqa: B018  (a cached_property: asking fills it)
    tmp = where.with_name(f".tmp-{os.getpid()}-{where.name}")
    try:
        data = pickle.dumps(loaded, protocol=pickle.HIGHEST_PROTOCOL)
        where.parent.mkdir(parents=True, exist_ok=True)
        _prune(where.parent)
        head = json.dumps({"version": MEMO_VERSION, "path": str(path), "key": key}).encode()
        tmp.write_bytes(head + b"\n" + data)
        os.replace(tmp, where)   # a reader sees the old memo or the new one, whole
    except Exception:   # noqa: BLE001  a memo that cannot be written is no memo
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _prune(folder):
    for memo in folder.glob("*.pickle"):
        if memo.name.startswith(".tmp-"):   # another process's, being written
            continue
        head = _read(memo, None, whole=False)
        if head is None or not os.path.isfile(head.get("path", "")):
            with contextlib.suppress(OSError):
                memo.unlink()
