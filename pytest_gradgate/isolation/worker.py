"""The worker process: loads the library once, then runs cases it is sent.

The messages are those of protocol.py; a dead child's crash record is crash.Crash.

isolate=case: each case runs in a forked child of the worker (library already loaded and
warmed up, so a case costs a fork, not an interpreter start); a child takes case after
case, and only its passes stand: any other verdict comes from a fresh child; see ForkingRunner.
isolate=fresh: a fresh child for every case. The children's stdout/stderr go to a file,
so ggml's abort message is captured.
isolate=worker: the worker runs the case itself; if it dies the parent sees EOF and
reports the crash from the phases it was sent and the worker's stderr file.
"""

import gc
import mmap
import os
import select
import signal
import sys
import tempfile
import time
import traceback

from pytest_gradgate.library import binding
from pytest_gradgate.check import metrics
from pytest_gradgate.check.engine import run_case
from pytest_gradgate.check.outcome import Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.declare.case import Case
from pytest_gradgate.isolation import protocol
from pytest_gradgate.isolation.prctl import PRCTL, allow_core_dumps, die_with_parent
from pytest_gradgate.isolation.crash import STDERR_TAIL, Crash, stderr_excerpt

# what a worker runs before its first fork (the first that passes on this ggml): every
# phase, two params, a non-contiguous consumer if this ggml's backward copes with one
# (ggml 0.15.3's does for ADD, and aborts for MUL, SUB, SQRT, ...)
# One thread: a worker that ran a multi-threaded compute may hold an OpenMP thread team,
# and a team does not survive fork (the children would hang in their first parallel region).
WARM_UP_CASES = [dict(name="warm-up", graph="add(a, b)", params={"a": [4, 3], "b": [4, 3]}, consumer=consumer,
                      threads=1)
                 for consumer in ("transpose", "none")]
PHASE_BOARD_BYTES = 64


def _run_guarded(case, lib, phase):
    """Run the engine; a Python exception is an 'error' result, not a crash."""
    try:
        return run_case(case, lib, phase).to_dict()
    except Exception as exc:
        result = Result.for_case(case)
        result.finish(Status.ERROR, getattr(phase, "last", Phase.BUILD_FORWARD),
                      message=f"{type(exc).__name__}: {exc}")
        result.stderr_tail = traceback.format_exc()[-STDERR_TAIL:]
        return result.to_dict()


