"""`gradgate build`: build ggml + the shim for a source and print where the library is.

For CI caching: the first line printed is the library's path, the rest is its build-info.
`--configure-only` runs CMake's configure step alone in a temporary folder (e.g. to check
that a CUDA build configures on a machine without a GPU) and caches nothing.
Errors are one line on stderr (plus the build log's tail for a failed build), exit code 1.
"""

import argparse
import shutil
import sys
import tempfile

from .build import BUILD_TYPES, BuildOptions, configure_only, ensure_build, gpu_visible
from .errors import GradgateError
from .source import resolve_source

PROG = "gradgate build"
BACKENDS = ("cpu", "cuda", "all")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # one line and exit 1, like every other error of this command
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def parser():
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--ggml-src", metavar="PATH",
                   help="a ggml or llama.cpp checkout (default: $GRADGATE_GGML_SRC, else the pinned ggml 0.15.3)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="cpu (default), cuda or all (cpu + cuda)")
    p.add_argument("--build-type", choices=BUILD_TYPES, default="Release", help="CMake build type (default Release)")
    p.add_argument("--cuda-arch", default="native",
                   help="CMAKE_CUDA_ARCHITECTURES for a CUDA build, e.g. 90 (default: native, needs a visible GPU)")
    p.add_argument("--configure-only", action="store_true",
                   help="only run CMake configure, in a temporary folder; build and cache nothing")
    return p


def options_from(args):
    backends = ("cpu", "cuda") if args.backend in ("cuda", "all") else ("cpu",)
    if "cuda" in backends and args.cuda_arch == "native" and not gpu_visible():
        raise GradgateError(f"--backend {args.backend} --cuda-arch native needs a visible NVIDIA GPU and there is "
                            "none here; give the architecture to build for, e.g. --cuda-arch 90")
    return BuildOptions(build_type=args.build_type, backends=backends, cuda_arch=args.cuda_arch)


def _progress(text):
    print(f"gradgate: {text}", file=sys.stderr, flush=True)


def run(args):
    source = resolve_source(args.ggml_src, option_name="--ggml-src")
    options = options_from(args)
    if args.configure_only:
        work = tempfile.mkdtemp(prefix="gradgate-configure-")
        values = configure_only(source.root, options, work, progress=_progress)  # keeps `work` on failure (log)
        shutil.rmtree(work, ignore_errors=True)
        print(f"configured ggml {source.version} from {source.label} (nothing built)")
        keys = ["CMAKE_BUILD_TYPE", "GGML_CUDA"] + (["CMAKE_CUDA_ARCHITECTURES", "CMAKE_CUDA_COMPILER"]
                                                    if "cuda" in options.backends else [])
        print(" ".join(f"{k}={values.get(k, '')}" for k in keys))
        return 0
    build = ensure_build(source.root, options, progress=_progress)
    print(build.library)
    info = dict(build.info)
    info["cached"] = build.cached
    for key in sorted(info):
        print(f"{key}: {info[key]}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(parser().parse_args(argv))
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except GradgateError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (nothing was published)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
