"""Where the package's own native files are: the shim's sources and the C declarations.

A module of its own, free of CMake and subprocess, because a case worker needs these paths
at start (library/binding.py reads the declarations) and every import there delays its first case.
"""

from pathlib import Path

from pytest_gradgate.errors import BuildError

PACKAGE_BUILD_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_BUILD_DIR / "native"   # package data: CMakeLists.txt, the shim
NATIVE_FILES = ("CMakeLists.txt", "gradgate.h", "gradgate_shim.c")
CDEFS_DIR = PACKAGE_BUILD_DIR / "cdefs"      # the ggml functions and types we call, header-like


def native_dir():
    """The shim's sources, shipped inside the package (a wheel has them too)."""
    missing = [n for n in NATIVE_FILES if not (NATIVE_DIR / n).is_file()]
    if missing:
        raise BuildError(f"this installation of pytest-gradgate lacks {', '.join(missing)} in {NATIVE_DIR}; "
                         "reinstall it (pip install --force-reinstall pytest-gradgate)")
    return NATIVE_DIR
