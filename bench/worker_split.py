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
- "hook_cpu_s": {worker: {hook: CPU s}}: each worker's main thread's CPU seconds
  (time.thread_time) inside pytest's runtest hooks, over all its items: the whole protocol and,
  apart, its setup, call, teardown, makereport and logreport (xdist's send of each report).
  A wait does not count (a blocked thread spends no CPU): the gate's call is its own work
  around the wait for its case. The same for a run of empty items tells what each hook costs
  pytest and xdist whatever the items do.
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
HOOKS_KEY = "gradgate_bench_hook_cpu_s"
_hooks = {}


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
    output = getattr(node, "workeroutput", {})
    if output.get(CPU_KEY) is not None:
        _cpu[node.gateway.id] = output[CPU_KEY]
    if output.get(HOOKS_KEY) is not None:
        _hooks[node.gateway.id] = output[HOOKS_KEY]


class HookCPU:
    """In an xdist worker: the main thread's CPU seconds inside each runtest hook, outermost
    (tryfirst wrappers: every other implementation of the hook runs inside)."""

    def __init__(self):
        self.spent = {}

    def _timed(self, name):
        started = time.thread_time()
        try:
            return (yield)
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.thread_time() - started

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        return (yield from self._timed("protocol"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        return (yield from self._timed("setup"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        return (yield from self._timed("call"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        return (yield from self._timed("teardown"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        return (yield from self._timed("makereport"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report):
        return (yield from self._timed("logreport"))


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(HookCPU(), "worker-split-hook-cpu")


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):
        # before xdist sends its workerfinished event, which carries workeroutput
        config.workeroutput[CPU_KEY] = _own_cpu_s()
        timer = config.pluginmanager.get_plugin("worker-split-hook-cpu")
        config.workeroutput[HOOKS_KEY] = dict(timer.spent) if timer is not None else {}
        return
    path = os.environ.get("GRADGATE_BENCH_SPLIT")
    if path:
        _mark("finish_s")
        _cpu["controller"] = _own_cpu_s()
        with open(path, "w") as f:
            json.dump({"workers": _split, "timeline": _timeline, "cpu_s": _cpu, "hook_cpu_s": _hooks}, f,
                      sort_keys=True)
