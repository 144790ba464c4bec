"""--gradgate-sanitize: ggml and the shim built with a sanitizer, the workers run with its runtime,
and its report read into the item's failure.

The bug is real and planted: the heap-overflow variant of the default ggml (ggml_variants.py)
has a SILU_BACK kernel that writes one float past a scratch row it allocates. Its gradient is
right, so the plain build passes the case; the ASan build fails it, naming the error and the
planted line. This file holds the suite's one sanitizer build (minutes on 2 cores the first
time; ccache has its objects after that, and the build cache the build).
"""

import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest

from ggml_variants import HEAP_OVERFLOW_MARK
from pytest_gradgate.check.outcome import Diagnosis, Phase
from pytest_gradgate.errors import BuildError
from pytest_gradgate.isolation import sanitizer_report
from pytest_gradgate.isolation.crash import STDERR_TAIL, explain, stderr_excerpt
from pytest_gradgate.library import sanitizer
from pytest_gradgate.library.cmake import GGML_BUILD_INPUTS, cache_key, compiler_identity
from pytest_gradgate.library.options import BuildOptions
from pytest_gradgate.library.shipped import NATIVE_FILES, native_dir
from pytest_gradgate.library.tree_digest import tree_digest

HEAP_CASES = """\
cases:
  - name: silu_rows
    params: {a: [5, 4]}
    graph: silu(a)
    consumers: [none]
    threads: 2
"""


@pytest.fixture(autouse=True)
def outside_ci(monkeypatch):
    """The inner runs must not see the outer run's gradgate settings."""
    for name in ("GRADGATE_GGML_SRC", "GRADGATE_BASELINE", "GRADGATE_SANITIZE", "GRADGATE_ISOLATE",
                 "GRADGATE_BACKEND", "GRADGATE_CASES"):
        monkeypatch.delenv(name, raising=False)


def test_the_plain_build_keeps_its_cache_key(default_ggml):
    """The key of a build without --gradgate-sanitize is the one it had before the option
    existed (computed here as it was then), so no cached plain build is made again; each
    sanitizer has a key of its own. Seen failing with cmake.key_fields returning every field
    (the default's key then changes: every plain build in every cache would be rebuilt)."""
    digest = hashlib.sha256()
    digest.update(tree_digest(default_ggml, GGML_BUILD_INPUTS).encode())
    digest.update(b"--native--")
    digest.update(tree_digest(native_dir(), NATIVE_FILES).encode())
    digest.update(json.dumps({"build_type": "Release", "backends": ["cpu"], "cuda_arch": "native",
                              "extra_cmake_args": []}, sort_keys=True).encode())
    digest.update(compiler_identity().encode())
    plain = cache_key(default_ggml, BuildOptions())
    assert plain == digest.hexdigest()[:24]
    keys = {plain, cache_key(default_ggml, BuildOptions(sanitize="address")),
            cache_key(default_ggml, BuildOptions(sanitize="undefined"))}
    assert len(keys) == 3


def test_sanitize_flags_reach_cmake(tmp_path):
    """`gradgate build --sanitize undefined --configure-only` configures ggml (real CMake, nothing
    built) with the sanitizer, frame pointers and -g in C and C++ flags (so that a report names
    ggml's function and line), and UBSan stopping at its first report (by default it prints and
    goes on, and a printed report fails nothing). Seen failing with -fno-sanitize-recover=all taken
    out of options.SANITIZER_FLAGS."""
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--sanitize", "undefined",
                           "--configure-only"], text=True, capture_output=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    flags = "-fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
    assert f"CMAKE_C_FLAGS={flags} CMAKE_CXX_FLAGS={flags}" in proc.stdout
    assert "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=undefined" in BuildOptions(sanitize="undefined").cmake_args()
    assert not any("sanitize" in a for a in BuildOptions().cmake_args())


@pytest.mark.parametrize("how", ["option", "env"])
def test_an_unknown_sanitizer_is_a_usage_error(pytester, monkeypatch, how):
    """--gradgate-sanitize thread stops the run before anything is built, naming the option (or
    the variable) and the values it takes. Seen failing with the Setting's choices left out: the
    run then went on (exit status 5 here, with no case to run; a case would have met a KeyError
    when its build's flags were looked up)."""
    if how == "env":
        monkeypatch.setenv("GRADGATE_SANITIZE", "thread")
        result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider")
        where = "environment GRADGATE_SANITIZE"
    else:
        result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                               "--gradgate-sanitize", "thread")
        where = "--gradgate-sanitize"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{where}: 'thread' is not one of address, undefined*"])


