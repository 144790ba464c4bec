"""The build cache, for real: CMake builds of the default ggml (and a llama.cpp tree),
killed builds, racing builders, a broken ggml, and what pytest shows meanwhile.

Tests about cache behaviour use a temporary GRADGATE_CACHE_DIR but the user cache's copy of
the default ggml, so the compiler sees the same source paths and ccache makes their
"cold" builds cheap. Everything else shares the session's cached build."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggml_variants import insert_before
from pytest_gradgate.library.cmake import GGML_BUILD_INPUTS, BuildOptions, cache_key, ensure_build, find_build
from pytest_gradgate.library.source import copy_tree
from pytest_gradgate.errors import BuildError

# build (or find) the library for argv[1], load it, and say what happened, as JSON
BUILD_AND_LOAD = """
import json, os, sys, time
from pytest_gradgate.library import binding
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
if len(sys.argv) > 2:  # a start line shared with another builder: say ready, wait for "go"
    open(sys.argv[2] + f".ready-{os.getpid()}", "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
started = time.time()
build = ensure_build(sys.argv[1], BuildOptions())
lib = binding.load(build.library)
print(json.dumps({"pid": os.getpid(), "cached": build.cached, "library": str(build.library),
                  "built_by": build.info.get("built_by_pid"), "version": binding.ggml_version(lib),
                  "started": started, "finished": time.time()}))
"""


def build_and_load(root, env=None, **popen):
    proc = subprocess.run([sys.executable, "-c", BUILD_AND_LOAD, str(root)], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, **popen)
    assert proc.returncode == 0, proc.stdout
    return json.loads(proc.stdout.splitlines()[-1])


def entries(cache_dir):
    """Names in the builds folder other than locks and staging folders."""
    return sorted(p.name for p in (cache_dir / "builds").iterdir()
                  if not p.name.endswith(".lock") and not p.name.startswith(".tmp-"))


def test_build_type_and_backends_are_part_of_the_key(default_ggml):
    debug = BuildOptions(build_type="Debug")
    assert "-DCMAKE_BUILD_TYPE=Debug" in debug.cmake_args()
    assert len({cache_key(default_ggml, o) for o in (BuildOptions(), debug)}) == 2


def test_cache_hit_loads_without_cmake(default_ggml, default_build, tmp_path):
    """With cmake off PATH (only the compilers, which are part of the cache key) a cached
    build still loads: a hit never runs CMake."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("cc", "c++"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    env = dict(os.environ, PATH=str(bin_dir))
    assert shutil.which("cmake", path=env["PATH"]) is None
    out = build_and_load(default_ggml, env=env)
    assert out["cached"] is True
    assert out["library"] == str(default_build.library)
    assert out["version"] == "0.15.3"


def test_the_run_names_the_ggml_it_checked(default_build, pytester):
    """The version is read from the library the cases ran on, once one has run."""
    result = pytester.runpytest_subprocess("--gradgate", "-k", "dup and none and not get_rows", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "gradgate: ggml from default (ggml-0.15.3, vendored by ggml-python==0.0.45); Release build for cpu, "
        "made or found when the first case runs",
        "*gradgate*",
        "gradgate: ggml 0.15.3 from default (ggml-0.15.3, vendored by ggml-python==0.0.45)",
        f"gradgate: Release build for cpu (cached): {default_build.library}",
    ])


def test_gradgate_build_prints_the_library_alone(default_build):
    """Before: ten lines on stdout (the path, then build-info); a script wants the path."""
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(default_build.library)]
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "-v"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.stdout.splitlines() == [str(default_build.library)]
    assert {"ggml_version: 0.15.3", "cached: True"} <= set(proc.stderr.splitlines())


def test_gradgate_build_bad_source_is_one_line_and_a_usage_error(tmp_path):
    """Before: exit 1 here and 2 in the other subcommands."""
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", str(tmp_path / "nope")],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"gradgate build: error: --ggml-src: ggml source '{tmp_path / 'nope'}' "
                                        "does not exist (expected a ggml checkout or a llama.cpp checkout, or a pinned source: ggml-0.15.3, ggml-0.26.0)"]


def compiled_files(stats_log):
    """The files ccache's stats log (CCACHE_STATSLOG) shows compiled, not found in the cache."""
    files, current = [], None
    for line in Path(stats_log).read_text().splitlines():
        if line.startswith("# "):
            current = {"file": line[2:], "hit": False}
            files.append(current)
        elif current is not None and line.endswith("_cache_hit"):
            current["hit"] = True
    return [f["file"] for f in files if not f["hit"]], len(files)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ccache") is None, reason="objects are shared between builds through ccache")
