"""What the worker and its children ask of the kernel about themselves: to die with their
parent, and not to dump core when a case crashes. Linux's prctl where there is one; the
rest of POSIX gets what RLIMIT_CORE gives.
"""

import ctypes
import signal

PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def _find_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):  # not Linux (Windows: no CDLL(None))
        return None


PRCTL = _find_prctl()   # looked up once, in the worker, not in every child
# what this process was before the first case asked for no core dumps: given back when a
# run asks for backtraces
_ORIGINAL = {}


def die_with_parent():
    """Linux: this process gets SIGKILL when its parent dies: a case's child when its worker
    dies, the worker when pytest dies, so no spinning case outlives a killed pytest."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def allow_core_dumps(allowed):
    """No core dump for a case that crashes, unless the run asks for backtraces.

    A crash is an expected outcome here, one of hundreds a run can have (263 of the built-in
    suite's cases crash on the default ggml: 189 known failures, 74 ops without a backward).
    Where a developer has `ulimit -c unlimited`, the kernel writes each crashed child's
    memory, tens of MB, to a core file in the working directory, or pipes it to
    systemd-coredump or apport: on a 2-core machine that took the built-in suite from 11 s
    to 22 s, and left a core file behind (bench/bench_crashes.py). Not dumpable stops the
    dump before the kernel looks at core_pattern; RLIMIT_CORE alone would not stop a piped
    one. Backtraces keep the user's setting: ggml's attaches gdb, which a process that is
    not dumpable refuses to anyone without CAP_SYS_PTRACE."""
    try:
        import resource
    except ImportError:     # Windows: no fork, no core dumps of this kind
        return
    if "limit" not in _ORIGINAL:
        _ORIGINAL["limit"] = resource.getrlimit(resource.RLIMIT_CORE)
        _ORIGINAL["dumpable"] = PRCTL(PR_GET_DUMPABLE, 0, 0, 0, 0) if PRCTL is not None else None
    soft, hard = _ORIGINAL["limit"]
    resource.setrlimit(resource.RLIMIT_CORE, (soft if allowed else 0, hard))
    if PRCTL is not None and _ORIGINAL["dumpable"] is not None and _ORIGINAL["dumpable"] >= 0:
        PRCTL(PR_SET_DUMPABLE, _ORIGINAL["dumpable"] if allowed else 0, 0, 0, 0)
