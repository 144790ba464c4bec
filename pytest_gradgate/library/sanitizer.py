"""The runtime side of a sanitizer build (--gradgate-sanitize): the sanitizer's shared runtime,
found once when the build is made, and the environment a worker that loads the build needs.

Python itself is not instrumented. ASan must be the first library in the process (it
intercepts malloc before anything else calls it), so a worker that dlopens a build made with
-fsanitize=address without the runtime preloaded dies at once with "ASan runtime does not come
first". The worker gets the runtime in LD_PRELOAD, read from the build's own build-info: any
Runner on such a build (the gate's, explore's, parity's, a test's) starts its workers right.
"""

import json
import os
import subprocess
from pathlib import Path

from pytest_gradgate.errors import BuildError
from pytest_gradgate.library.options import BUILD_INFO

RUNTIME_LIBRARY = {"address": "libasan.so", "undefined": "libubsan.so"}

# every frame of a report with its module in braces: isolation/sanitizer_report.py names the
# first frame that is in the built library (and not our shim) from it
STACK_FRAME_FORMAT = "    #%n %p %F %L {%m}"
_COMMON = f'disable_coredump=1:stack_trace_format="{STACK_FRAME_FORMAT}"'
# CPython leaks by design (interned objects, caches freed at exit or never): leak reports
# would bury ggml's. abort_on_error: the report ends the case's process with SIGABRT, a crash
# of the case, at once. The sanitizer prints to stderr, which the worker captures per case.
RUNTIME_OPTIONS = {
    "address": ("ASAN_OPTIONS", f"detect_leaks=0:abort_on_error=1:print_legend=0:{_COMMON}"),
    "undefined": ("UBSAN_OPTIONS", f"print_stacktrace=1:halt_on_error=1:abort_on_error=1:{_COMMON}"),
}


def runtime_library(sanitize):
    """The absolute path of the compiler's shared runtime of `sanitize`, as the compiler that
    builds ggml ($CC, as CMake takes it, else cc) knows it; BuildError if it has none."""
    name = RUNTIME_LIBRARY[sanitize]
    compiler = os.environ.get("CC", "cc")
    try:
        found = subprocess.run([compiler, f"-print-file-name={name}"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"--gradgate-sanitize {sanitize}: cannot ask the C compiler {compiler} where {name} "
                         f"is ({exc})") from None
    # a compiler that does not know the file prints its name back unchanged
    if not os.path.isabs(found) or not os.path.isfile(found):
        raise BuildError(f"--gradgate-sanitize {sanitize}: the C compiler {compiler} has no shared {name} "
                         f"(`{compiler} -print-file-name={name}` found none); install the compiler's sanitizer "
                         "runtime (GCC: libasan / libubsan packages), or set CC to a GCC that has it")
    return found


def build_sanitizer(library):
    """(sanitize, runtime path) of the build that `library` belongs to, from its build-info;
    ("", None) for a plain build, or a library outside a published build."""
    try:
        info = json.loads((Path(library).parent / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return "", None
    if not isinstance(info, dict) or not isinstance(info.get("options"), dict):
        return "", None
    sanitize = info["options"].get("sanitize") or ""
    return sanitize, (info.get("sanitizer_runtime") if sanitize else None)


def worker_env(library, env):
    """`env` (a worker's environment) with what loading `library` needs: nothing for a plain
    build; the runtime preloaded and the sanitizer's options for a sanitizer build. The user's
    own *SAN_OPTIONS come after ours, so theirs win where they set the same option."""
    sanitize, runtime = build_sanitizer(library)
    if not sanitize:
        return env
    env = dict(env)
    if runtime:
        env["LD_PRELOAD"] = " ".join(p for p in (runtime, env.get("LD_PRELOAD")) if p)
    var, ours = RUNTIME_OPTIONS[sanitize]
    env[var] = ":".join(p for p in (ours, env.get(var)) if p)
    return env