def test_a_copy_of_ggml_that_differs_in_one_file_compiles_that_file_alone(default_ggml, tmp_path, monkeypatch):
    """ccache finds an object by its compile line, and CMake writes absolute paths into it: before
    the builds reached their tree through the staging folder's link (cmake.py, SOURCE_LINK), a copy
    of ggml at another path compiled every file again (26 here, 95-164 s each for this suite's
    patched copies on a cold run). Verified to fail with the link taken out: 26 files compiled, not 1."""
    original = copy_tree(default_ggml, tmp_path / "original" / "ggml")
    patched = copy_tree(default_ggml, tmp_path / "patched" / "ggml")
    # a value of this run's, so that the patched file is new to ccache however often this test ran
    insert_before(patched / "src" / "ggml.c", '#include "ggml.h"\n', f"long gradgate_patched_copy = {time.time_ns()}L;\n")
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))
    # at a path no build has used: what ccache holds of the default ggml is shared already, or
    # this build puts it there
    ensure_build(original, BuildOptions())
    monkeypatch.setenv("CCACHE_STATSLOG", str(tmp_path / "ccache-stats.log"))
    build = ensure_build(patched, BuildOptions())
    compiled, seen = compiled_files(tmp_path / "ccache-stats.log")
    assert seen > 20 and len(compiled) == 1 and compiled[0].endswith("src/ggml.c"), (seen, compiled)
    # ggml's abort lines name the file inside the tree, not the link the build reached it by
    library = build.library.read_bytes()
    assert b"ggml/src/ggml.c" in library and b"ggml-source" not in library
    assert build_and_load(patched)["version"] == "0.15.3"


