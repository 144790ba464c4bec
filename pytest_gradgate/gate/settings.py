"""Every setting of the plugin: one help text each, shared by the option and the ini key.

Precedence: command line > environment (GRADGATE_*) > ini (gradgate_*) > default. Every
validation error names where the bad value came from.
"""

import os
from dataclasses import dataclass

import pytest

from pytest_gradgate.library.options import BUILD_TYPES, SANITIZERS
from pytest_gradgate.isolation.protocol import ISOLATE_MODES


@dataclass(frozen=True)
class Setting:
    name: str              # option --gradgate-NAME, ini gradgate_NAME, env GRADGATE_NAME
    help: str
    default: object = None
    choices: tuple = None
    kind: str = "string"   # string, int, float, size, bool, paths
    minimum: int = None    # an int's least value
    maximum: float = None  # a number's largest value

    @property
    def option(self):
        return "--gradgate-" + self.name.replace("_", "-")

    @property
    def dest(self):
        return "gradgate_" + self.name

    @property
    def env(self):
        return "GRADGATE_" + self.name.upper()


SETTINGS = [
    Setting("ggml_src", "ggml source under test: a ggml or llama.cpp checkout, or a pinned source by name "
            "(ggml-0.15.3, the default; ggml-0.26.0, the newest on PyPI)"),
    Setting("reference_src", "a reference ggml source (a checkout, or a pinned source by name): every case becomes a "
            "parity item, its analytic gradients computed on the tree under test and on this tree and compared, "
            "without finite differences"),
    Setting("tf32", "backends whose f32 matmuls round their inputs to TF32, comma-separated, or none (default: "
            "cuda, as ggml-cuda's cuBLAS calls do): the roundoff limits of the analytic comparisons allow for it",
            "cuda"),
    Setting("backend", "backend(s) to check on: cpu, cuda or all", "cpu", ("cpu", "cuda", "all")),
    Setting("build_type", "CMake build type of ggml; Debug turns ggml's assert()s on", "Release", BUILD_TYPES),
    Setting("cuda_arch", "CMAKE_CUDA_ARCHITECTURES for a CUDA build", "native"),
    Setting("sanitize", "build ggml and the shim with a sanitizer, a build of its own, and run the workers with its "
            "runtime: address (ASan: reads and writes outside an allocation) or undefined (UBSan: undefined "
            "behaviour); a report fails the case, naming the error and the first frame in ggml (CPU only, "
            "default: none)", None, SANITIZERS),
    Setting("cases", "extra YAML case files (repeatable)", (), kind="paths"),
    Setting("isolate", "case: each case in a forked child; a child whose case passed takes the next, any "
            "other verdict comes from a fresh child (default); fresh: a fresh child for every case; worker: run in "
            "a worker process; none: in-process, for debuggers", "case", ISOLATE_MODES),
    Setting("jobs", "cases run at once in this pytest process, each in its own worker (default 0: one per CPU, "
            "at most 8; 1 in each pytest-xdist worker)", 0, kind="int", minimum=0),
    Setting("timeout", "per-case timeout in seconds, at most 86400 (default: sized to the case)", 0.0, kind="float",
            maximum=86400),
    Setting("max_memory", "cap on a case's memory, e.g. 2G or 512M, at most 1048576G (default: none)", 0,
            kind="size"),
    Setting("backtrace", "let ggml print backtraces when a case aborts (slow; attaches gdb), and let a crash "
            "dump core as ulimit -c allows", False, kind="bool"),
    Setting("mode", "full: check every element; fast: random directions (large tensors)", None, ("full", "fast")),
    Setting("alloc", "the memory each case's backward also runs in besides its own: all (default), graph (ggml's "
            "graph allocator with its in-place reuse, as ggml-opt lays out a training step), forced (each in-place "
            "op's output laid over each source it may legally take), ggml-opt (the case trained by ggml-opt itself, "
            "two micro-batches accumulated) or own (memory of its own only)", "all",
            ("all", "graph", "forced", "ggml-opt", "own")),
    Setting("crash_cap", "stop the run after this many cases in a row whose worker could not start", 3, kind="int"),
    Setting("baseline", "baseline file of known failures (default: the shipped one for the default ggml)"),
    Setting("json", "write a JSON report of every case to this path"),
    Setting("explore", "search random cases for this long (e.g. 60s, 10m) instead of running the suite; "
            "each distinct failure, shrunk, is one test item"),
    Setting("explore_seed", "seed of --gradgate-explore's search (default 0)", 0, kind="int"),
    Setting("explore_ops", "ops --gradgate-explore draws from, comma-separated (default: all)"),
    Setting("explore_jobs", "parallel jobs of --gradgate-explore, each with its own worker (default 1)", 1,
            kind="int"),
    Setting("explore_out", "write --gradgate-explore's findings as a case file plus JSON beside it"),
    Setting("explore_database", "Hypothesis example database of --gradgate-explore: earlier failures are "
            "replayed first (default: none)"),
    Setting("html", "write a self-contained HTML report to this path, with heatmaps of each failed gradient"),
]
BY_NAME = {s.name: s for s in SETTINGS}
# options whose value is a path: written with a space, pytest takes the value for a test path
# when it picks its rootdir, before it knows our options (see gate/rootdir.py)
PATH_OPTIONS = tuple(BY_NAME[n].option for n in ("ggml_src", "reference_src", "cases", "baseline", "json", "html", "explore_out",
                                                  "explore_database"))


