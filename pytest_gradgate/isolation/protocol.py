"""The wire between the parent (parent.py) and its worker (worker.py).

One message per line: a JSON array `[event, {fields}]`, as pytest-xdist's `(event, kwargs)`.
Each event is named once here, and `decode` refuses one it does not know, so the two sides
cannot drift into recognising dicts by their keys.

worker -> parent, at start:  PHASE (load-library) ... then READY or FATAL
parent -> worker, per case:  CASE
worker -> parent, per case:  any number of PHASE (isolate=worker), then one of RESULT,
                             CRASH (a forked child died) or TIMEOUT (a forked child hung)
A worker that dies itself sends nothing more: the parent sees EOF and builds the crash.
"""

import json
import os

ISOLATE_MODES = ("case", "fresh", "worker", "none")
# GRADGATE_START_METHOD=spawn takes the path of platforms without fork (Windows; macOS, where
# forking a process with threads is unsafe): no child per case, each case runs in the worker
# process itself, which is replaced when a case kills it. Linux runs it in the tests too.
START_METHOD_ENV = "GRADGATE_START_METHOD"


def fork_available():
    return hasattr(os, "fork") and os.environ.get(START_METHOD_ENV, "fork") != "spawn"

PHASE = "phase"        # name: the phase the case (or the worker's start) is in
READY = "ready"        # ggml_version, rss: the worker has loaded the library and is warm
FATAL = "fatal"        # reason: the worker cannot run any case (the library cannot load)
CASE = "case"          # case, isolate, timeout, max_memory, backtrace, fresh, rerun
RESULT = "result"      # result: a Result as a dict
CRASH = "crash"        # the fields of a Crash
TIMEOUT = "timeout"    # phase, stderr
EVENTS = frozenset({PHASE, READY, FATAL, CASE, RESULT, CRASH, TIMEOUT})


class ProtocolError(Exception):
    """A line that is not a message of this protocol (a bug of ours, or a corrupted pipe)."""


def encode(event, **fields):
    if event not in EVENTS:
        raise ProtocolError(f"unknown event {event!r}")
    return (json.dumps([event, fields]) + "\n").encode()


def decode(line):
    """-> (event, fields)."""
    try:
        event, fields = json.loads(line)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"not a protocol message: {line[:200]!r} ({exc})") from None
    if event not in EVENTS or not isinstance(fields, dict):
        raise ProtocolError(f"unknown event {event!r} in {line[:200]!r}")
    return event, fields
