"""A case file's loaded cases, remembered between processes.

Every pytest process (each xdist worker too) loads the built-in case files at collection.
Parsing and validating cases.yaml took 50-70 ms of that, importing the loader (PyYAML) 25
ms more; unpickling the loaded cases takes about 5 ms. The memo's key is everything that
load_file's result depends on: the file's bytes and path, the session's backends, whether
it is a built-in file, the Python version, and the digest of this package's own files (a
stat walk, see library/tree_digest.py). A memo is therefore only ever what load_file would
return now, and an edit of the file or of the loader is a miss.

Only a load without errors is kept: a file with mistakes is read again every time, so the
errors shown are always this run's own. There is one memo per case file and session kind
(its name says which, the key inside it says for what content); memo_file.py writes it and
drops the memos of files that are gone.
"""

import contextlib
import functools
import hashlib
import json
import pickle
import sys
from pathlib import Path

from pytest_gradgate.library import memo_file
from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.library.tree_digest import tree_digest

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


def load_file_remembered(path, session_backends=("cpu",), builtin=False, declared_ops=None):
    """load_file(path, session_backends, builtin, declared_ops), from the memo when it holds this
    very input (the ops from Python included)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):   # load_file words these
        return _load(path, session_backends, builtin, declared_ops=declared_ops)
    key = memo_key(raw + (json.dumps(declared_ops, sort_keys=True).encode() if declared_ops else b""), path,
                   session_backends, builtin)
    where = memo_path(path, session_backends, builtin)
    remembered = _read(where, key)
    if remembered is not None:
        return remembered
    loaded, errors = _load(path, session_backends, builtin, text, declared_ops)
    if not errors:
        _write(where, path, key, loaded)
    return loaded, errors


def _load(path, session_backends, builtin, text=None, declared_ops=None):
    from pytest_gradgate.declare.loader import load_file
    return load_file(path, session_backends, builtin=builtin, text=text, declared_ops=declared_ops)


# The memo's body is the pickle of the loaded cases (see memo_file.py for its head).
def _read(where, key):
    found = memo_file.read(where, MEMO_VERSION)
    if found is None or found[0].get("key") != key:
        return None
    try:
        loaded = pickle.loads(found[1])
    except Exception:   # noqa: BLE001  truncated, or of classes since changed: no memo
        return None
    return loaded, []


def _write(where, path, key, loaded):
    for entry in loaded:     # the op of each case, parsed from its graph, travels in the memo too
        for case in entry.cases:
            with contextlib.suppress(Exception):
                case.op  # noqa: B018  (a cached_property: asking fills it)
    try:
        data = pickle.dumps(loaded, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # noqa: BLE001  something in a case that does not pickle: no memo
        return
    memo_file.write(where, {"version": MEMO_VERSION, "owner": str(path), "key": key}, data)
