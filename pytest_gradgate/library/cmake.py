"""Build ggml plus our shim with CMake, once per distinct input, shared by every process.

Cache key = content of the ggml tree (the parts that make the library) + native/ +
build options + compiler identity (a tree's digest is remembered by its files' stat: see
tree_digest.py). A hit returns the published entry without running
CMake. A miss builds in a staging folder under an exclusive lock (so concurrent
pytest-xdist workers wait for one build instead of racing) and publishes it atomically.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pytest_gradgate.library import kernel_steps
from pytest_gradgate.library.cache import cache_root, file_lock, make_entry
from pytest_gradgate.library.options import BUILD_INFO, BuildOptions, build_backends
from pytest_gradgate.library.sanitizer import runtime_library
from pytest_gradgate.library.shipped import NATIVE_FILES, native_dir
from pytest_gradgate.errors import BuildError
from pytest_gradgate.library.source import GGML_BUILD_INPUTS, read_ggml_version
from pytest_gradgate.library.tree_digest import tree_digest

LIBRARY_NAME = {"darwin": "libgradgate.dylib", "win32": "gradgate.dll"}.get(sys.platform, "libgradgate.so")
# GGML_BUILD_INPUTS (library/source.py): what of a ggml tree goes into the library


@dataclass
class Build:
    """A published build: where the library is and what went into it."""
    path: Path
    key: str
    info: dict = field(default_factory=dict)
    cached: bool = True
    # the library file as found (inode, size, mtime): set_aside moves this one only
    library_stat: tuple = ()

    @property
    def library(self):
        return self.path / LIBRARY_NAME


def compiler_identity():
    """First line of the C and C++ compilers' --version (CMake honours $CC/$CXX likewise)."""
    ids = []
    for var, default in (("CC", "cc"), ("CXX", "c++")):
        exe = os.environ.get(var, default)
        try:
            out = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, timeout=30).stdout
            ids.append(f"{exe}: {out.splitlines()[0] if out else '?'}")
        except (OSError, subprocess.SubprocessError):
            ids.append(f"{exe}: missing")
    return "; ".join(ids)


