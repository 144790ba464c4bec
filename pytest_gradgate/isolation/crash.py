"""The crash record: what is known of a case whose process died, built in one place.

The worker builds it for a forked child that died (isolate=case|fresh); the parent builds it for a
worker that died itself (isolate=worker). Both call `Crash.from_wait`, and `explain` turns a
record into the diagnosis the reports show. ggml's stderr is read for ggml's own words (its
abort line, its "no backward" message); what we say is typed (Diagnosis), never parsed back.
"""

import os
import re
import signal
from dataclasses import asdict, dataclass

from pytest_gradgate.check.outcome import Diagnosis, Phase
from pytest_gradgate.isolation import sanitizer_report

STDERR_TAIL = 4000

_NO_BACKWARD = [
    (re.compile(r"unsupported ggml op for backward pass: (\w+)"), "{}"),
    (re.compile(r"unsupported (?:unary|glu) op for backward pass: (\w+)"), "{}"),
    (re.compile(r"backward pass for (\w+(?: \w+)?) not implemented"), "{}"),
    (re.compile(r"(\w+) backward pass not implemented"), "{}"),
    # an assert, not a message: GGML_ASSERT(src1 && "backward pass only implemented for split swiglu")
    (re.compile(r"backward pass only implemented for split (\w+)"), "fused {}"),
]
_GGML_MESSAGE = re.compile(r"^(\S+:\d+: .*)$", re.M)
# C's assert() (live in Debug builds): "prog: file.cpp:2777: void f(...): Assertion `x' failed."
_C_ASSERT = re.compile(r"^\S+: (\S+:\d+: .*Assertion .* failed\.?)$", re.M)


@dataclass
class Crash:
    phase: str                 # the last phase the case reported
    stderr: str                # an excerpt of what it printed (stderr_excerpt)
    signal: str = None         # SIGSEGV, SIGABRT, ... when a signal killed it
    exitcode: int = None       # else its exit code
    grew_by: int = 0           # bytes its peak resident size grew beyond the worker's

    @classmethod
    def from_wait(cls, phase, stderr, status, usage, baseline_rss):
        """From os.wait4's status and rusage (ru_maxrss is KiB on Linux)."""
        crash = cls(str(phase), stderr, grew_by=max(0, usage.ru_maxrss * 1024 - baseline_rss) if usage else 0)
        if os.WIFSIGNALED(status):
            crash.signal = signal.Signals(os.WTERMSIG(status)).name
        else:
            crash.exitcode = os.WEXITSTATUS(status)
        return crash

    @property
    def how(self):
        return self.signal or f"exit code {self.exitcode}"

    def to_dict(self):
        return asdict(self)


# how much of a long stderr is searched for a sanitizer's report: its reports come last, and a
# case that printed more before one is not worth a bigger read
REPORT_SEARCH = 4 << 20


def stderr_excerpt(fd, start=0, limit=STDERR_TAIL):
    """What was written to the file behind fd from offset `start`: all of it if short, else
    its head and its tail. The head keeps ggml's own message (it prints it before a
    backtrace, which can be long); the tail keeps how it ended. A sanitizer's report is kept
    from its start instead: its error and first frames are what says what happened, and the
    stack of Python's frames after them can outrun the head."""
    size = os.fstat(fd).st_size
    if size - start <= limit:
        return os.pread(fd, size - start, start).decode(errors="replace")
    report = _report_excerpt(fd, start, size, limit)
    if report:
        return report
    head = os.pread(fd, limit // 4, start).decode(errors="replace")
    tail_len = limit - limit // 4
    tail = os.pread(fd, tail_len, size - tail_len).decode(errors="replace")
    return f"{head}\n[... {size - start - limit} bytes left out ...]\n{tail}"


def _report_excerpt(fd, start, size, limit):
    """The excerpt of a long stderr that holds a sanitizer's report, from the report's start; ""
    if there is none."""
    read = min(size - start, REPORT_SEARCH)
    text = os.pread(fd, read, size - read).decode(errors="replace")
    at = sanitizer_report.report_start(text)
    if at < 0:
        return ""
    before = size - read + at - start
    after = len(text) - at - limit
    return ((f"[... {before} bytes before the sanitizer's report left out ...]\n" if before else "")
            + text[at:at + limit] + (f"\n[... {after} bytes left out ...]" if after > 0 else ""))


def ggml_message(stderr):
    """ggml's own abort line (`ggml.c:6662: GGML_ASSERT(...) failed`), or a failed C assert();
    never a line of a sanitizer's report (UBSan's "file:line:col: runtime error" reads like one)."""
    text = stderr or ""
    at = sanitizer_report.report_start(text)
    text = text[:at] if at >= 0 else text
    found = _GGML_MESSAGE.findall(text) or _C_ASSERT.findall(text)
    return found[-1].strip() if found else ""


def death_message(stderr):
    """What the dead case's own process said of its death: the sanitizer's report (its error and
    the first frame in ggml) if there is one, else ggml's abort line; "" if neither."""
    report = sanitizer_report.parse(stderr)
    return report.text() if report else ggml_message(stderr)


def explain(phase, stderr):
    """(Diagnosis kind, text): what a dead case's phase and stderr say about why it died."""
    report = sanitizer_report.parse(stderr)
    if report:
        # ahead of ggml's words: a report ends the process before ggml gets to any
        return Diagnosis.SANITIZER, report.text()
    if phase == Phase.BUILD_BACKWARD:
        for pattern, what in _NO_BACKWARD:
            m = pattern.search(stderr or "")
            if m:
                return Diagnosis.NO_BACKWARD, f"no backward for {what.format(m.group(1).upper())} in this ggml"
    msg = ggml_message(stderr)
    if msg:
        return Diagnosis.GGML_ABORT, f"ggml aborted in phase {phase}: {msg}"
    return Diagnosis.DIED, f"died in phase {phase}"
