"""What a build is made with: the options that go into its cache key.

Kept apart from cmake.py so that the plugin's options can name the choices without
importing the build machinery (the plugin must stay cheap to load)."""

from dataclasses import dataclass

BUILD_TYPES = ("Release", "Debug", "RelWithDebInfo")
BACKENDS = ("cpu", "cuda")


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

    def cmake_args(self):
        args = [f"-DCMAKE_BUILD_TYPE={self.build_type}"]
        if "cuda" in self.backends:
            args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={self.cuda_arch}"]
        return args + list(self.extra_cmake_args)
