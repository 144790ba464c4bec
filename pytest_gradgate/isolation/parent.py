"""The parent side of isolation: send cases to a worker, turn any death into a Result.

A crash, a timeout, a worker that will not start: each becomes an ordinary Result with
status crashed/timeout/error, the phase, the signal and ggml's message, so pytest reports
it like any failure. Dead workers are replaced. A run whose workers keep dying before any
case gets going (the library cannot load, say) is stopped by the caller (gate/items.py, the
crash cap); a library that cannot load at all is marked Diagnosis.BROKEN_BUILD so it stops at once.
"""

import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from pytest_gradgate.check import alone
from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.declare.work import LONG_WORK, estimated_work
from pytest_gradgate.isolation import protocol
from pytest_gradgate.isolation.crash import Crash, death_message, explain, ggml_message, stderr_excerpt
from pytest_gradgate.library.sanitizer import worker_env

_ALLOCATION_WORDS = re.compile(r"alloc|out of memory|Cannot allocate", re.I)
BROKEN_BUILD_TEXT = "broken build: the worker cannot load the library, so no case can run"
# seconds the parent waits beyond a case's timeout for the worker to report it (isolate=case:
# the worker kills the child itself and then answers)
REPLY_GRACE = 10.0
START_TIMEOUT = 120.0
# a default only ever stops a hang: past half an hour a case that is just slow should say
# so itself (timeout:, --gradgate-timeout), and a killed run must not leave hours of work
MAX_DEFAULT_TIMEOUT = 1800.0


class WorkerGone(Exception):
    """The worker was dead before it got the request: nothing of the case ran yet."""


class WorkerStartError(Exception):
    def __init__(self, reason, broken_build=False, stderr=""):
        super().__init__(reason)
        self.broken_build = broken_build
        self.stderr = stderr


CANCELLED = "not run: the run was stopping (Runner.cancel)"


def default_timeout(case):
    """Seconds a case may take: generous for its size, so only a hang hits it."""
    if case.timeout:
        return case.timeout
    if case.mode in ("fast", "equivalence", "parity"):    # a few forwards, or one backward per formulation
        return 120.0
    forwards = case.n_param_elements() * (4 if case.stencil == 4 else 2)
    return min(MAX_DEFAULT_TIMEOUT, 30.0 + forwards * 0.005)


def format_size(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def wait_exited(proc, timeout):
    """proc.wait(timeout), woken as soon as the process exits where the OS gives a pidfd
    (Linux 5.3+). subprocess's own wait with a timeout polls with growing sleeps: a worker
    that exits 9-10 ms after its stdin closes was seen gone 17 ms later, at every close."""
    pidfd_open = getattr(os, "pidfd_open", None)
    fd = None
    if pidfd_open is not None:
        try:
            fd = pidfd_open(proc.pid)
        except OSError:     # already reaped, or no pidfd here: subprocess's polling wait
            pass
    if fd is not None:
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        if not ready:
            raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait(timeout=timeout)   # exited (a pidfd is readable once it has): reaped at once


class Worker:
    """One worker process (library loaded once) and its stderr file."""

    def __init__(self, library, backtrace=False, spawned=None):
        """spawned(proc): called as soon as the process exists, before it is up, so that
        it can be killed while it starts (Runner.cancel)."""
        # a file without a name (POSIX; on Windows one deleted when closed): read through its
        # descriptor only, it leaves nothing behind when this process is killed before close()
        self.stderr_file = tempfile.TemporaryFile(prefix="gradgate-worker-", suffix=".log")
        env = dict(os.environ)
        env["GRADGATE_PARENT_PID"] = str(os.getpid())   # the worker dies with us (worker.py _bind_to_parent)
        if backtrace:
            env.pop("GGML_NO_BACKTRACE", None)
        else:
            env["GGML_NO_BACKTRACE"] = "1"
        # glibc gives each thread that mallocs its own arena, reserving 64 MiB of address
        # space apiece; --gradgate-max-memory caps address space (RLIMIT_AS), and the threads
        # of a case's backward must not spend the cap on reservations
        env.setdefault("MALLOC_ARENA_MAX", "1")
        # numpy's OpenBLAS (the one PyPI's wheels bundle) runs the engine's matrix-vector
        # products on a thread pool whose threads spin between calls: in a suite run on two
        # cores they took 1.2 CPU s from ggml and the other workers. The engine's vectors are
        # small, so one thread computes them as fast. ggml does not use this BLAS (our build
        # enables no BLAS backend), so a user's own setting has nothing here to apply to.
        env["OPENBLAS_NUM_THREADS"] = "1"
        env = worker_env(library, env)     # a sanitizer build's runtime, preloaded
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_gradgate.isolation.worker", str(library)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file,
            env=env, bufsize=0)
        if spawned is not None:
            spawned(self.proc)
        self._buffer = b""
        self._stderr_start = 0
        # select() works on pipes only where there is fork (POSIX); elsewhere (Windows) a
        # thread reads them. The no-fork path uses it on every platform, so tests run it
        self._chunks = None if protocol.fork_available() else _pipe_reader(self.proc.stdout)
        phase, event, fields = Phase.STARTUP, None, {}
        try:
            while True:
                message = self._read_message(timeout=START_TIMEOUT)
                if message is None:
                    break
                event, fields = message
                if event != protocol.PHASE:
                    break
                phase = fields["name"]
        except TimeoutError:
            event, fields = protocol.FATAL, {"reason": f"the worker did not report ready within {START_TIMEOUT:.0f} s"}
        if event != protocol.READY:
            if event == protocol.FATAL:
                reason, broken = fields["reason"], True
            else:
                code = self.proc.wait()
                how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                died = f"the worker died ({how}) while in phase {phase}"
                broken = phase == Phase.LOAD_LIBRARY
                reason = f"{died}: cannot load {library}" if broken else \
                    f"{died}: {self.stderr_tail().strip() or 'no output'}"
            stderr = self.stderr_tail()
            self.close()
            raise WorkerStartError(reason, broken_build=broken, stderr=stderr)
        self.ggml_version = fields["ggml_version"]
        self.baseline_rss = fields.get("rss", 0)

    def stderr_tail(self):
        """The worker's stderr since the current request began (earlier cases left out)."""
        try:
            return stderr_excerpt(self.stderr_file.fileno(), self._stderr_start)
        except OSError:
            return ""

    def _read_chunk(self, left):
        """Bytes from the worker's stdout, b"" at EOF, None if none came within `left` s."""
        if self._chunks is not None:
            try:
                return self._chunks.get(timeout=left)
            except queue.Empty:
                return None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], left)
        return os.read(fd, 1 << 16) if ready else None

    def _read_message(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chunk = self._read_chunk(left)
            if chunk is None:
                continue
            if not chunk:
                self._chunks_at_eof()
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return protocol.decode(line)

    def _chunks_at_eof(self):
        if self._chunks is not None:
            self._chunks.put(b"")   # EOF stays EOF for the next read

    def alive(self):
        return self.proc.poll() is None

    def request(self, message, deadline_s):
        """Send one case; returns ((event, fields) or None if the worker died or hung, last phase, timed_out)."""
        self._stderr_start = os.fstat(self.stderr_file.fileno()).st_size
        try:
            self.proc.stdin.write(message)
            self.proc.stdin.flush()
        except OSError:  # it died after its last case (killed from outside, say)
            raise WorkerGone from None
        phase = Phase.STARTUP
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                reply = self._read_message(max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                return None, phase, True
            if reply is None:
                return None, phase, False
            if reply[0] == protocol.PHASE:
                phase = reply[1]["name"]
                continue
            return reply, phase, False

    def close(self, kill=False):
        if kill and self.proc.poll() is None:
            self.proc.kill()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                wait_exited(self.proc, timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.stderr_file.close()


class Runner:
    """Runs cases with the chosen isolation; holds at most one worker per process."""

    def __init__(self, library, isolate="case", max_memory=0, backtrace=False, timeout=None):
        self.library = str(library)
        self.isolate = isolate
        self.max_memory = max_memory
        self.backtrace = backtrace
        self.timeout = timeout
        self.worker = None
        self.lib = None
        self.workers_started = 0
        self.cancelled = False
        self._starting = None     # the process of a worker that is starting, not yet up
        self.start_error = None   # the WorkerStartError of the last worker that could not start
        # the last case was red and nobody expected it: red verdicts come in runs (the cases of
        # one broken op, the candidates of a shrinking search), so the next case starts fresh
        self._after_surprise = False

    def cancel(self, kill=True):
        """From another thread, when the run is over (-x, the crash cap, the session's end):
        no worker starts again and run() answers at once; a worker that is starting is killed
        now (it runs no case, and waiting for it to be up would hold up the close by its start,
        a few tenths of a second); kill: a worker that is up is killed too (the case it runs
        ends). The flag is set before the workers are looked at, and looked at again once a
        process exists (_spawned) and once a worker is up (_ensure_worker), so none escapes."""
        self.cancelled = True
        starting = self._starting
        if starting is not None and starting.poll() is None:
            starting.kill()
        worker = self.worker
        if kill and worker is not None and worker.alive():
            worker.proc.kill()

    def _spawned(self, proc):
        self._starting = proc
        if self.cancelled:
            proc.kill()

    def close(self):
        if self.worker:
            self.worker.close()
            self.worker = None

    @property
    def library_unloadable(self):
        """The last worker died loading the library, or was told it cannot be loaded: a broken build."""
        return self.start_error is not None and self.start_error.broken_build

    def ggml_version(self):
        """ggml's version as the library reports it, or None if it cannot be loaded.

        Asked of the worker (started now; the cases reuse it), never loaded into this
        process, unless isolate=none: a library that cannot load can kill the process."""
        if self.isolate == "none":
            from pytest_gradgate.library import binding
            from pytest_gradgate.errors import GradgateError
            try:
                self.lib = self.lib or binding.load(self.library)
            except GradgateError as exc:
                self.start_error = WorkerStartError(str(exc), broken_build=True)
                return None   # each case reports it
            return binding.ggml_version(self.lib)
        try:
            return self._ensure_worker().ggml_version
        except WorkerStartError:
            return None   # each case reports it (and the crash cap stops the run)

    def start(self):
        """Start the worker now, before any case, so that the first case does not wait for it.
        A worker that cannot start is left for the first case to report."""
        if self.isolate == "none":
            return
        try:
            self._ensure_worker()
        except WorkerStartError:
            pass

    def _ensure_worker(self):
        if self.worker is None or not self.worker.alive():
            if self.worker:
                self.worker.close()
            self.worker = None
            if self.cancelled:
                raise WorkerStartError(CANCELLED)
            try:
                self.worker = Worker(self.library, backtrace=self.backtrace, spawned=self._spawned)
            except WorkerStartError as exc:
                if self.cancelled:      # killed while it started
                    raise WorkerStartError(CANCELLED) from None
                self.start_error = exc
                raise
            finally:
                self._starting = None
            self.workers_started += 1
            if self.cancelled:      # cancel() came as it got up, and found no worker to kill
                self.worker.proc.kill()
        return self.worker

    def run(self, case, fresh=False):
        """The Result of `case`. fresh: the case is expected to be red (a known failure), so
        under isolate=case it goes straight to a fresh child, whose verdict is the one that
        would stand (isolation/worker.py); the verdict does not depend on it. A long case
        (declare/work.py) goes to a fresh child too: the fork costs it little, and a red
        verdict in a reused child would cost it a second run. So does the case after one
        that was red when nobody expected it (see _after_surprise)."""
        expected = fresh
        result = self._run(case, fresh or self._after_surprise or estimated_work(case) >= LONG_WORK)
        self._after_surprise = not expected and result.status != Status.PASSED
        return result

    def _run(self, case, fresh):
        timeout = self.timeout or default_timeout(case)
        started = time.perf_counter()
        if self.cancelled:
            return Result.for_case(case).finish(Status.ERROR, Phase.STARTUP, message=CANCELLED, started=started)
        if self.isolate == "none":
            from pytest_gradgate.library import binding
            from pytest_gradgate.check.engine import run_case
            self.lib = self.lib or binding.load(self.library)
            return run_case(case, self.lib)
        # a CUDA context must never exist in a process that forks: run such cases in the worker itself
        isolate = "worker" if case.backend != "cpu" or not protocol.fork_available() else self.isolate
        message = protocol.encode(protocol.CASE, case=case.to_dict(), isolate=isolate, timeout=timeout,
                                  max_memory=self.max_memory, backtrace=self.backtrace, fresh=bool(fresh))
        # isolate=case|fresh: the worker enforces the timeout on its child and answers; allow
        # it a grace period, and under isolate=case a second timeout: a case that hangs in a
        # child that ran earlier cases runs again in a fresh one (worker.py).
        # isolate=worker: the parent is the only one watching the clock.
        deadline_s = {"case": 2 * timeout + REPLY_GRACE, "fresh": timeout + REPLY_GRACE}.get(isolate, timeout)
        for attempt in (1, 2):
            try:
                worker = self._ensure_worker()
            except WorkerStartError as exc:
                result = Result.for_case(case)
                result.stderr_tail = exc.stderr
                if exc.broken_build:
                    result.kind, result.diagnosis = Diagnosis.BROKEN_BUILD, BROKEN_BUILD_TEXT
                else:
                    result.kind, result.diagnosis = Diagnosis.WORKER_START, "the worker process could not start"
                return result.finish(Status.ERROR, Phase.STARTUP, message=f"the worker could not start: {exc}",
                                     started=started)
            try:
                reply, phase, timed_out = worker.request(message, deadline_s)
                break
            except BaseException as exc:
                if not isinstance(exc, WorkerGone):
                    # the parent failed while the worker still works on this case: the worker is
                    # killed with it, so that the next case never gets this one's reply or death
                    worker.close(kill=True)
                    self.worker = None
                    if not isinstance(exc, Exception):
                        raise
                    result = Result.for_case(case)
                    return result.finish(Status.ERROR, Phase.STARTUP, started=started,
                                         message=f"the gate failed while it waited for this case "
                                                 f"({type(exc).__name__}: {exc}); nothing is known of its backward")
                worker.close()
                self.worker = None
                if attempt == 2:
                    result = Result.for_case(case)
                    return result.finish(Status.ERROR, Phase.STARTUP, started=started,
                                         message="two fresh workers in a row died before they got the case")
        if reply is None:  # the worker itself died or hung (isolate=worker, or a bug of ours)
            reply = self._reply_from_dead_worker(worker, phase, timed_out)
            worker.close()
            self.worker = None
            if isolate in ("case", "fresh") and reply[0] == protocol.CRASH:
                return self._worker_died_during_case(case, Crash(**reply[1]), started)
        return self._to_result(case, reply, timeout, started)

    @staticmethod
    def _worker_died_during_case(case, crash, started):
        """isolate=case: the worker, not the case's child, died (killed from outside, say).
        The child's phase was on the worker's page, gone with it: say so, not "startup"."""
        result = Result.for_case(case)
        result.signal, result.stderr_tail = crash.signal, crash.stderr
        result.kind = Diagnosis.DIED
        result.diagnosis = (f"the worker process died ({crash.how}) while its child ran the case (killed from "
                            "outside?); the phase the case had reached is unknown")
        return result.finish(Status.ERROR, Phase.UNKNOWN, message=result.diagnosis, started=started)

    @staticmethod
    def _reply_from_dead_worker(worker, phase, timed_out):
        if timed_out:
            worker.proc.kill()
            worker.proc.wait()
            return protocol.TIMEOUT, {"phase": phase, "stderr": worker.stderr_tail()}
        try:  # reap it ourselves for its peak memory
            _, status, usage = os.wait4(worker.proc.pid, 0)
            worker.proc.returncode = os.waitstatus_to_exitcode(status)
        except (ChildProcessError, AttributeError):  # already reaped; no wait4 (Windows)
            code = worker.proc.wait()
            status, usage = _status_of(code), None
        crash = Crash.from_wait(phase, worker.stderr_tail(), status, usage, worker.baseline_rss)
        return protocol.CRASH, crash.to_dict()

    def _to_result(self, case, reply, timeout, started):
        event, fields = reply
        if event == protocol.RESULT:
            return Result.from_dict(fields["result"])
        result = Result.for_case(case)
        if event == protocol.TIMEOUT:
            phase = Phase(fields["phase"])
            result.stderr_tail = fields.get("stderr", "")
            result.kind, result.diagnosis = Diagnosis.HUNG, f"hung in phase {phase}"
            return result.finish(Status.TIMEOUT, phase, started=started,
                                 message=f"timed out after {timeout:g} s in phase {phase} "
                                         "(raise --gradgate-timeout if the case is just slow)")
        if event != protocol.CRASH:
            raise protocol.ProtocolError(f"the worker answered a case with {event!r}")
        crash = Crash(**fields)
        phase = Phase(crash.phase)
        result.signal = crash.signal
        result.stderr_tail = crash.stderr
        result.kind, explanation = explain(phase, crash.stderr)
        status = Status.CRASHED
        if phase == Phase.PRODUCER_FORWARD:
            explanation += (f" (the op's forward alone, its input through producer '{case.producer}': the forward "
                            "itself dies on this layout, before any backward)")
        if phase == Phase.CONSUMER_CHECK:
            # it died in the consumer alone (check/selfcheck.py): the consumer's failure, not the op's
            msg = death_message(crash.stderr)
            result.kind = Diagnosis.CONSUMER_FAILS
            explanation = alone.failure_text(case.consumer, f"ggml: {msg}" if msg else f"it died ({crash.how})")
            status = Status.CONSUMER_FAILED
        elif phase == Phase.PRODUCER_FORWARD and ggml_message(crash.stderr):
            # ggml refused the layout (an assert of the op's forward) before any backward existed:
            # not a verdict. A death without ggml's word (a signal, a corrupted heap) stays a crash
            result.kind = Diagnosis.FORWARD_REJECTS_LAYOUT
            text = alone.forward_rejects_text(case.producer, f"ggml: {ggml_message(crash.stderr)}")
            result.diagnosis = text
            return result.finish(Status.SKIPPED, phase, message=text, started=started)
        elif phase == Phase.PRODUCER_CHECK:
            # the mirror: it died in the producer alone, between a param's leaf and the loss
            msg = death_message(crash.stderr)
            result.kind = Diagnosis.PRODUCER_FAILS
            explanation = alone.producer_failure_text(case.producer,
                                                          f"ggml: {msg}" if msg else f"it died ({crash.how})")
            status = Status.PRODUCER_FAILED
        ggml_msg = death_message(result.stderr_tail)
        # a dead worker's peak is its whole life's (isolate=worker: earlier cases' too), so the
        # cap is only named for a death that looks like a failed allocation: no message of
        # ggml's, or one about allocating; never for an assert on shapes or on ggml's own pool
        looks_like_allocation = not ggml_msg or (_ALLOCATION_WORDS.search(crash.stderr or "") and
                                                 "memory pool" not in (crash.stderr or ""))
        if self.max_memory and crash.grew_by >= self.max_memory // 2 and looks_like_allocation:
            # RLIMIT_AS counts address space, ru_maxrss resident pages: half the cap is near enough
            explanation += (f" (it had grown by {crash.grew_by >> 20} MiB against the --gradgate-max-memory cap "
                            f"of {format_size(self.max_memory)}: an allocation beyond the cap fails)")
        result.diagnosis = explanation
        result.message = f"crashed ({crash.how}) in phase {phase}" + (f": {ggml_msg}" if ggml_msg else "")
        return result.finish(status, phase, started=started)


def _pipe_reader(stream):
    """A queue of what a thread reads from `stream`; b"" once it ends."""
    chunks = queue.Queue()

    def pump():
        try:
            while True:
                chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
                chunks.put(chunk)
                if not chunk:
                    return
        except (OSError, ValueError):   # closed under us
            chunks.put(b"")
    threading.Thread(target=pump, name="gradgate-worker-reader", daemon=True).start()
    return chunks


def _status_of(exitcode):
    """A wait status from subprocess's returncode (negative: killed by that signal)."""
    return -exitcode if exitcode < 0 else exitcode << 8
