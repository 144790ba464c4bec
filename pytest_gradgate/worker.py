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


def _tail(path, limit=STDERR_TAIL):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


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


def _apply_limits(request):
    if not request.get("backtrace"):
        os.environ["GGML_NO_BACKTRACE"] = "1"
    max_memory = request.get("max_memory") or 0
    if max_memory:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))


def run_forked(case, lib, request):
    """Fork a child for one case; returns the worker's final reply."""
    out_fd, out_path = tempfile.mkstemp(prefix="gradgate-child-", suffix=".log")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_end)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            _apply_limits(request)
            pipe = os.fdopen(write_end, "w", buffering=1)

            def phase(name):
                phase.last = name
                pipe.write(json.dumps({"phase": name}) + "\n")
                pipe.flush()
            phase.last = "build-forward"
            result = _run_guarded(case, lib, phase)
            pipe.write(json.dumps({"result": result}) + "\n")
            pipe.flush()
        finally:
            os._exit(0)
    os.close(write_end)
    os.close(out_fd)
    deadline = time.monotonic() + request.get("timeout", 60)
    phase, reply, buffer = "startup", None, b""
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([read_end], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            msg = json.loads(line)
            if "phase" in msg:
                phase = msg["phase"]
            else:
                reply = msg
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(read_end)
    stderr = _tail(out_path)
    os.unlink(out_path)
    if timed_out:
        return {"timeout": {"phase": phase, "stderr": stderr}}
    if reply is not None:
        reply["result"]["stderr_tail"] = reply["result"].get("stderr_tail") or stderr
        return reply
    crash = {"phase": phase, "stderr": stderr}
    if os.WIFSIGNALED(status):
        crash["signal"] = signal.Signals(os.WTERMSIG(status)).name
    else:
        crash["exitcode"] = os.WEXITSTATUS(status)
    return {"crash": crash}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    library = argv[0]
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    # keep fd 1 away from the protocol channel: ggml prints to stdout sometimes
    os.dup2(2, 1)
    try:
        lib = binding.load(library)
    except Exception as exc:
        channel.write(json.dumps({"fatal": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 3
    channel.write(json.dumps({"ready": binding.ggml_version(lib)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        case = Case.from_dict(request["case"])
        if request.get("isolate", "case") == "case":
            reply = run_forked(case, lib, request)
        else:
            _apply_limits(request)

            def phase(name):
                phase.last = name
                channel.write(json.dumps({"phase": name}) + "\n")
            phase.last = "build-forward"
            reply = {"result": _run_guarded(case, lib, phase)}
        channel.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
