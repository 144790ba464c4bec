"""Case: the plain, JSON-serialisable description of one check. Nothing else crosses
from the collector into the isolated worker and its engine."""

import functools
import os
from dataclasses import dataclass, field, fields

DEFAULT_EPS = 1e-1          # as test-backend-ops: inputs are O(1), so h = 0.1 keeps roundoff small
DEFAULT_MAX_MAA = 1e-4      # test-backend-ops' limit
DEFAULT_STENCIL = 4         # 4-point: also yields the 2-point estimate, whose gap estimates the error
DEFAULT_INIT = (-1.0, 1.0)
# ggml's CPU kernels split rows between threads (ith/nth): the analytic backward runs on this
# many, so a kernel that loses or doubles a row at a thread boundary disagrees with the finite
# differences (whose forwards run on one thread). 3, not 2: with 3 threads a case of 3 or more
# rows has a boundary inside every split that 2 threads would make, and more.
DEFAULT_THREADS = 3

# full mode evaluates the graph `stencil` times per param element, each time over the whole
# graph: its cost grows with the square of the size. Beyond this it runs for hours and
# may not even fit in memory; fast mode (random directions) is for such cases
MAX_FULL_ELEMENTS = 100_000


def full_mode_problem(case):
    """Why `case` is too large for full mode (with its estimated cost), or None."""
    n = case.n_param_elements()
    if case.mode != "full" or n <= MAX_FULL_ELEMENTS:
        return None
    return (f"full mode is for up to {MAX_FULL_ELEMENTS:,} param elements; this case has {n:,}: "
            f"{n * case.stencil:,} evaluations of its whole graph (the work grows with the square of "
            "the size); use mode: fast (random directions), or smaller params")


# What a case needs at the least for each param element: its f32 value in ggml, its f32
# gradient, and the host copy of the values it is set from. The whole run needs more (the
# graph's other tensors, the comparison's arrays): a case above this never fits.
MIN_BYTES_PER_PARAM_ELEMENT = 12


def machine_memory():
    """This machine's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n):
    return f"{n / (1 << 30):,.1f} GiB"


def memory_problem(case, cap=0):
    """Why `case` cannot fit in memory (the --gradgate-max-memory cap, else the machine's), or None."""
    n = case.n_param_elements()
    need = MIN_BYTES_PER_PARAM_ELEMENT * n
    limits = [(cap, "--gradgate-max-memory allows")] if cap else []
    limits.append((machine_memory(), "this machine has"))
    for limit, what in limits:
        if limit and need > limit:
            return (f"needs at least {_gib(need)} ({MIN_BYTES_PER_PARAM_ELEMENT} bytes for each of its {n:,} param "
                    f"elements: the values, their gradients, a host copy), more than the {_gib(limit)} {what}; "
                    "use smaller params")
    return None


@dataclass
class Case:
    name: str
    graph: list                         # "name = expr" lines; the last line is the output
    params: dict                        # name -> ne (1..4 sizes): f32 tensors that get gradients
    inputs: dict = field(default_factory=dict)   # name -> {"type": "i32"|"f32", "values"|"shape", "init"}
    init: dict = field(default_factory=dict)     # param name -> [lo, hi] or {"abs": [lo, hi]}
    consumer: str = "none"
    producer: str = "none"              # what every param it lays out goes through before the op
    loss: str = "sqr"
    eps: float = DEFAULT_EPS
    stencil: int = DEFAULT_STENCIL
    max_maa: float = DEFAULT_MAX_MAA
    seed: int = 0
    backend: str = "cpu"
    mode: str = "full"                  # "full": every element; "fast": random directions; "equivalence"; "parity"
    directions: int = 6                 # fast mode: how many directions
    timeout: float = 0.0                # seconds; 0 = sized from the case by the runner
    threads: int = DEFAULT_THREADS      # CPU threads of the analytic backward (forwards: one)
    # the memory the backward also runs in besides its own (check/regimes.py, --gradgate-alloc)
    alloc: str = "all"
    builtin: bool = False               # from the built-in suite (no backward -> skip, not fail)
    origin: dict = field(default_factory=dict)   # {"path": ..., "line": ...}, for reports only
    # an equivalence case (mode "equivalence"): formulation name -> graph, compared with each
    # other instead of with finite differences; `graph` is then the first formulation
    equivalent: dict = field(default_factory=dict)
    # ops the case file declares by their C prototype (a fork's own): name -> prototype
    ops: dict = field(default_factory=dict)
    # what the backend's f32 matmuls round their inputs to, for the roundoff limits of the
    # comparisons of analytic gradients (check/precision.py): "f32" or "tf32"
    matmul_precision: str = "f32"
    # one side of a parity item (mode "parity", gate/parity.py): the worker writes the case's
    # analytic gradients to this .npz file (check/analytic.py) and takes no finite differences
    gradients_out: str = ""

    @functools.cached_property
    def op(self):
        """The op the case is about: the outermost call of its graph's last line (kept once asked)."""
        return _main_op(tuple(self.graph) if isinstance(self.graph, list) else self.graph)

    @property
    def id(self):
        return f"{self.name}[{self.variant}]"

    @property
    def variant(self):
        # a contiguous input adds nothing, so that ids from before producers existed still select
        source = "" if self.producer == "none" else f"from_{self.producer}-"
        return f"{source}{self.consumer}-{self.loss}-{self.backend}"

    def to_dict(self):
        # a shallow copy: nothing mutates a Case's values, and asdict's deep copy of every
        # list and dict showed in the profile of each case's trip to the worker
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def n_param_elements(self):
        total = 0
        for shape in self.params.values():
            n = 1
            for x in shape:
                n *= int(x)
            total += n
        return total


_FIELD_NAMES = tuple(f.name for f in fields(Case))


class LoadedCase:
    """One YAML mapping after validation: its Cases and where it was declared. (Here, not
    in the loader, so that a remembered collection unpickles without importing YAML.)"""

    def __init__(self, name, path, line, cases):
        self.name, self.path, self.line, self.cases = name, path, line, cases


@functools.lru_cache(maxsize=4096)
def _main_op(graph):
    # parsed once per graph: the variants of a YAML entry (its consumers, producers, losses)
    # share it, and a run asks for it once per case
    from pytest_gradgate.declare.expr import main_op, parse_graph
    return main_op(parse_graph(graph))