def path_option_used(args):
    """Is any path-valued option of ours written with its value as the next argument?"""
    return any(a in PATH_OPTIONS for a in args[:-1])


def add_options(parser):
    group = parser.getgroup("gradgate", "gradgate: check ggml's backward pass")
    group.addoption("--gradgate", action="store_true", default=False,
                    help="run the gradient gate: the built-in cases and any case files")
    group.addoption("--gradgate-no-builtin", action="store_true", default=False,
                    help="do not collect the built-in suite")
    group.addoption("--gradgate-update-baseline", action="store_true", default=False,
                    help="write the baseline file from this run's failures")
    for s in SETTINGS:
        if s.kind == "bool":
            group.addoption(s.option, action="store_true", default=None, dest=s.dest, help=s.help)
        elif s.kind == "paths":
            group.addoption(s.option, action="append", default=None, dest=s.dest, help=s.help, metavar="PATH")
        else:
            group.addoption(s.option, default=None, dest=s.dest, help=s.help)
        parser.addini(s.dest, s.help, type="linelist" if s.kind == "paths" else "string")


MAX_SIZE = 1 << 50     # 1 PiB: more is no cap, and overflows setrlimit once the worker's size is added


def parse_size(text):
    text = str(text).strip().upper()
    factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = float(text[:-1] if text[-1:] in "KMG" else text)
    if not 0 <= number * factor <= MAX_SIZE:     # also refuses inf and nan
        raise ValueError
    return int(number * factor)


def _convert(s, value, where):
    try:
        if s.kind == "int":
            value = int(value)
        elif s.kind == "float":
            value = float(value)
            if not 0 <= value < float("inf"):  # also refuses nan
                raise ValueError
        elif s.kind == "size":
            value = parse_size(value)
        elif s.kind == "bool":
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise pytest.UsageError(f"{where}: '{value}' is not a valid value ({s.help})") from None
    if s.minimum is not None and value < s.minimum:
        raise pytest.UsageError(f"{where}: '{value}' is below {s.minimum} ({s.help})")
    if s.maximum is not None and value > s.maximum:
        raise pytest.UsageError(f"{where}: '{value}' is above {s.maximum:g} ({s.help})")
    if s.choices and value not in s.choices:
        raise pytest.UsageError(f"{where}: '{value}' is not one of {', '.join(s.choices)}")
    return value


def get(config, name):
    """A setting's effective value and where it came from."""
    s = BY_NAME[name]
    value = config.getoption(s.dest)
    if value not in (None, ()):
        return _convert(s, value, s.option) if s.kind != "paths" else list(value)
    if os.environ.get(s.env):
        raw = os.environ[s.env]
        return _convert(s, raw, f"environment {s.env}") if s.kind != "paths" else raw.split(os.pathsep)
    ini = config.getini(s.dest)
    if ini:
        return _convert(s, ini, f"ini {s.dest}") if s.kind != "paths" else list(ini)
    return s.default


def effective(config):
    return {s.name: get(config, s.name) for s in SETTINGS}
