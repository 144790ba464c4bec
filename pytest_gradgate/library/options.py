"""What a build is made with: the options that go into its cache key.

Kept apart from cmake.py so that the plugin's options can name the choices without
importing the build machinery (the plugin must stay cheap to load)."""

from dataclasses import dataclass

BUILD_TYPES = ("Release", "Debug", "RelWithDebInfo")
BACKENDS = ("cpu", "cuda")
# the file beside a published build's library that says what went into it (library/cmake.py)
BUILD_INFO = "build-info.json"

# --gradgate-sanitize: the compiler's sanitizers ggml and the shim can be built with. -g and
# frame pointers, so that a report names ggml's function and line; UBSan stops at its first
# report (it only prints and goes on by default, and a printed report would be no failure).
SANITIZER_FLAGS = {
    "address": ("-fsanitize=address", "-fno-omit-frame-pointer", "-g"),
    "undefined": ("-fsanitize=undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"),
}
SANITIZERS = tuple(SANITIZER_FLAGS)


def build_backends(run_backends):
    """The backends a build holds for a run on `run_backends`: ggml's CPU backend is in every
    build (GGML_CUDA=ON adds CUDA beside it), so cuda and all are one build."""
    return ("cpu", "cuda") if "cuda" in run_backends else ("cpu",)


@dataclass(frozen=True)
class BuildOptions:
    build_type: str = "Release"
    backends: tuple = ("cpu",)
    cuda_arch: str = "native"
    extra_cmake_args: tuple = ()
    # "" (none), or one of SANITIZERS. Left out of the cache key when empty (cmake.key_fields),
    # so the plain build keeps the key it had before this option existed
    sanitize: str = ""

    def cmake_args(self):
        args = [f"-DCMAKE_BUILD_TYPE={self.build_type}"]
        if "cuda" in self.backends:
            args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={self.cuda_arch}"]
        if self.sanitize:
            # through CMake's own flag variables, not native/CMakeLists.txt (which is in every
            # build's key): ggml's targets and the shim compile with them, and the shim's link
            # pulls in the sanitizer's runtime
            flags = " ".join(SANITIZER_FLAGS[self.sanitize])
            args += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}",
                     f"-DCMAKE_SHARED_LINKER_FLAGS={SANITIZER_FLAGS[self.sanitize][0]}"]
        return args + list(self.extra_cmake_args)
