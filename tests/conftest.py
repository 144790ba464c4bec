"""Shared fixtures: the default ggml (fetched once into the user cache) and its build,
plus patched variants of it. Builds are cached by content, so each distinct tree is
built once per machine, whichever test asks first."""

import os
from pathlib import Path

import pytest

from pytest_gradgate.build import BuildOptions, ensure_build
from pytest_gradgate.source import default_ggml_root
from pytest_gradgate.variants import make_variant

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def default_ggml():
    return default_ggml_root()


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
    from pytest_gradgate import binding
    return binding.load(default_build.library)
