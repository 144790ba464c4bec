"""The one module that owns cffi's `ffi` and the loaded native library.

ABI mode (dlopen, no compiler at import time): the declarations are header-like files,
library/cdefs/*.h for the ggml functions we call and library/native/gradgate.h for the
shim. The shim reports an ABI revision, so a library built from another revision of
gradgate.h is refused with a message instead of being called with wrong signatures.
The parsed declarations are kept between processes (library/declarations.py).
"""

from pytest_gradgate.library.declarations import ffi_for
from pytest_gradgate.library.shipped import CDEFS_DIR, native_dir
from pytest_gradgate.errors import GradgateError

EXPECTED_ABI = 9
_CDEF_FILES = ("ggml_types.h", "ggml_ops.h")


def declarations():
    """The C declarations cffi is given: ours of ggml's, then the shim's header."""
    parts = [(CDEFS_DIR / name).read_text() for name in _CDEF_FILES]
    parts.append((native_dir() / "gradgate.h").read_text())
    return "\n".join(parts)


ffi = ffi_for(declarations())

_loaded = {}


def load(library_path):
    """dlopen the library once per process and check its ABI revision."""
    library_path = str(library_path)
    lib = _loaded.get(library_path)
    if lib is None:
        try:
            lib = ffi.dlopen(library_path)
        except OSError as exc:
            raise GradgateError(f"cannot load {library_path}: {exc}") from None
        abi = lib.gg_abi_version()
        if abi != EXPECTED_ABI:
            raise GradgateError(f"{library_path} has shim ABI {abi}, this pytest-gradgate expects "
                                f"{EXPECTED_ABI}; remove it so that it is rebuilt")
        _loaded[library_path] = lib
    return lib


def ggml_version(lib):
    return ffi.string(lib.gg_ggml_version()).decode()


_declared = {}


def declared_functions(lib, cdef_text):
    """The functions of `cdef_text` (a case file's declared ops, ops/declared.py) in the library
    `lib` was loaded from, through an ffi of their own. A symbol the library does not have is a
    GradgateError when it is first called for, naming the function."""
    path = next(p for p, loaded in _loaded.items() if loaded is lib)
    key = (path, cdef_text)
    if key not in _declared:
        _declared[key] = _DeclaredLibrary(ffi_for(cdef_text).dlopen(path), path)
    return _declared[key]


class _DeclaredLibrary:
    def __init__(self, lib, path):
        self._lib, self._path = lib, path

    def __getattr__(self, symbol):
        try:
            return getattr(self._lib, symbol)
        except Exception:   # noqa: BLE001  cffi's ffi.error: the symbol is not in the library
            raise GradgateError(f"{symbol} is not in {self._path}: the ggml tree under test has no such "
                                "function (check its name in the tree's include/ggml.h, or point "
                                "--gradgate-ggml-src at the tree that has it)") from None