def test_sanitize_in_this_process_is_a_usage_error(pytester):
    """Python is not instrumented, so a sanitizer build loads only in a worker started with the
    runtime preloaded: --gradgate-isolate none is refused at once, with what to use instead.
    Seen failing with plugin._check_sanitize not called: the run went on (exit status 5 here, with
    no case to run; a case would have loaded the build into pytest's own process)."""
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "--gradgate-sanitize", "address", "--gradgate-isolate", "none")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gradgate-sanitize address needs the cases in worker processes*"
                                 "use --gradgate-isolate case, fresh or worker*"])


# a heap overflow outside ggml, with a long stderr before it: a case that printed much, then died
OVERFLOW_OUTSIDE_GGML = """\
import ctypes, sys
sys.stderr.write("what the case printed before it died\\n" * 600)
sys.stderr.flush()
buf = ctypes.create_string_buffer(1024)
ctypes.memmove(buf, b"x" * 2000, 1100)
"""


def test_a_report_outside_ggml_is_read_from_a_long_stderr(tmp_path):
    """ASan's real report, from a process run as a worker is (its runtime preloaded, our options),
    after 20 KB of other output: the excerpt the crash record keeps starts at the report, which
    says the error and that no frame is ggml's; the frames before it (ASan's memmove interceptor,
    libffi, CPython, which here has debug information and so files and lines) are not taken for
    ggml's. Seen failing with the bug put back in each of two ways: stderr_excerpt without
    _report_excerpt (the head and tail it keeps hold no report's first line: parse found none); and
    first_ggml_frame without its module check (it named __interceptor_memmove in libsanitizer)."""
    try:
        runtime = sanitizer.runtime_library("address")
    except BuildError as exc:
        pytest.skip(str(exc))
    var, options = sanitizer.RUNTIME_OPTIONS["address"]
    env = dict(os.environ, LD_PRELOAD=runtime, **{var: options})
    with open(tmp_path / "stderr", "w+b") as err:
        proc = subprocess.run([sys.executable, "-c", OVERFLOW_OUTSIDE_GGML], stderr=err, env=env, timeout=120)
        assert proc.returncode == -signal.SIGABRT
        assert os.fstat(err.fileno()).st_size > 4 * STDERR_TAIL
        excerpt = stderr_excerpt(err.fileno())
    report = sanitizer_report.parse(excerpt)
    assert (report.tool, report.error, report.frame) == ("AddressSanitizer", "heap-buffer-overflow WRITE of size 1100",
                                                         None)
    assert explain(Phase.COMPUTE, excerpt) == (Diagnosis.SANITIZER, "AddressSanitizer: heap-buffer-overflow WRITE of "
                                               "size 1100 (no frame of the report's stack is in ggml)")


@pytest.mark.slow
def test_a_planted_heap_overflow_is_named_at_its_line(pytester, ggml_variant):
    """Under --gradgate-sanitize address the case fails, and its failure names the error and the
    planted write's function and file:line in ggml; the plain build passes the same case on the
    same tree (the write lands in malloc's slack and the gradient is right): the bug is invisible
    without the sanitizer.

    Seen failing with the bug put back in each of these ways: crash.explain without its sanitizer
    branch (the failure then said only "died in phase compute"); the Worker started without
    sanitizer.worker_env (the worker could not load the build, ASan's runtime not being first: the
    cached build was set aside as broken, rebuilt, and the case failed as "broken build")."""
    root = ggml_variant("heap-overflow")[0]
    planted_line = next(n for n, line in enumerate((root / "src" / "ggml-cpu" / "ops.cpp").read_text().splitlines(), 1)
                        if HEAP_OVERFLOW_MARK in line)
    pytester.makefile(".yaml", heap_cases=HEAP_CASES)
    common = ("--gradgate", "--gradgate-no-builtin", "--gradgate-cases", "heap_cases.yaml", "--gradgate-ggml-src",
              str(root), "-p", "no:cacheprovider")

    plain = pytester.runpytest_subprocess(*common)
    plain.assert_outcomes(passed=1)

    asan = pytester.runpytest_subprocess(*common, "--gradgate-sanitize", "address", "--gradgate-json", "report.json")
    asan.assert_outcomes(failed=1)
    named = ("AddressSanitizer: heap-buffer-overflow WRITE of size 4 in ggml_compute_forward_silu_back_f32 "
             f"at ggml/src/ggml-cpu/ops.cpp:{planted_line}")
    asan.stdout.fnmatch_lines([f"*diagnosis: {named}", "*signal: SIGABRT",
                               "gradgate: Release build for cpu with -fsanitize=address (*): *",
                               f"*: crashed in phase compute: {named}"])
    (case,) = json.loads((pytester.path / "report.json").read_text())["cases"]
    assert (case["status"], case["phase"]) == ("crashed", "compute")
