"""A pytest plugin for bench_gate.py: how a run under pytest-xdist spread its items.

Loaded with `-p worker_split` (bench/ on PYTHONPATH); acts on the controller only, where
every worker's reports arrive. Writes {worker: {"items", "call_s", "done_s"}} as JSON to
$GRADGATE_BENCH_SPLIT: the items it ran, the sum of their call phases' durations (for the
gate, the time each item waited for its case), and when its last item's teardown report
arrived, in seconds from the controller's session start.
"""

import json
import os
import time

_started = time.perf_counter()
_split = {}


def pytest_sessionstart(session):
    global _started
    _started = time.perf_counter()


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)     # set by xdist on the controller's copy of a report
    if node is None:
        return
    worker = _split.setdefault(node.gateway.id, {"items": 0, "call_s": 0.0, "done_s": 0.0})
    if report.when == "call":
        worker["items"] += 1
        worker["call_s"] += report.duration
    elif report.when == "teardown":
        worker["done_s"] = time.perf_counter() - _started


def pytest_sessionfinish(session):
    path = os.environ.get("GRADGATE_BENCH_SPLIT")
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w") as f:
            json.dump(_split, f, sort_keys=True)
