"""The parent side of isolation: send cases to a worker, turn any death into a Result.

A crash, a timeout, a worker that will not start: each becomes an ordinary Result with
status crashed/timeout/error, the phase, the signal and ggml's message, so pytest reports
it like any failure. Dead workers are replaced. A run whose workers keep dying before any
case gets going (the library cannot load, say) is stopped by the caller via CrashCap.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

from .engine import run_case
from .result import Result, explain_crash, ggml_message

ISOLATE_MODES = ("case", "worker", "none")


class WorkerStartError(Exception):
    pass


def default_timeout(case):
    """Seconds a case may take: generous for its size, so only a hang hits it."""
    if case.timeout:
        return case.timeout
    if case.mode == "fast":
        return 120.0
    forwards = case.n_param_elements() * (4 if case.stencil == 4 else 2)
    return 30.0 + forwards * 0.005


class Worker:
    """One worker process (library loaded once) and its stderr file."""

    def __init__(self, library, env=None):
        self.stderr_file = tempfile.NamedTemporaryFile(prefix="gradgate-worker-", suffix=".log", delete=False)
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("GGML_NO_BACKTRACE", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_gradgate.worker", str(library)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file,
            env=child_env, bufsize=0)
        self._buffer = b""
        hello = self._read_message(timeout=120)
        if hello is None or "ready" not in hello:
            reason = (hello or {}).get("fatal") or self.stderr_tail() or "worker exited during start-up"
            self.close()
            raise WorkerStartError(reason)
        self.ggml_version = hello["ready"]

    def stderr_tail(self, limit=4000):
        try:
            with open(self.stderr_file.name, "rb") as handle:
                data = handle.read()
            return data[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def _read_message(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def alive(self):
        return self.proc.poll() is None

    def request(self, payload, timeout):
        """Send one case; returns (reply or None if the worker died, last phase, timed_out)."""
        self.proc.stdin.write((json.dumps(payload) + "\n").encode())
        self.proc.stdin.flush()
        phase = "startup"
        deadline = time.monotonic() + timeout + 10  # the worker enforces the timeout on forked children
        while True:
            try:
                msg = self._read_message(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                return None, phase, True
            if msg is None:
                return None, phase, False
            if "phase" in msg:
                phase = msg["phase"]
                continue
            return msg, phase, False

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr_file.close()
        try:
            os.unlink(self.stderr_file.name)
        except OSError:
            pass


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

    def close(self):
        if self.worker:
            self.worker.close()
            self.worker = None

    def _ensure_worker(self):
        if self.worker is None or not self.worker.alive():
            if self.worker:
                self.worker.close()
            self.worker = Worker(self.library)
        return self.worker

    def run(self, case):
        timeout = self.timeout or default_timeout(case)
        started = time.perf_counter()
        if self.isolate == "none":
            from . import binding
            self.lib = self.lib or binding.load(self.library)
            return run_case(case, self.lib)
        # a CUDA context must never exist in a process that forks: run such cases in the worker itself
        isolate = "worker" if case.backend != "cpu" else self.isolate
        try:
            worker = self._ensure_worker()
        except WorkerStartError as exc:
            result = Result.for_case(case)
            result.signal = None
            result.stderr_tail = str(exc)
            return result.finish("error", "startup", message=f"the worker could not start: {exc}", started=started)
        payload = {"case": case.to_dict(), "isolate": isolate, "timeout": timeout,
                   "max_memory": self.max_memory, "backtrace": self.backtrace}
        reply, phase, timed_out = worker.request(payload, timeout)
        if reply is None:  # the worker itself died or hung (isolate=worker, or a bug of ours)
            if timed_out:
                worker.proc.kill()
                reply = {"timeout": {"phase": phase, "stderr": worker.stderr_tail()}}
            else:
                worker.proc.wait()
                code = worker.proc.returncode
                crash = {"phase": phase, "stderr": worker.stderr_tail()}
                if code < 0:
                    crash["signal"] = signal.Signals(-code).name
                else:
                    crash["exitcode"] = code
                reply = {"crash": crash}
            worker.close()
            self.worker = None
        return self._to_result(case, reply, timeout, started)

    def _to_result(self, case, reply, timeout, started):
        if "result" in reply:
            return Result.from_dict(reply["result"])
        result = Result.for_case(case)
        if "timeout" in reply:
            info = reply["timeout"]
            result.stderr_tail = info.get("stderr", "")
            return result.finish("timeout", info["phase"], started=started,
                                 message=f"timed out after {timeout:.0f} s in phase {info['phase']} "
                                         "(raise --gradgate-timeout if the case is just slow)")
        crash = reply["crash"]
        result.signal = crash.get("signal")
        result.stderr_tail = crash.get("stderr", "")
        explanation, no_backward = explain_crash(crash["phase"], result.stderr_tail)
        how = crash.get("signal") or f"exit code {crash.get('exitcode')}"
        result.diagnosis = explanation
        result.no_backward = no_backward
        ggml_msg = ggml_message(result.stderr_tail)
        result.message = f"crashed ({how}) in phase {crash['phase']}" + (f": {ggml_msg}" if ggml_msg else "")
        return result.finish("crashed", crash["phase"], started=started)
