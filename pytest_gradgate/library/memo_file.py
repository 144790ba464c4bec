"""Small files under the cache that carry work from one process to the next (a tree's
digest, a case file's loaded cases).

A memo is one line of JSON, its head ({version, owner, ...}: `owner` is the path whose memo
it is), then its body. It is written through a temporary sibling and one rename, so a reader
sees the old memo or the new one, whole. A memo that cannot be read or written is no memo:
the caller computes what it would have held. Each write drops the memos beside it whose
owner is gone (a test's or a verify run's temporary copies), so a folder holds about one
memo per owner that still exists.
"""

import contextlib
import json
import os


def read(path, version, body=True):
    """(head, body bytes, or None without `body`) of the memo at `path`; None if it is absent,
    damaged, or of another version."""
    try:
        with open(path, "rb") as handle:
            head = json.loads(handle.readline())
            if not isinstance(head, dict) or head.get("version") != version:
                return None
            return head, (handle.read() if body else None)
    except (OSError, ValueError):
        return None


def write(path, head, body):
    """Publish the memo at `path`: `head` (with its version and owner), then `body` (bytes)."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune(path.parent, path.suffix, head["version"])
        tmp.write_bytes(json.dumps(head).encode() + b"\n" + body)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _prune(folder, suffix, version):
    for memo in folder.glob("*" + suffix):
        if memo.name.startswith(".tmp-"):   # another process's, being written
            continue
        found = read(memo, version, body=False)
        if found is None or not os.path.exists(str(found[0].get("owner", ""))):
            with contextlib.suppress(OSError):
                memo.unlink()
