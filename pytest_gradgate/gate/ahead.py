"""Runs the cases of the items pytest will run next, in background threads, while pytest
deals with the item before.

Without it an item's case starts only when pytest calls the item, and the worker idles
while pytest makes the previous item's reports, prints its line and runs every plugin's
hooks; and one pytest process runs one case at a time on a machine with more cores. Here
`jobs` threads, each with its own Runner (so its own worker and children), take the cases
in the order pytest will ask for them, and an item waits only until its own case is done.

Nothing about a case changes: each still runs alone in its child, with its own timeout
counted from when its worker starts it, and each item still turns its Result into pytest's
outcome (baseline, skips, the crash cap) in pytest's order, from the item's runtest.

Only cases whose items pytest is known to run are handed out ahead: in one process the
next items of session.items; in an xdist worker only the next item it was given (the
controller hands out the rest). A run that stops early (-x, the crash cap) kills the cases
still running and drops their results.

The threads never parse Python. CPython 3.11's AST constructor keeps its recursion depth in
state that every thread shares, so an ast.parse in one of them while pytest's thread parses
too (its tracebacks do, and its assertion rewriting of each module it imports) can fail
either with "SystemError: AST constructor recursion depth mismatch". So a case's graph is
parsed (Case.op, which a Result made in the parent needs) in pytest's thread before it is
queued, and everything the runner calls is imported before the threads start.
"""

import collections
import threading


class Ahead:
    def __init__(self, runners, expected_red=lambda key: False):
        """runners: one Runner per job; each is used by its own thread only. expected_red(key):
        is that case a known failure (its Runner then starts it in a fresh child at once)."""
        self._runners = list(runners)
        self._expected_red = expected_red
        self._queue = collections.deque()     # (key, case), in pytest's order; "now" cases go first
        self._queued = set()
        self._done = {}                        # key -> Result, or the exception its run raised
        self._running = {}                     # thread index -> key
        self._lock = threading.Condition()
        self._closing = False
        self._threads = []

    @property
    def jobs(self):
        return len(self._runners)

    def submit(self, key, case):
        """Queue a case that pytest will ask for (by `key`); a key queued or done already is kept."""
        case.op     # parsed here, in pytest's thread (see above)
        with self._lock:
            if self._closing or key in self._queued or key in self._done or key in self._running.values():
                return
            self._queue.append((key, case))
            self._queued.add(key)
            self._start()
            self._lock.notify()

    def result(self, key, case):
        """The Result of the case queued under `key` (queued now, first in line, if it was not)."""
        case.op
        with self._lock:
            if self._closing:   # the run stopped (gate.state.stop_ahead): no thread would take it
                raise RuntimeError(f"gradgate: {case.id} was asked for after the run stopped")
            if key not in self._queued and key not in self._done and key not in self._running.values():
                self._queue.appendleft((key, case))
                self._queued.add(key)
                self._start()
                self._lock.notify()
            while key not in self._done:
                self._lock.wait()
            outcome = self._done.pop(key)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _start(self):
        if self._threads:
            return
        for index, runner in enumerate(self._runners):
            thread = threading.Thread(target=self._work, args=(index, runner), name=f"gradgate-ahead-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self, index, runner):
        # a runner whose worker is still starting takes no case: the others (the first one's
        # worker is up before its thread starts) take them meanwhile
        runner.start()
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                key, case = self._queue.popleft()
                self._queued.discard(key)
                self._running[index] = key
            try:
                outcome = runner.run(case, fresh=self._expected_red(key))
            except BaseException as exc:    # raised again in the item that asks for it
                outcome = exc
            with self._lock:
                del self._running[index]
                if not self._closing:
                    self._done[key] = outcome
                self._lock.notify_all()

    def close(self):
        """Drop what is queued, kill the workers of cases still running, stop the threads.
        The runners themselves are closed by their owner."""
        with self._lock:
            self._closing = True
            self._queue.clear()
            self._queued.clear()
            busy = set(self._running)
            self._lock.notify_all()
        # a case still running would have its result dropped: do not wait for it (its worker
        # is killed). Every runner is cancelled: one may be starting its worker (Runner.cancel)
        for index, runner in enumerate(self._runners):
            runner.cancel(kill=index in busy)
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads = []
