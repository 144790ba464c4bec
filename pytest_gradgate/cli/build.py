"""Build ggml + the shim for a source and print the library's path.

stdout is the path alone (for scripts and CI caches: `lib=$(gradgate build)`); progress goes
to stderr, and `-v` adds the build's details there. `--configure-only` runs CMake's configure
step alone in a temporary folder (e.g. to check that a CUDA build configures on a machine
without a GPU) and caches nothing.
"""

import shutil
import sys
import tempfile

from pytest_gradgate.library.options import BUILD_TYPES, SANITIZERS, BuildOptions
from pytest_gradgate.errors import SourceError, UsageError

BACKENDS = ("cpu", "cuda", "all")


def add_arguments(p):
    p.add_argument("--ggml-src", metavar="PATH",
                   help="a ggml or llama.cpp checkout (default: $GRADGATE_GGML_SRC, else the pinned ggml 0.15.3)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="cpu (default), cuda or all (cpu + cuda)")
    p.add_argument("--build-type", choices=BUILD_TYPES, default="Release", help="CMake build type (default Release)")
    p.add_argument("--cuda-arch", default="native",
                   help="CMAKE_CUDA_ARCHITECTURES for a CUDA build, e.g. 90 (default: native, needs a visible GPU)")
    p.add_argument("--sanitize", choices=SANITIZERS, default="",
                   help="build with this sanitizer, as pytest --gradgate-sanitize does (default: none)")
    p.add_argument("--configure-only", action="store_true",
                   help="only run CMake configure, in a temporary folder; build and cache nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="print the build's details on stderr")


def options_from(args):
    from pytest_gradgate.library.cmake import gpu_visible
    from pytest_gradgate.library.options import build_backends
    backends = build_backends(("cpu", "cuda") if args.backend == "all" else (args.backend,))
    if "cuda" in backends and args.cuda_arch == "native" and not gpu_visible():
        raise UsageError(f"--backend {args.backend} --cuda-arch native needs a visible NVIDIA GPU and there is "
                         "none here; give the architecture to build for, e.g. --cuda-arch 90")
    if "cuda" in backends and args.sanitize:
        raise UsageError(f"--sanitize {args.sanitize} builds the CPU backend only; use --backend cpu")
    return BuildOptions(build_type=args.build_type, backends=backends, cuda_arch=args.cuda_arch,
                        sanitize=args.sanitize)


def _progress(text):
    print(f"gradgate: {text}", file=sys.stderr, flush=True)


def source_from(args):
    """The source --ggml-src names (the default when none); a bad one is a usage error."""
    from pytest_gradgate.library.source import resolve_source
    try:
        return resolve_source(args.ggml_src, option_name="--ggml-src")
    except SourceError as exc:
        raise UsageError(str(exc)) from None


def run(args):
    from pytest_gradgate.library.cmake import configure_only, ensure_build
    source = source_from(args)
    options = options_from(args)
    if args.configure_only:
        work = tempfile.mkdtemp(prefix="gradgate-configure-")
        values = configure_only(source.root, options, work, progress=_progress)  # keeps `work` on failure (log)
        shutil.rmtree(work, ignore_errors=True)
        print(f"configured ggml {source.version} from {source.label} (nothing built)")
        keys = ["CMAKE_BUILD_TYPE", "GGML_CUDA"] + (["CMAKE_CUDA_ARCHITECTURES", "CMAKE_CUDA_COMPILER"]
                                                    if "cuda" in options.backends else [])
        keys += ["CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"] if options.sanitize else []
        print(" ".join(f"{k}={values.get(k, '')}" for k in keys))
        return 0
    build = ensure_build(source.root, options, progress=_progress)
    print(build.library)
    if args.verbose:
        info = dict(build.info, cached=build.cached)
        for key in sorted(info):
            print(f"{key}: {info[key]}", file=sys.stderr)
    return 0
