"""The worker process: loads the library once, then runs cases it is sent.

Protocol (one JSON object per line): the parent writes {"case": ..., "isolate": "case" |
"worker", "timeout": s, "max_memory": bytes, "backtrace": bool}. The worker answers with
any number of {"phase": name} lines and one final line: {"result": {...}} or
{"crash": {"signal": ..., "exitcode": ..., "phase": ..., "stderr": ...}} or
{"timeout": {"phase": ...}}.

isolate=case: the worker forks one child per case (library already loaded, so a case
costs a fork, not an interpreter start). The child's stdout/stderr go to a file, so
ggml's abort message is captured; its phases reach the worker through a pipe.
isolate=worker: the worker runs the case itself; if it dies the parent sees EOF and
reports the crash from the phases it was sent and the worker's stderr file.
"""

import ctypes
import gc
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback

from . import binding
from .case import Case
from .engine import run_case
from .result import Result

STDERR_TAIL = 4000
# what a worker runs before its first fork: every phase, a non-contiguous consumer, two params
WARM_UP_CASE = dict(name="warm-up", graph="mul(a, b)", params={"a": [4, 3], "b": [4, 3]}, consumer="transpose")
PR_SET_PDEATHSIG = 1


def stderr_excerpt(fd, start=0, limit=STDERR_TAIL):
    """What was written to the file behind fd from offset `start`: all of it if short, else
    its head and its tail. The head keeps ggml's own message (it prints it before a
    backtrace, which can be long); the tail keeps how it ended."""
    size = os.fstat(fd).st_size
    if size - start <= limit:
        return os.pread(fd, size - start, start).decode(errors="replace")
    head = os.pread(fd, limit // 4, start).decode(errors="replace")
    tail_len = limit - limit // 4
    tail = os.pread(fd, tail_len, size - tail_len).decode(errors="replace")
    return f"{head}\n[... {size - start - limit} bytes left out ...]\n{tail}"


def _run_guarded(case, lib, phase):
    """Run the engine; a Python exception is an 'error' result, not a crash."""
    try:
        return run_case(case, lib, phase).to_dict()
    except Exception as exc:
        result = Result.for_case(case)
        result.finish("error", getattr(phase, "last", "build-forward"),
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
    # and it can hang CI; only let it through when the user asked for backtraces
    if backtrace:
        os.environ.pop("GGML_NO_BACKTRACE", None)
    else:
        os.environ["GGML_NO_BACKTRACE"] = "1"


def _apply_memory_cap(max_memory, baseline):
    if max_memory:
        import resource
        limit = baseline + max_memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent():
    """Linux: the child gets SIGKILL if its worker dies, so no hung child outlives a killed worker."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class ForkingRunner:
    """Runs each case in a forked child of this (warm) worker."""

    def __init__(self, lib, channel_fd):
        self.lib = lib
        self.channel_fd = channel_fd
        self.baseline = memory_baseline()
        self.baseline_rss = memory_baseline("VmRSS:")
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
        passes there is it run here, so a ggml that dies even on WARM_UP_CASE still gets
        a worker, and each case its own report."""
        case = Case(**WARM_UP_CASE)
        reply = self.run(case, {"timeout": 60})
        if reply.get("result", {}).get("status") == "passed":
            run_case(case, self.lib)

    def run(self, case, request):
        """Fork a child for one case; returns the worker's final reply."""
        os.ftruncate(self.log_fd, 0)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            self._child(case, request, read_end, write_end)  # never returns
        os.close(write_end)
        try:
            phase, reply, timed_out = self._collect(read_end, request.get("timeout", 60))
        finally:
            os.close(read_end)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        stderr = stderr_excerpt(self.log_fd)
        if timed_out:
            return {"timeout": {"phase": phase, "stderr": stderr}}
        if reply is not None:
            reply["result"]["stderr_tail"] = reply["result"].get("stderr_tail") or stderr
            return reply
        # ru_maxrss is in KiB on Linux; the child's peak includes the pages it shares with us
        crash = {"phase": phase, "stderr": stderr,
                 "grew_by": max(0, usage.ru_maxrss * 1024 - self.baseline_rss)}
        if os.WIFSIGNALED(status):
            crash["signal"] = signal.Signals(os.WTERMSIG(status)).name
        else:
            crash["exitcode"] = os.WEXITSTATUS(status)
        return {"crash": crash}

    def _child(self, case, request, read_end, write_end):
        code = 0
        try:
            os.close(read_end)
            os.close(self.channel_fd)  # only the worker talks to the parent
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(self.log_fd, 1)
            os.dup2(self.log_fd, 2)
            _die_with_parent()
            apply_backtrace_setting(request.get("backtrace"))
            _apply_memory_cap(request.get("max_memory") or 0, self.baseline)

            def phase(name):
                phase.last = name
                os.write(write_end, b'{"phase": "%s"}\n' % name.encode())
            phase.last = "build-forward"
            result = _run_guarded(case, self.lib, phase)
            data = (json.dumps({"result": result}) + "\n").encode()
            while data:
                data = data[os.write(write_end, data):]
        except BaseException:
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)

    @staticmethod
    def _collect(read_end, timeout):
        """Read the child's phases and reply until EOF or the deadline."""
        deadline = time.monotonic() + timeout
        phase, reply, buffer = "startup", None, b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return phase, reply, True
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                return phase, reply, False
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if "phase" in msg:
                    phase = msg["phase"]
                else:
                    reply = msg


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    library = argv[0]
    channel_fd = os.dup(1)
    channel = os.fdopen(channel_fd, "w", buffering=1)
    # keep fd 1 away from the protocol channel: ggml prints to stdout sometimes
    os.dup2(2, 1)
    # a truncated or foreign library can kill the process inside dlopen (SIGBUS, SIGSEGV):
    # saying so first lets the parent tell a broken build from a broken case
    channel.write(json.dumps({"phase": "load-library"}) + "\n")
    try:
        lib = binding.load(library)
    except Exception as exc:
        channel.write(json.dumps({"fatal": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 3
    forking = ForkingRunner(lib, channel_fd) if hasattr(os, "fork") else None
    if forking is not None:
        forking.warm_up()
    capped = False
    # objects that exist now live as long as the worker: keep the collector off them, so
    # that forked children do not copy the pages it would touch
    gc.collect()
    gc.freeze()
    channel.write(json.dumps({"ready": binding.ggml_version(lib), "rss": memory_baseline("VmRSS:")}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        case = Case.from_dict(request["case"])
        if request.get("isolate", "case") == "case" and forking is not None:
            reply = forking.run(case, request)
        else:
            apply_backtrace_setting(request.get("backtrace"))
            if not capped:  # the cap is for the worker's life; the baseline is its size before any case
                _apply_memory_cap(request.get("max_memory") or 0, memory_baseline())
                capped = True

            def phase(name):
                phase.last = name
                channel.write(json.dumps({"phase": name}) + "\n")
            phase.last = "build-forward"
            reply = {"result": _run_guarded(case, lib, phase)}
        channel.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
