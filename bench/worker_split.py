"""A pytest plugin for bench_gate.py: how a run under pytest-xdist spread its items, and when.

Loaded with `-p worker_split` (bench/ on PYTHONPATH); acts on the controller, where every
worker's reports arrive, and in each worker only to send its CPU seconds back (through
xdist's workeroutput). Writes JSON to $GRADGATE_BENCH_SPLIT:
- "workers": {worker: {"items", "call_s", "done_s"}}: the items it ran, the sum of their call
  phases' durations (for the gate, the time each item waited for its case), and when its last
  item's teardown report arrived, in seconds from the controller's session start;
- "timeline": seconds from the controller's process start (from /proc where there is one,
  else from this plugin's import) to its session start ("session_s"), to the arrival of
  the last worker's collection ("collected_s"), of the first and the last test report
  ("first_s", "last_s") and to the session's finish ("finish_s"): where a run's wall time
  goes before its first item, among its items, and after them;
- "cpu_s": CPU seconds (user + system, getrusage) of the controller ("controller") and of
  each worker (by its id), each its own process's alone, from its start to its session's
  finish: its case workers, their children and its exit are not in it. What a run's whole
  tree spent beyond these (bench_gate.py measures the tree) is the case workers' and the ends'.
"""

import json
import os
import resource
import time

import pytest

_started = time.perf_counter()
_split = {}
_cpu = {}
CPU_KEY = "gradgate_bench_cpu_s"


def _own_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
_timeline = {}


def _process_start():
    """perf_counter() at this process's start: its start time in /proc (clock ticks since
    boot) against /proc/uptime, or now where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.perf_counter()
    return time.perf_counter() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


_process_started = _process_start()


def _mark(name, only_first=True):
    if not only_first or name not in _timeline:
        _timeline[name] = time.perf_counter() - _process_started


def pytest_sessionstart(session):
    global _started
    _started = time.perf_counter()
    _mark("session_s")


def pytest_xdist_node_collection_finished(node, ids):
    _mark("collected_s", only_first=False)     # the last worker's is the one the items wait for


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)     # set by xdist on the controller's copy of a report
    if node is None:
        return
    _mark("first_s")
    _mark("last_s", only_first=False)
    worker = _split.setdefault(node.gateway.id, {"items": 0, "call_s": 0.0, "done_s": 0.0})
    if report.when == "call":
        worker["items"] += 1
        worker["call_s"] += report.duration
    elif report.when == "teardown":
        worker["done_s"] = time.perf_counter() - _started


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # the controller's, as a worker finishes: what it sent back at its session's finish
    cpu = getattr(node, "workeroutput", {}).get(CPU_KEY)
    if cpu is not None:
        _cpu[node.gateway.id] = cpu


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):
        # before xdist sends its workerfinished event, which carries workeroutput
        config.workeroutput[CPU_KEY] = _own_cpu_s()
        return
    path = os.environ.get("GRADGATE_BENCH_SPLIT")
    if path:
        _mark("finish_s")
        _cpu["controller"] = _own_cpu_s()
        with open(path, "w") as f:
            json.dump({"workers": _split, "timeline": _timeline, "cpu_s": _cpu}, f, sort_keys=True)