def memory_baseline(field="VmSize:"):
    """Bytes of address space the loaded worker already has (VmSize, or another field).

    RLIMIT_AS counts the whole address space, and a loaded worker (Python, numpy,
    OpenBLAS's per-thread buffers, the library) already maps 150 MB to several GB,
    depending on the machine; so --gradgate-max-memory caps what a case maps on top."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def apply_backtrace_setting(backtrace):
    # ggml_print_backtrace forks gdb on an abort unless GGML_NO_BACKTRACE is set: slow,
    # and it can hang CI; only let it through when the user asked for backtraces (core
    # dumps follow the same setting, once for the worker and its children: see main)
    if backtrace:
        os.environ.pop("GGML_NO_BACKTRACE", None)
    else:
        os.environ["GGML_NO_BACKTRACE"] = "1"


def _apply_memory_cap(max_memory, baseline):
    if max_memory:
        import resource
        limit = baseline + max_memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


PARENT_PID_ENV = "GRADGATE_PARENT_PID"


def _bind_to_parent():
    """The worker's end of dying with pytest. The parent's pid comes in the environment: a
    parent that died before the prctl took effect has already left us to init. Where there
    is no prctl (macOS), a thread watches for the re-parenting instead."""
    expected = int(os.environ.get(PARENT_PID_ENV) or 0)
    die_with_parent()
    if expected and os.getppid() != expected:
        os._exit(1)
    if PRCTL is None and expected:
        import threading

        def watch():
            while os.getppid() == expected:
                time.sleep(1.0)
            os._exit(1)
        threading.Thread(target=watch, name="gradgate-parent-watch", daemon=True).start()


# a child takes case after case (see ForkingRunner) until it has run this many or its
# resident memory has grown by this much: a bound on what garbage that the child's disabled
# collector leaves, and what the allocator keeps, can add up to
MAX_CASES_PER_CHILD = 100
MAX_CHILD_GROWTH = 256 << 20
FORKED_MODES = ("case", "fresh")
# the child's word on its last case, two bytes on a shared page, written before its reply:
# does the verdict stand (it passed, or this child was fresh), and does the child stay for
# the next case (the engine reached a verdict, and no limit above is reached)
YES, NO = b"1", b"0"


def reusable(request):
    """May a child run another case after this one? Not under isolate=fresh, nor after a
    memory cap (a child's RLIMIT_AS cannot be raised again by a child that is not root, and
    its baseline would be the earlier cases' too)."""
    return request.get("isolate") == "case" and not request.get("max_memory")


class ForkingRunner:
    """Runs each case in a forked child of this (warm) worker.

    The fork and the copy-on-write that follows cost a case more than its own work: the
    child's first write to each page it shares with the worker faults and copies it, about
    1000 pages for a small case, 10 ms of CPU on a loaded 2-core VM for cases whose own work
    is 5 ms (bench/bench_isolation.py). So under isolate=case a child takes the next case
    once the engine has reached a verdict on its last one: its pages are copied already.

    A child that ran earlier cases is not fresh, so only a "passed" of it stands: any other
    verdict (failed, crashed, hung, anything) it reaches is reached again in a fresh child,
    and that one is reported (Result.rerun says it was). Every red verdict is a fresh
    child's; Result.earlier_in_child says how many cases a result's child ran before it.
    A case the parent expects to be red (request "fresh": a known failure, or a long case
    that a second run would cost dearly) goes to a fresh child at once. A child whose case
    ended in an error (our exception) or that reached a limit (MAX_CASES_PER_CHILD,
    MAX_CHILD_GROWTH) exits. isolate=fresh forks a child for every case.

    The next fresh child is forked ahead of time (the "spare"), while a case runs, so the
    fork is not on any case's clock. A child gets its case over a pipe; its phase goes to a
    shared page (no message, no wake-up of the worker per phase); its result comes back as
    one JSON line that the worker passes on unparsed; a child that answered and exits is
    reaped later, without waiting for it."""

    def __init__(self, lib, channel_fd):
        self.lib = lib
        self.channel_fd = channel_fd
        self.baseline_rss = memory_baseline("VmRSS:")
        self.spare = None          # (pid, request fd, result fd) of a fresh child for the next case
        self.serving = None        # ... of the child that reached a verdict and waits for the next case
        self.current = None        # ... of the fresh child running a case now
        self.finished = []         # pids of children that answered, to be reaped
        self.phase_board = mmap.mmap(-1, PHASE_BOARD_BYTES)   # MAP_SHARED: children write, we read
        self.word_board = mmap.mmap(-1, 2)                     # the child's word on its last case
        # one log file for every child, truncated per case: O_APPEND makes each child's
        # writes start at the (new) end, so no temp file is created and removed per case
        fd, path = tempfile.mkstemp(prefix="gradgate-child-", suffix=".log")
        os.close(fd)
        self.log_fd = os.open(path, os.O_RDWR | os.O_APPEND)
        os.unlink(path)

    def warm_up(self):
        """Run one small case in the worker itself, so that every child starts warm.

        A child's work never flows back to the worker: without this, each child pays the
        first-use costs (ggml's CPU backend tables, cffi's type parsing, numpy's and our
        own lazy imports), tens of ms, again. The case runs in a child first; only if it
        passes there is it run here, so a ggml that dies even on
        the warm-up cases still gets a worker, and each case its own report. The
        diagnosis of a failure, which no warm-up case reaches, is warmed on made-up numbers."""
        metrics.warm_up_diagnosis()
        for spec in WARM_UP_CASES:
            case = Case(**spec)
            line = protocol.encode(protocol.CASE, case=case.to_dict())
            event, reply = protocol.decode(self.run(line, {"timeout": 60}, prefork=False))
            self._reap_finished(wait=True)
            if event == protocol.RESULT and reply["result"]["status"] == Status.PASSED:
                run_case(case, self.lib)
                self.baseline_rss = memory_baseline("VmRSS:")
                return

    def run(self, line, request, prefork=True):
        """Run one case (its request line) in a child; returns the worker's reply line.

        A child that answers sends the reply line itself (stderr included): the worker
        passes it on without parsing it."""
        if self.serving is not None and not reusable(request):
            self._retire(self.serving)
            self.serving = None
        if self.serving is not None and not request.get("fresh"):
            reply, ran = self._run_in_serving(line, request)
            if reply is not None:
                return reply
            if ran:
                # its result says so (Result.rerun): a case whose outcome depends on what ran
                # before it in a process is worth a look even when the fresh child passes it
                line = protocol.encode(protocol.CASE, **dict(request, rerun=True))
        return self._run_fresh(line, request, prefork)

    def after_case(self):
        """Reap the children that have exited; make sure a spare is ready."""
        self._reap_finished(wait=False)
        if self.spare is None:
            self._fork_spare()

    def close(self):
        for child in (self.serving, self.spare):
            if child is not None:
                self._retire(child)
        self.serving = self.spare = None
        self._reap_finished(wait=True)

    def _run_fresh(self, line, request, prefork):
        for attempt in (1, 2):
            if self.spare is None:
                self._fork_spare()
            child, self.spare = self.spare, None
            if self._send(child, line):
                break
            self._retire(child)      # the spare died before its case (killed from outside): take a new one
        self.current = child
        if prefork:
            self._fork_spare()   # the next fresh child, forked while this one runs
        reply, _, stays, timed_out = self._answer(child, request)
        self.current = None
        if reply is None:
            return self._dead_child_reply(child, timed_out)
        if stays and self.serving is None:
            self.serving = child
        else:
            self._let_go(child)
        return reply

    def _run_in_serving(self, line, request):
        """The case in the child that ran the last one: (its reply if its verdict stands, else
        None: the verdict must come from a fresh child; did the child get the case at all)."""
        child, self.serving = self.serving, None
        if not self._send(child, line):   # it died while it waited (killed from outside)
            self._retire(child)
            return None, False
        reply, stands, stays, timed_out = self._answer(child, request)
        if reply is None:                 # crashed or hung: a fresh child says which, if either
            if timed_out:
                os.kill(child[0], signal.SIGKILL)
            self._retire(child)
            return None, True
        if stays:
            self.serving = child
        else:
            self._let_go(child)
        return (reply if stands else None), True

    def _send(self, child, line):
        """Hand `line` to `child`; False if it is gone."""
        self.phase_board[:PHASE_BOARD_BYTES] = b"startup".ljust(PHASE_BOARD_BYTES, b"\0")
        self.word_board[:2] = NO + NO
        os.ftruncate(self.log_fd, 0)
        try:
            _write_all(child[1], line)
            return True
        except OSError:
            return False

    def _answer(self, child, request):
        """(reply line or None, does its verdict stand, does the child stay, timed_out)."""
        reply, timed_out = self._collect(child[2], request.get("timeout", 60))
        word = bytes(self.word_board[:2])
        return reply, word[:1] == YES, word[1:] == YES, timed_out

    def _dead_child_reply(self, child, timed_out):
        pid = child[0]
        self._close_fds(child)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        phase = bytes(self.phase_board).rstrip(b"\0").decode() or Phase.STARTUP
        stderr = stderr_excerpt(self.log_fd)
        if timed_out:
            return protocol.encode(protocol.TIMEOUT, phase=phase, stderr=stderr)
        # the child's peak includes the pages it shares with us
        crash = Crash.from_wait(phase, stderr, status, usage, self.baseline_rss)
        return protocol.encode(protocol.CRASH, **crash.to_dict())

    def _let_go(self, child):
        """A child that answered and exits (or will, at EOF): reaped later, not waited for."""
        self._close_fds(child)
        self.finished.append(child[0])

    def _retire(self, child):
        """Close its pipes (a child waiting for a case reads EOF and exits) and reap it."""
        self._close_fds(child)
        os.waitpid(child[0], 0)

    @staticmethod
    def _close_fds(child):
        for fd in child[1:]:
            try:
                os.close(fd)
            except OSError:
                pass

    def _reap_finished(self, wait):
        for pid in list(self.finished):
            if os.waitpid(pid, 0 if wait else os.WNOHANG)[0] == pid:
                self.finished.remove(pid)

    def _fork_spare(self):
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(request_w)
            os.close(result_r)
            # only the worker may hold its children's pipes: a copy of a request pipe here
            # would keep that child from seeing EOF when the worker lets it go
            for child in (self.serving, self.spare, self.current):
                if child is not None:
                    self._close_fds(child)
            self._child(request_r, result_w)  # never returns
        os.close(request_r)
        os.close(result_w)
        self.spare = (pid, request_w, result_r)

    def _child(self, request_fd, result_fd):
        code = 0
        try:
            os.close(self.channel_fd)  # only the worker talks to the parent
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            die_with_parent()
            gc.disable()   # a collection would write to (and so copy) pages of every object it visits
            served = 0
            while True:
                line = _read_line(request_fd)
                if not line:  # retired, with or without a case
                    os._exit(0)
                _, request = protocol.decode(line)
                if served == 0:
                    os.dup2(self.log_fd, 1)
                    os.dup2(self.log_fd, 2)
                    if request.get("max_memory"):
                        _apply_memory_cap(request["max_memory"], memory_baseline())
                apply_backtrace_setting(request.get("backtrace"))
                board = self.phase_board

                def phase(name):
                    phase.last = name
                    board[:PHASE_BOARD_BYTES] = name.encode().ljust(PHASE_BOARD_BYTES, b"\0")
                phase.last = Phase.BUILD_FORWARD
                result = _run_guarded(Case.from_dict(request["case"]), self.lib, phase)
                result["stderr_tail"] = result.get("stderr_tail") or stderr_excerpt(self.log_fd)
                result["earlier_in_child"] = served
                result["rerun"] = bool(request.get("rerun"))
                served += 1
                stays = self._stays(result, request, served)
                stands = result["status"] == Status.PASSED or served == 1
                self.word_board[:2] = (YES if stands else NO) + (YES if stays else NO)   # before the reply
                _write_all(result_fd, protocol.encode(protocol.RESULT, result=result))
                if not stays:
                    break
        except BaseException:
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)

    def _stays(self, result, request, served):
        return (result["status"] != Status.ERROR and reusable(request) and served < MAX_CASES_PER_CHILD
                and memory_baseline("VmRSS:") <= self.baseline_rss + MAX_CHILD_GROWTH)

    @staticmethod
    def _collect(result_fd, timeout):
        """(reply line, timed_out): the child's reply line, or None once it closed the pipe
        without one (it died) or the deadline passed."""
        deadline = time.monotonic() + timeout
        chunks = []   # a failed case's reply carries every value: it can be megabytes
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            ready, _, _ = select.select([result_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(result_fd, 1 << 20)
            if not chunk:
                return None, False
            chunks.append(chunk)
            if chunk.endswith(b"\n"):   # json.dumps escapes newlines: this is the end
                return b"".join(chunks), False


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _read_line(fd):
    buffer = b""
    while not buffer.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        buffer += chunk
    return buffer


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    library = argv[0]
    _bind_to_parent()
    # before the library loads (a broken build can kill the worker in dlopen); the children
    # it forks inherit it. The Runner's backtrace setting, as Worker put it in our environment
    allow_core_dumps("GGML_NO_BACKTRACE" not in os.environ)
    channel_fd = os.dup(1)
    # keep fd 1 away from the protocol channel: ggml prints to stdout sometimes
    os.dup2(2, 1)

    def send(event, **fields):
        _write_all(channel_fd, protocol.encode(event, **fields))

    # a truncated or foreign library can kill the process inside dlopen (SIGBUS, SIGSEGV):
    # saying so first lets the parent tell a broken build from a broken case
    send(protocol.PHASE, name=Phase.LOAD_LIBRARY)
    try:
        lib = binding.load(library)
    except Exception as exc:
        send(protocol.FATAL, reason=f"{type(exc).__name__}: {exc}")
        return 3
    forking = ForkingRunner(lib, channel_fd) if protocol.fork_available() else None
    if forking is not None:
        forking.warm_up()
    capped = False
    # objects that exist now live as long as the worker: keep the collector off them, so
    # that forked children do not copy the pages it would touch
    gc.collect()
    gc.freeze()
    if forking is not None:
        forking.after_case()   # the first spare
    send(protocol.READY, ggml_version=binding.ggml_version(lib), rss=memory_baseline("VmRSS:"))
    for line in sys.stdin.buffer:
        _, request = protocol.decode(line)
        if request.get("isolate", "case") in FORKED_MODES and forking is not None:
            _write_all(channel_fd, forking.run(line, request))
            forking.after_case()   # while the parent reads the reply
            continue
        # isolate=worker (or no fork): the case runs here; if it kills us, the parent reports it
        apply_backtrace_setting(request.get("backtrace"))
        if not capped:  # the cap is for the worker's life; the baseline is its size before any case
            _apply_memory_cap(request.get("max_memory") or 0, memory_baseline())
            capped = True

        def phase(name):
            phase.last = name
            send(protocol.PHASE, name=name)
        phase.last = Phase.BUILD_FORWARD
        send(protocol.RESULT, result=_run_guarded(Case.from_dict(request["case"]), lib, phase))
    if forking is not None:
        forking.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
