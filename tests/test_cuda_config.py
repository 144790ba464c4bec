"""The CUDA path without a GPU: option handling, the cache key, CMake's configure step
with GGML_CUDA=ON using this machine's nvcc, and fast, clear failures where no GPU is
visible (the CPU path unaffected). Compiling and running CUDA needs a GPU machine."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gradgate.library.cmake import BuildOptions, cache_key, gpu_visible

no_gpu = pytest.mark.skipif(gpu_visible(), reason="a GPU is visible here; these check the no-GPU behaviour")
CUDA_90 = BuildOptions(backends=("cpu", "cuda"), cuda_arch="90")


def gradgate_build(*args, tmp=None):
    """tmp: the temporary folder it works in (a failed configure keeps its log there)."""
    env = None if tmp is None else {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", *args], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600, env=env)


def test_cuda_options_reach_cmake_and_the_cache_key(default_ggml):
    assert "-DGGML_CUDA=ON" not in BuildOptions().cmake_args()
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"} <= set(CUDA_90.cmake_args())
    keys = {cache_key(default_ggml, o) for o in
            (BuildOptions(), CUDA_90, BuildOptions(backends=("cpu", "cuda"), cuda_arch="89"))}
    assert len(keys) == 3


def test_configure_only_cuda_with_this_machines_nvcc(default_ggml, tmp_path):
    """`gradgate build --configure-only --backend cuda --cuda-arch 90` configures ggml with
    GGML_CUDA=ON. Where CMake cannot find (all of) CUDA here it skips with CMake's reason,
    as one line (e.g. a toolkit that has nvcc but no cuBLAS: pip install nvidia-cublas)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: no CUDA toolkit to configure with")
    proc = gradgate_build("--configure-only", "--backend", "cuda", "--cuda-arch", "90", tmp=tmp_path)
    if proc.returncode != 0:
        first = next(line for line in proc.stderr.splitlines() if line.startswith("gradgate build: error: "))
        assert "CMake configure of ggml" in first, proc.stderr
        # the log it keeps is the one it names (in this test's folder, not the machine's /tmp)
        log = re.search(r"\(full log: (.+)\)", proc.stderr)
        assert log and Path(log.group(1)).is_file() and tmp_path in Path(log.group(1)).parents, proc.stderr
        if "CMake did not find" in first:
            pytest.skip(first.split("failed: ", 1)[1])
        pytest.fail(proc.stderr)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("configured ggml 0.15.3 from ")
    assert "GGML_CUDA=ON" in lines[1].split() and "CMAKE_CUDA_ARCHITECTURES=90" in lines[1].split()


@no_gpu
def test_native_cuda_arch_without_gpu_fails_fast():
    proc = gradgate_build("--configure-only", "--backend", "cuda")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "gradgate build: error: --backend cuda --cuda-arch native needs a visible NVIDIA GPU and there is none "
        "here; give the architecture to build for, e.g. --cuda-arch 90"]


def test_bad_backend_choice_is_one_line():
    proc = gradgate_build("--backend", "gpu")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "gradgate build: error: argument --backend: invalid choice: 'gpu' (choose from 'cpu', 'cuda', 'all') "
        "(see gradgate build --help)"]


@no_gpu
@pytest.mark.parametrize("backend", ["cuda", "all"])
def test_pytest_backend_cuda_without_gpu_is_a_usage_error(pytester, backend):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-backend", backend, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gradgate-backend {backend}: no NVIDIA GPU is visible on this machine*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert "gradgate: configuring" not in result.stdout.str()  # failed before any build


def test_cpu_path_unaffected(default_build, pytester):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-backend", "cpu", "-k", "dup and none and not get_rows",
                                           "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([f"gradgate: Release build for cpu (cached): {default_build.library}", "*passed*"])
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.OK and outcomes["passed"] >= 1 and "failed" not in outcomes


def test_bad_backend_value_in_pytest_names_its_source(pytester, monkeypatch):
    monkeypatch.setenv("GRADGATE_BACKEND", "gpu")
    result = pytester.runpytest_subprocess("--gradgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: environment GRADGATE_BACKEND: 'gpu' is not one of cpu, cuda, all"])


def test_one_build_that_holds_cuda_serves_cuda_all_and_cpu(default_ggml, tmp_path, monkeypatch):
    """`gradgate build --backend all` and a run with --gradgate-backend cuda or all ask for one
    build (ggml's CPU backend is in every build): one key. A CPU run finds it through the
    CPU-only key its build-info records, when no CPU-only build exists (and, in find_build,
    a GPU is visible: without one a CUDA build may not load). Checked on a recorded
    build-info in an empty cache, since compiling CUDA here takes long; before the fix the
    gate asked for backends ("cuda",) and the CLI for ("cpu", "cuda"): two keys, two builds."""
    import json
    from pytest_gradgate.library.cmake import BUILD_INFO, LIBRARY_NAME, cpu_key_served, find_build, find_serving_build
    from pytest_gradgate.library.options import build_backends
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    cuda_run = BuildOptions(backends=build_backends(("cuda",)), cuda_arch="90")
    all_run = BuildOptions(backends=build_backends(("cpu", "cuda")), cuda_arch="90")
    key = cache_key(default_ggml, CUDA_90)
    assert cache_key(default_ggml, cuda_run) == cache_key(default_ggml, all_run) == key
    assert cache_key(default_ggml, BuildOptions(backends=("cuda",), cuda_arch="90")) == key
    # what ensure_build records for a CUDA build (its library here a stand-in file: only the lookup is checked)
    entry = tmp_path / "builds" / key
    entry.mkdir(parents=True)
    (entry / LIBRARY_NAME).write_bytes(b"")
    served = cpu_key_served(default_ggml, CUDA_90)
    (entry / BUILD_INFO).write_text(json.dumps({"key": key, "options": {}, "serves_cpu": served}))
    assert served == cache_key(default_ggml, BuildOptions())
    assert find_build(default_ggml, cuda_run).path == entry
    assert find_build(default_ggml, all_run).path == entry
    assert find_serving_build(cache_key(default_ggml, BuildOptions())).path == entry
    assert find_serving_build(cache_key(default_ggml, BuildOptions(build_type="Debug"))) is None
    assert cpu_key_served(default_ggml, BuildOptions()) is None
    found = find_build(default_ggml, BuildOptions())
    assert (found is not None and found.path == entry) if gpu_visible() else found is None
