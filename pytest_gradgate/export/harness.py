"""Run exported cases in ggml's own harness: build test-backend-ops with them, run its grad mode.

The reviewer of a fix upstream asks for the regression test in tests/test-backend-ops.cpp and for
proof that it fails without the fix. `gradgate export ... --run` does both steps that docs/export.md
describes by hand, on the tree under test:

- the harness's source is the tree's own tests/test-backend-ops.cpp: at the ggml root (a ggml
  checkout, the default ggml), or at the llama.cpp root above a llama.cpp checkout's ggml/ (where
  llama.cpp keeps it, and where its CMake links it to libllama, which it does not use);
- the cases are pasted at the anchors the export names, in a copy: the user's tree is never
  written;
- a small CMake project of ours builds ggml (add_subdirectory of a copy of the ggml root) and the
  harness against it, in either layout alike;
- `test-backend-ops grad -o OP -b CPU` runs, and each exported case's verdict is read from the
  lines that carry its `gradgate=<id>` vars;
- with a change to revert (verify.py's REF|PATCH), the change is then reverted in the same copy,
  the build is redone (only the files the change touches compile again), and the cases run
  again: the verdict with the change and without it.
"""

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_gradgate.errors import BuildError, UsageError
from pytest_gradgate.export.test_backend_ops import REGISTER_ANCHOR, REGISTER_MARK, STRUCT_ANCHOR

HARNESS = Path("tests") / "test-backend-ops.cpp"
BINARY = "test-backend-ops"
# ours: ggml from a copy of the tree's ggml root, the harness from its (patched) source
CMAKE_PROJECT = """\
cmake_minimum_required(VERSION 3.14)
project(gradgate_test_backend_ops C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
add_subdirectory(ggml ggml-build)
add_executable(test-backend-ops test-backend-ops.cpp)
target_link_libraries(test-backend-ops PRIVATE ggml)
"""
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF")
RUN_TIMEOUT_S = 600


def harness_source(ggml_root):
    """The tree's tests/test-backend-ops.cpp: at the ggml root, or at the llama.cpp root above it."""
    ggml_root = Path(ggml_root)
    for root in (ggml_root, ggml_root.parent):
        if (root / HARNESS).is_file():
            return root / HARNESS
    raise UsageError(f"{ggml_root}: no {HARNESS} in it or in the llama.cpp checkout above it: test-backend-ops "
                     "can only be built from a tree that keeps ggml's or llama.cpp's tests/ folder")


def pasted(harness_text, exports, where):
    """The harness's source with each export (gradgate export's text) pasted at its anchors."""
    for anchor in (STRUCT_ANCHOR, REGISTER_ANCHOR):
        if harness_text.count(anchor) != 1:
            raise UsageError(f"{where}: the line {anchor.splitlines()[-1].strip()!r} is not there once, where the "
                             "export's test_case goes; this test-backend-ops.cpp is not one the export knows")
    for text in exports:
        struct, register = text.split(REGISTER_MARK + "\n")
        harness_text = harness_text.replace(STRUCT_ANCHOR, struct + "\n" + STRUCT_ANCHOR)
        harness_text = harness_text.replace(REGISTER_ANCHOR, REGISTER_ANCHOR + register)
    return harness_text


def prepare(ggml_root, exports, dest):
    """dest/: our CMake project, a copy of the ggml root (what a build needs) and the harness
    with the exports pasted in, brought up to date in place (sync()), so that a kept dest/build
    recompiles only what changed. -> dest/ggml, the copy (a change is reverted there)."""
    import tempfile
    from pytest_gradgate.library.source import copy_tree
    source = harness_source(ggml_root)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    harness_text = pasted(source.read_text(errors="replace"), exports, source)
    with tempfile.TemporaryDirectory(prefix="staging-", dir=dest) as staging:
        sync(copy_tree(ggml_root, Path(staging) / "ggml"), dest / "ggml")
    _write_if_changed(dest / "CMakeLists.txt", CMAKE_PROJECT.encode())
    _write_if_changed(dest / "test-backend-ops.cpp", harness_text.encode())
    return dest / "ggml"


