"""cffi's `ffi` for our C declarations, parsed once per version of them, not once per process.

ABI mode parses the declarations with pycparser in every process that loads the library:
about 0.1 s, paid by each case worker before its first case (so by every `pytest --gradgate`,
every pytest-xdist worker, every CLI call). cffi can write what it parsed as a small Python
module (its "out-of-line" ABI mode), which later imports in about a millisecond without
pycparser. That module is kept in the user cache (library/cache.py), named by a hash of the
declarations and of cffi's version, so an edited header or another cffi gets a module of its own.

Every process, the one that writes the module included, uses the module read back from the
file, so the first run and later runs call the library through the same kind of `ffi`.

Where the module cannot be written (a read-only cache) or read back (a truncated or foreign
file), the declarations are parsed in this process as before: it costs the parse, nothing else.

Each other version of the declarations or of cffi leaves a module of its own (8-9 KB). A module
in use has its modification time renewed once a day at most; when a new one is written, those
that no process used for UNUSED_DAYS are removed, so the folder holds what is in use.
"""

import contextlib
import hashlib
import importlib.util
import io
import os
import tempfile
import time

import _cffi_backend

from pytest_gradgate.library.cache import cache_root

MODULE_PREFIX = "gradgate_ffi_"
DAY_S = 86400
UNUSED_DAYS = 30        # a kept module no process used for this long is removed when a new one is written
RENEW_AFTER_S = DAY_S   # a module in use has its time renewed when it is older than this


def module_path(text):
    """Where the module for these declarations is kept."""
    key = hashlib.sha256(f"cffi {_cffi_backend.__version__}\n{text}".encode()).hexdigest()[:24]
    return cache_root() / "ffi" / f"{MODULE_PREFIX}{key}.py"


def ffi_for(text):
    """An FFI that knows the declarations `text`: from the kept module, else parsed (and kept)."""
    path = module_path(text)
    ffi = _read_back(path)
    if ffi is not None:
        _renew(path)
        return ffi
    import cffi     # and pycparser: only on a first run, or where the module cannot be kept
    parsed = cffi.FFI()
    parsed.cdef(text)
    if _write(parsed, path):
        ffi = _read_back(path)
    return ffi if ffi is not None else parsed


def _read_back(path):
    """The `ffi` of the module at `path`, or None if there is none or it does not load."""
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        ffi = module.ffi
    except Exception:   # noqa: BLE001  a truncated or foreign file: parse instead (and rewrite it)
        return None
    return ffi if isinstance(ffi, _cffi_backend.FFI) else None


def _write(parsed, path):
    """Write the module for `parsed` at `path` in one rename (concurrent workers may race
    to write it; each writes a whole file). False where the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=".tmp-", suffix=".py", dir=path.parent)
        os.close(handle)
        try:
            parsed.set_source(path.stem, None)   # None: ABI mode, no C compiler involved
            # cffi prints "generating ...": in a case worker stdout is the pipe to its parent
            with contextlib.redirect_stdout(io.StringIO()):
                parsed.emit_python_code(staging)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    except OSError:
        return False
    _remove_unused(path)
    return True


def _renew(path):
    """Mark the module at `path` as in use (its modification time), at most once a day."""
    try:
        if time.time() - path.stat().st_mtime > RENEW_AFTER_S:
            os.utime(path)
    except OSError:     # a read-only cache: nothing in it is removed either
        pass


def _remove_unused(kept):
    """Remove the other modules beside `kept` that no process used for UNUSED_DAYS."""
    limit = time.time() - UNUSED_DAYS * DAY_S
    for other in kept.parent.glob(f"{MODULE_PREFIX}*.py"):
        try:
            if other != kept and other.stat().st_mtime < limit:
                other.unlink()
        except OSError:     # removed by another process meanwhile, or not ours to remove
            pass