def gpu_visible():
    """An NVIDIA GPU this process could use (its device node or the driver's tool)."""
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def _cuda_toolkit_root():
    for var in ("CUDAToolkit_ROOT", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    for candidate in ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (candidate / "bin" / "nvcc").exists():
            return candidate
    return None


def _toolkit_has(root, pattern):
    if root is None:
        return False
    dirs = [root / "lib64", root / "lib", root / "lib64" / "stubs", *root.glob("targets/*/lib"),
            *root.glob("targets/*/lib/stubs")]
    return any(next(d.glob(pattern), None) for d in dirs if d.is_dir())


def _wheel_cublas():
    """cuBLAS from the nvidia-cublas wheel (pip install nvidia-cublas), or None."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for flavour in ("cu13", "cu12", "cublas"):
            lib = Path(base) / flavour / "lib"
            found = {n: next(lib.glob(f"lib{n}.so*"), None) for n in ("cublas", "cublasLt")}
            if all(found.values()):
                return found, Path(base) / flavour / "include"
    return None


def cuda_toolkit_args():
    """Fill the gaps of a CUDA toolkit that has nvcc but not everything ggml-cuda links.

    Developer machines without a GPU often carry nvcc and cudart only: cuBLAS may come from
    the nvidia-cublas wheel instead, and without a driver there is no libcuda, which ggml
    links only for its virtual-memory pool (GGML_CUDA_NO_VMM=ON drops that)."""
    root = _cuda_toolkit_root()
    args = []
    if not _toolkit_has(root, "libcublas.so*"):
        wheel = _wheel_cublas()
        if wheel:
            libs, include = wheel
            args += [f"-DCUDA_cublas_LIBRARY={libs['cublas']}", f"-DCUDA_cublasLt_LIBRARY={libs['cublasLt']}",
                     f"-DCMAKE_CUDA_FLAGS=-I{include}"]
    if not _toolkit_has(root, "libcuda.so*") and not _system_has_libcuda():
        args += ["-DGGML_CUDA_NO_VMM=ON"]
    return args


def _system_has_libcuda():
    import ctypes.util
    return ctypes.util.find_library("cuda") is not None


def key_fields(options):
    """The build options as they go into the cache key. An option added later is left out
    while it has its default, so that the builds cached before it existed keep their keys."""
    fields = asdict(options)
    if not fields["sanitize"]:
        del fields["sanitize"]
    return fields


def cache_key(ggml_root, options):
    # what the build holds, not how the run named it: --backend cuda and all are one build
    options = replace(options, backends=build_backends(options.backends))
    digest = hashlib.sha256()
    digest.update(tree_digest(ggml_root, GGML_BUILD_INPUTS).encode())
    digest.update(b"--native--")
    digest.update(tree_digest(native_dir(), NATIVE_FILES).encode())
    digest.update(json.dumps(key_fields(options), sort_keys=True).encode())
    digest.update(compiler_identity().encode())
    if "cuda" in options.backends:
        digest.update(json.dumps(cuda_toolkit_args()).encode())
    return digest.hexdigest()[:24]


def builds_dir():
    return cache_root() / "builds"


def find_build(ggml_root, options):
    """The published build for these inputs, or None; for a CPU run on a machine with a GPU,
    a build of the same tree that holds CUDA too serves when there is no CPU-only one."""
    key = cache_key(ggml_root, options)
    entry = builds_dir() / key
    build = _load_entry(entry, key)
    if build is None and "cuda" not in options.backends and gpu_visible():
        # (without a GPU a CUDA build may not even load: no driver library)
        build = find_serving_build(key)
    return build


def cpu_key_served(ggml_root, options):
    """The key of the CPU-only build (default cuda_arch) that a build with these options can
    stand in for, recorded in its build-info; None for a CPU-only build."""
    if "cuda" not in build_backends(options.backends):
        return None
    return cache_key(ggml_root, replace(options, backends=("cpu",), cuda_arch=BuildOptions().cuda_arch))


def find_serving_build(cpu_key):
    """A published build whose build-info says it serves the CPU-only build `cpu_key`, or None."""
    root = builds_dir()
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return None
    for entry in entries:
        try:
            info = json.loads((entry / BUILD_INFO).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("serves_cpu") == cpu_key:
            build = _load_entry(entry, info.get("key"))
            if build is not None:
                return build
    return None


def _load_entry(entry, key):
    """The published build in `entry`, or None: also for a damaged one (its build-info
    unreadable or not ours), which make_entry then replaces by a fresh build."""
    info_path = entry / BUILD_INFO
    if not info_path.is_file() or not (entry / LIBRARY_NAME).is_file():
        return None
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("key") != key or not isinstance(info.get("options"), dict):
        return None
    return Build(entry, key, info, cached=True, library_stat=_stat_of(entry / LIBRARY_NAME))


def _stat_of(path):
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def set_aside(build):
    """Move a published build whose library cannot be loaded (overwritten by a full disk
    during a copy, a killed sync) out of its entry, to builds/broken/ where it can still be
    looked at, so that ensure_build makes it again. Under the entry's lock, and only if the
    entry still holds the very library found broken: another process (an xdist worker) that
    found it broken too may have rebuilt it already. -> where it went, or None if it was no
    longer there."""
    entry = Path(build.path)
    with file_lock(entry.parent / f"{entry.name}.lock"):
        if not build.library_stat or _stat_of(entry / LIBRARY_NAME) != build.library_stat:
            return None
        aside = builds_dir() / "broken" / f"{entry.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(entry, aside)
    return aside


CACHE_HINT = "set GRADGATE_CACHE_DIR to a writable folder with room for a build (about 100 MB)"


def cache_write_error(exc):
    """One line for an OSError of the cache itself (read-only, full, no permission)."""
    where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
    return BuildError(f"cannot build ggml: the build cache {builds_dir()} cannot be written "
                      f"({exc.strerror or exc}{where}); free space there, or {CACHE_HINT}")


def ensure_build(ggml_root, options=BuildOptions(), progress=None):
    """Return the build for (ggml_root, options), building it if no valid entry exists."""
    key = cache_key(ggml_root, options)
    entry = builds_dir() / key
    if "cuda" not in options.backends and _load_entry(entry, key) is None:
        serving = find_build(ggml_root, options)      # a build that holds CUDA too, on a GPU machine
        if serving is not None:
            return serving
    served = cpu_key_served(ggml_root, options)

    def produce(staging):
        info = _run_cmake(ggml_root, options, staging, progress)
        info["key"] = key
        if served is not None:
            info["serves_cpu"] = served
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=2))

    try:
        built_now = make_entry(entry, lambda e: _load_entry(e, key) is not None, produce)
    except OSError as exc:
        raise cache_write_error(exc) from None
    build = _load_entry(entry, key)
    build.cached = not built_now
    return build


_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PROGRESS = re.compile(r"^\[\s*(\d+)%\]")


def run_logged(cmd, log, progress, label, env):
    log.write(("$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    for raw in proc.stdout:
        log.write(raw)
        if progress:
            line = raw.decode(errors="replace").rstrip()
            m = _NINJA_PROGRESS.match(line)
            if m:
                progress(f"{label} [{m.group(1)}/{m.group(2)}]")
            else:
                m = _MAKE_PROGRESS.match(line)
                if m:
                    progress(f"{label} [{m.group(1)}%]")
    code = proc.wait()
    # the caller reads (and keeps) the log file as soon as a step fails: what is still in
    # this file object's buffer is the compiler's error itself
    log.flush()
    return code


def _tail(path, n=25):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def build_tool_args():
    """Ninja and ccache when present: both only speed things up."""
    args = []
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if shutil.which("ccache"):
        args += ["-DGGML_CCACHE=OFF", "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
                 "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    return args


def configure(ggml_root, options, work, log, progress=None, env=None, through_link=False):
    """through_link: ggml_root is the staging folder's SOURCE_LINK, compiled under relative paths."""
    cmd = ["cmake", "-S", str(native_dir()), "-B", str(work), f"-DGRADGATE_GGML_DIR={ggml_root}"]
    if through_link:
        cmd.append(f"-DGRADGATE_SOURCE_LINK={Path(ggml_root).name}")
    cmd += build_tool_args() + options.cmake_args()
    if "cuda" in options.backends:
        cmd += cuda_toolkit_args()
    if progress:
        progress("configuring ggml")
    return run_logged(cmd, log, progress, "configuring ggml", env)


def require_cmake():
    if not shutil.which("cmake"):
        raise BuildError("cmake was not found on PATH; install it (e.g. pip install cmake or apt-get install cmake)")


def configure_only(ggml_root, options, work, progress=None):
    """Run CMake's configure step alone into `work` (nothing is built or cached).

    Returns the values CMake settled on for the options we pass (e.g. GGML_CUDA); a failure
    raises BuildError whose first line says what CMake could not find."""
    require_cmake()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "configure.log"
    with open(log_path, "wb") as log:
        rc = configure(ggml_root, options, work / "build", log, progress, dict(os.environ))
    if rc != 0:
        text = log_path.read_text(errors="replace")
        raise BuildError(f"CMake configure of ggml at {ggml_root} failed: {cmake_error_summary(text)}",
                         log_path=log_path, log_tail=_tail(log_path))
    return read_cmake_cache(work / "build" / "CMakeCache.txt")


def read_cmake_cache(path):
    values = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        m = re.match(r"^([A-Za-z_][\w-]*):(\w+)=(.*)$", line)
        if m:
            values[m.group(1)] = m.group(3)
    return values


_MISSING_TARGET = re.compile(r'Target "([^"]+)" links to:\s+(\S+)\s+but the target was not found')
_WHAT_PROVIDES = {"CUDA::cublas": "cuBLAS (install it with the CUDA toolkit, or pip install nvidia-cublas)",
                  "CUDA::cuda_driver": "the CUDA driver library libcuda",
                  "CUDA::cudart": "the CUDA runtime"}


def cmake_error_summary(log_text):
    """One line saying why a CMake configure failed, from its log."""
    m = _MISSING_TARGET.search(log_text)
    if m:
        target, missing = m.groups()
        return (f"CMake did not find {missing}, which {target} links to: the CUDA toolkit here lacks "
                f"{_WHAT_PROVIDES.get(missing, missing)}")
    if re.search(r"No CMAKE_CUDA_COMPILER could be found|Failed to find nvcc|CUDA Toolkit not found", log_text):
        return "CMake did not find the CUDA toolkit (nvcc); install it or put nvcc on PATH"
    m = re.search(r"CMake Error[^\n]*\n((?:[ \t]+[^\n]*\n|\n)+)", log_text)
    if m:
        return " ".join(m.group(1).split())[:300]
    return "see the log"


# ccache finds an object by its compile line, and CMake writes absolute paths into that line,
# so two copies of one ggml (a patched copy beside the original, `gradgate verify`'s buggy and
# fixed trees, a tree moved) shared no object: each copy compiled all of ggml again (56 s of
# wall time, alone on 2 cores here: bench/bench_build.py).
# The build reaches the tree through a link of this name in its staging folder instead, and
# ccache, told that folder is its base_dir, rewrites the paths under it relative to the build
# folder: every copy's compile lines read alike, and a copy that differs in one file compiles that
# file alone. The compiler then sees relative paths, which the build maps back: ggml's abort lines
# name ggml/src/... (native/CMakeLists.txt), a build error names the file in the user's tree.
SOURCE_LINK = "ggml-source"


def _shared_object_source(ggml_root, staging, env):
    """The path to configure the build with, and env set for ccache to share objects between
    copies of one tree (see SOURCE_LINK); the tree itself where ccache is not used or no link
    can be made (a filesystem without symlinks: objects are then only shared per path)."""
    if not shutil.which("ccache"):
        return Path(ggml_root)
    link = Path(staging) / SOURCE_LINK
    try:
        link.symlink_to(Path(ggml_root).resolve(), target_is_directory=True)
    except OSError:
        return Path(ggml_root)
    env["CCACHE_BASEDIR"] = str(link.parent)
    # cwd (the staging folder's own) goes into the hash of a -g compile unless told not to
    env["CCACHE_NOHASHDIR"] = "1"
    return link


def _run_cmake(ggml_root, options, staging, progress):
    require_cmake()
    # resolved, so that the build folder and the link to the tree (the compiles' cwd and their
    # paths, which ccache relates: SOURCE_LINK) are spelled alike where the cache sits behind a link
    staging = Path(staging).resolve()
    work = staging / "work"
    log_path = staging / "build.log"
    started = time.time()
    env = dict(os.environ)
    jobs = str(os.cpu_count() or 2)
    # before anything is compiled: a compiler without the runtime cannot make a build that loads
    runtime = runtime_library(options.sanitize) if options.sanitize else None
    source = _shared_object_source(ggml_root, staging, env)
    with open(log_path, "wb") as log:
        if configure(source, options, work, log, progress, env, through_link=source != Path(ggml_root)) != 0:
            raise failed_build("configure", log_path, ggml_root, source)
        cmd = ["cmake", "--build", str(work), "--target", "gradgate", "--parallel", jobs]
        if run_logged(cmd, log, progress, "building ggml", env) != 0:
            raise failed_build("build", log_path, ggml_root, source)
    built = next((p for p in work.rglob(LIBRARY_NAME) if p.is_file()), None)
    if built is None:
        raise failed_build("build (no library produced)", log_path, ggml_root, source)
    shutil.copy2(built, staging / LIBRARY_NAME)
    shutil.rmtree(work)  # objects stay in ccache; the entry keeps only what is loaded
    info = {
        "ggml_root": str(ggml_root),
        "ggml_version": read_ggml_version(ggml_root),
        "options": asdict(options),
        "compiler": compiler_identity(),
        "build_seconds": round(time.time() - started, 1),
        "built_by_pid": os.getpid(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # explore draws rows at these (library/kernel_steps.py); the tree may be gone when it runs
        "simd_steps": list(kernel_steps.steps_in(ggml_root)),
    }
    if runtime:
        info["sanitizer_runtime"] = runtime    # what a worker preloads (library/sanitizer.py)
    return info


LOW_SPACE = 50 << 20


def _free_bytes(path):
    try:
        return shutil.disk_usage(Path(path).parent).free
    except OSError:
        return LOW_SPACE


def in_users_tree(text, ggml_root, source):
    """The build log's paths into `source` (the staging folder's link to the tree, absolute, or
    relative to a build folder as ccache rewrote them) as paths into the user's tree, ggml_root."""
    source = Path(source)
    if source == Path(ggml_root):
        return text
    root = str(ggml_root).rstrip("/") + "/"
    text = text.replace(str(source) + "/", root)
    return re.sub(r"(?<![\w./-])(?:\.\./)+" + re.escape(source.name) + "/", lambda m: root, text)


def failed_build(step, staging_log, ggml_root, source=None):
    text = in_users_tree(Path(staging_log).read_text(errors="replace"), ggml_root, source or ggml_root)
    # keep the log outside the staging folder, which is removed on failure; on a full disk
    # that may fail too: the message still carries the log's tail
    kept = builds_dir() / "failed" / f"{int(time.time())}-{os.getpid()}.log"
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(text)
    except OSError:
        kept = None
    # a compiler's first error explains the rest, which the tail alone may not show
    first = re.search(r"^\S.*?:\d+:\d+: (?:fatal )?error: .*$", text, re.M)
    where = f": {first.group(0)}" if first else ""
    if "No space left on device" in text or _free_bytes(staging_log) < LOW_SPACE:
        # CMake, ninja and the compilers do not all say so when a write fails for want of space
        where += f" (No space left on device, or nearly: free space in {builds_dir()}, or {CACHE_HINT})"
    tail = "\n".join(text.splitlines()[-25:])
    return BuildError(f"CMake {step} of ggml at {ggml_root} failed{where}", log_path=kept, log_tail=tail)