def sync(src, dst):
    """Make dst hold exactly src's files. A file whose bytes did not change keeps its time stamp;
    one that did is written anew, so it is newer than any object built from it before. (A copy
    that kept the source's own times could leave a changed file older than its object, and the
    build would keep the stale object: a change reverted last run would still be reverted.)"""
    src, dst = Path(src), Path(dst)
    wanted = set()
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        wanted.add(rel)
        if path.is_dir() and not path.is_symlink():
            (dst / rel).mkdir(parents=True, exist_ok=True)
        else:
            _write_if_changed(dst / rel, path.read_bytes())
    for path in sorted(dst.rglob("*"), reverse=True):
        if path.relative_to(dst) not in wanted:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _write_if_changed(path, data):
    path = Path(path)
    if path.is_symlink() or path.is_dir():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    elif path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def build(dest, progress=None):
    """Configure (once) and build test-backend-ops in dest/build; -> the binary's path."""
    from pytest_gradgate.library.cmake import build_tool_args, require_cmake, run_logged
    require_cmake()
    work = Path(dest) / "build"
    log_path = Path(dest) / "build.log"
    with open(log_path, "ab") as log:
        if not (work / "CMakeCache.txt").is_file():
            cmd = ["cmake", "-S", str(dest), "-B", str(work)] + build_tool_args() + list(CMAKE_ARGS)
            if run_logged(cmd, log, progress, "configuring test-backend-ops", None) != 0:
                raise _failed("configure", log_path)
        cmd = ["cmake", "--build", str(work), "--target", BINARY, "--parallel", str(os.cpu_count() or 2)]
        if run_logged(cmd, log, progress, "building test-backend-ops", None) != 0:
            raise _failed("build", log_path)
    built = next((p for p in work.rglob(BINARY) if p.is_file() and os.access(p, os.X_OK)), None)
    if built is None:
        raise _failed("build (no test-backend-ops produced)", log_path)
    return built


def _failed(step, log_path):
    text = Path(log_path).read_text(errors="replace")
    first = re.search(r"^\S.*?:\d+:\d+: (?:fatal )?error: .*$", text, re.M)
    return BuildError(f"test-backend-ops {step} failed" + (f": {first.group(0)}" if first else "")
                      + f"; the log is {log_path}\n" + "\n".join(text.splitlines()[-15:]))


@dataclass
class Verdict:
    """One exported case as the harness reported it."""
    case_id: str
    status: str          # ok, fail, not-run (no line of it), died (the run ended inside it)
    detail: str = ""     # the harness's words: the failed comparison, the abort

    def text(self):
        return {"ok": "OK", "fail": "FAIL", "not-run": "NOT RUN", "died": "DIED"}[self.status] + \
            (f" ({self.detail})" if self.detail else "")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(binary, op_names, case_ids, timeout=RUN_TIMEOUT_S):
    """`test-backend-ops grad -b CPU -o OP` for each op; -> ({case_id: Verdict}, seconds)."""
    started = time.monotonic()
    out = {}
    for op in dict.fromkeys(op_names):
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        try:
            proc = subprocess.run([str(binary), "grad", "-b", "CPU", "-o", op], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, timeout=timeout)
            text, err, died = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), \
                proc.returncode < 0 or proc.returncode > 1
        except subprocess.TimeoutExpired as exc:
            text, err, died = (exc.stdout or b"").decode(errors="replace"), "", True
        out.update(verdicts(text, err, [c for c in case_ids if c not in out], died))
    return out, time.monotonic() - started


def verdicts(stdout, stderr, case_ids, died):
    """Each case's verdict from the harness's output: a case prints its first line when it starts
    (`  OP(gradgate=ID): ...`), detail lines on a failure, and a last line with the same vars that
    ends in OK or FAIL."""
    lines = [_ANSI.sub("", line).rstrip() for line in stdout.splitlines()]
    found = {}
    for case_id in case_ids:
        tag = f"(gradgate={case_id}): "
        mine = [i for i, line in enumerate(lines) if tag in line]
        if not mine:
            found[case_id] = Verdict(case_id, "not-run", "no line of it in the output: is its op's backward "
                                                         "missing here, or was it not selected by -o?")
            continue
        first, last = mine[0], mine[-1]
        body = lines[first:last + 1]
        ending = lines[last].split(tag, 1)[1]
        failures = [line.strip() for line in body if re.search(r"\] MAA = |nonfinite gradient|compare failed", line)]
        if len(mine) == 1 and not ending.endswith(("OK", "FAIL")) and died:
            abort = next((line.strip() for line in stderr.splitlines() if "GGML_ASSERT" in line or "GGML_ABORT" in line),
                         stderr.strip().splitlines()[-1] if stderr.strip() else "")
            found[case_id] = Verdict(case_id, "died", abort)
        elif ending.endswith("FAIL") or failures:
            said = next((f for f in failures if "MAA" in f), failures[0] if failures else ending)
            said = said.split(tag, 1)[-1].replace(" FAIL", "").strip()      # the words, not the case's name again
            found[case_id] = Verdict(case_id, "fail", said)
        else:
            found[case_id] = Verdict(case_id, "ok")
    return found