@pytest.mark.slow
def test_cold_build_shows_progress(default_ggml, pytester, tmp_path, monkeypatch):
    """A cold build (empty cache dir) through pytest: configure and build progress lines
    appear when the first case is about to run, and the summary says it was built."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-ggml-src", str(default_ggml),
                                           "-k", "dup and none and not get_rows", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.stdout.fnmatch_lines([
        "*test session starts*",
        "gradgate: configuring ggml",
        "gradgate: building ggml [[]1/*[]]",
        f"gradgate: ggml 0.15.3 from {default_ggml}",
        "gradgate: Release build for cpu (built in * s): *libgradgate.so",
    ])


@pytest.mark.slow
def test_interrupted_build_leaves_no_valid_entry(default_ggml, tmp_path, monkeypatch):
    """Verified to fail with the bug put back: publishing the entry first and building in
    place leaves a half-built entry folder instead of a .tmp-* staging folder after the kill."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    builds = tmp_path / "builds"
    proc = subprocess.Popen([sys.executable, "-c", BUILD_AND_LOAD, str(default_ggml)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while True:  # wait until `cmake --build` runs, then kill the builder and its children
            logs = [*builds.glob(".tmp-*/build.log"), *builds.glob("*/build.log")] if builds.is_dir() else []
            if logs and "cmake --build" in logs[0].read_text(errors="replace"):
                break
            assert proc.poll() is None, "the builder ended before it could be interrupted"
            assert time.time() < deadline, "cmake --build never started"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert find_build(default_ggml, BuildOptions()) is None
    assert list(builds.glob(".tmp-*")), "the killed builder's staging folder should still be there"
    assert entries(tmp_path) == []

    build = ensure_build(default_ggml, BuildOptions())
    assert build.cached is False and build.library.is_file()
    assert list(builds.glob(".tmp-*")) == []  # the leftover was swept
    assert find_build(default_ggml, BuildOptions()).path == build.path
    assert build_and_load(default_ggml)["cached"] is True


@pytest.mark.slow
def test_two_processes_building_at_once_make_one_build(default_ggml, tmp_path, monkeypatch):
    """Verified to fail with the bug put back: with file_lock's flock removed, one of the
    two builders dies (the other sweeps its staging folder) or both run CMake."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_AND_LOAD, str(default_ggml), str(go)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.ready-*"))) < 2:  # both imported and waiting: start them together
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()
    outs = []
    for proc in procs:
        text = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, text
        outs.append(json.loads(text.splitlines()[-1]))
    assert sorted(o["cached"] for o in outs) == [False, True]   # exactly one ran CMake
    builder = next(o for o in outs if not o["cached"])
    assert all(o["built_by"] == builder["pid"] for o in outs)
    assert all(o["started"] < builder["finished"] for o in outs)  # they really overlapped
    assert outs[0]["library"] == outs[1]["library"]
    assert all(o["version"] == "0.15.3" for o in outs)
    assert len(entries(tmp_path)) == 1
    assert list((tmp_path / "builds").glob(".tmp-*")) == []


@pytest.mark.slow
def test_failed_build_reports_log_tail_and_path(default_ggml, tmp_path, monkeypatch, pytester):
    broken = tmp_path / "broken-ggml"
    for name in GGML_BUILD_INPUTS:
        src = default_ggml / name
        if src.is_dir():
            shutil.copytree(src, broken / name)
        elif src.is_file():
            broken.mkdir(exist_ok=True)
            shutil.copy(src, broken / name)
    ggml_c = broken / "src" / "ggml.c"
    anchor = '#include "ggml.h"\n'
    text = ggml_c.read_text()
    assert anchor in text
    ggml_c.write_text(text.replace(anchor, anchor + "gradgate_deliberate_syntax_error(;\n", 1))
    bad_line = text[:text.index(anchor)].count("\n") + 2
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))

    with pytest.raises(BuildError) as err:
        ensure_build(broken, BuildOptions())
    error = err.value
    first_line, second_line = str(error).splitlines()[:2]
    # the compiler's first error (its later ones cascade) and the log's tail
    assert first_line.startswith(f"CMake build of ggml at {broken} failed: {broken}/src/ggml.c:{bad_line}:")
    assert "error: " in first_line
    assert second_line == "--- last lines of the build log ---"
    assert error.log_tail and error.log_tail in str(error)
    assert error.log_path.is_file() and str(error).endswith(f"(full log: {error.log_path})")
    assert find_build(broken, BuildOptions()) is None
    assert entries(tmp_path / "cache") == ["failed"]  # only the kept logs

    # collection never builds: listing the cases, or a -k that selects none, runs no CMake
    for args in (["--collect-only", "-q"], ["-k", "no_such_case"]):
        result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={broken}", "-p", "no:cacheprovider",
                                               *args)
        assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), result.stdout.str()
        assert "configuring ggml" not in result.stdout.str() and "CMake" not in result.stdout.str()
    # the first case that runs builds; the failure is that item's error, and the run stops there
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-ggml-src", str(broken), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ERROR at setup of *",
                                 f"gradgate: CMake build of ggml at {broken} failed: "
                                 f"{broken}/src/ggml.c:{bad_line}:*error: *",
                                 "--- last lines of the build log ---",
                                 "(full log: *.log)",
                                 "*the ggml build failed*",
                                 "*1 error*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


@pytest.mark.slow
def test_llama_cpp_root_builds_and_runs_a_case(llama_cpp_root, pytester):
    """The ggml that llama.cpp carries (0.25.3 in llama-cpp-python 0.3.36) builds with the
    same shim and binding, loads, and runs a case."""
    out = build_and_load(llama_cpp_root / "ggml")
    assert out["version"] == "0.25.3"
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-ggml-src", str(llama_cpp_root),
                                           "-k", "dup and none and not get_rows", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([f"gradgate: ggml 0.25.3 from {llama_cpp_root}", "*passed*"])
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.OK and outcomes["passed"] >= 1 and "failed" not in outcomes


@pytest.mark.slow
def test_debug_build_turns_ggml_asserts_on(default_ggml, default_build):
    """--gradgate-build-type Debug changes what fails loudly: SILU's backward kernel only
    `assert()`s a contiguous gradient, so in Release a transposed gradient gives silently
    wrong values (a failed comparison) while in Debug the assert aborts the case, and the
    report quotes it. (One extra build of the default ggml at -O0, about 15 s cold.)"""
    from pytest_gradgate.declare.case import Case
    from pytest_gradgate.isolation.parent import Runner
    case = Case("silu_through_transpose", "silu(a)", {"a": [4, 3]}, consumer="transpose")
    debug = ensure_build(default_ggml, BuildOptions(build_type="Debug"))
    assert debug.key != default_build.key
    results = {}
    for name, build in (("release", default_build), ("debug", debug)):
        runner = Runner(build.library)
        try:
            results[name] = runner.run(case)
        finally:
            runner.close()
    assert results["release"].status == "failed" and results["release"].maa > 0.1
    dbg = results["debug"]
    assert dbg.status == "crashed" and dbg.signal == "SIGABRT" and dbg.phase == "compute"
    assert "Assertion `ggml_is_contiguous_1(grad)' failed" in dbg.message
