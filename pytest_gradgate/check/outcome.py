"""The small vocabularies of a Result: how a case ended, where it stopped, and what kind of
wrong the diagnosis found. Code branches on these, never on a message's wording.

Each is a `str` enum, so a Result stays plain JSON (the value is the string) and a value read
back from JSON compares equal to its member."""

from enum import Enum


class _Word(str, Enum):
    def __str__(self):          # f-strings and reports show the value, on every Python
        return self.value


class Status(_Word):
    PASSED = "passed"
    FAILED = "failed"           # the comparison failed: wrong gradient
    CRASHED = "crashed"         # the case's process died (abort, signal)
    TIMEOUT = "timeout"
    ERROR = "error"             # the harness could not run the case (worker start, allocation, ...)
    SKIPPED = "skipped"
    # the case's consumer cannot carry a gradient in this ggml even with no op before it
    # (check/selfcheck.py): nothing is known about the op, and the op is not blamed
    CONSUMER_FAILED = "consumer-failed"
    # the mirror: the case's producer cannot carry a gradient to its leaf with no op after it
    PRODUCER_FAILED = "producer-failed"
    # the comparison disagreed only where the finite differences are not evidence (a step
    # across a kink, pole or jump, check/reliability.py): the backward is not blamed
    NUMERIC_UNRELIABLE = "numeric-unreliable"
    # fast mode: the directions compared are no evidence either way (too few, or noise
    # dominates the limit, or they disagree where no sampled element does)
    INCONCLUSIVE = "inconclusive"


# statuses that make a case red (and that a baseline may record as known)
FAILING = frozenset({Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.ERROR, Status.CONSUMER_FAILED,
                     Status.PRODUCER_FAILED})


class Phase(_Word):
    STARTUP = "startup"             # before the case reached ggml (worker start, fork)
    LOAD_LIBRARY = "load-library"   # the worker dlopens the build
    BUILD_FORWARD = "build-forward"
    # the op's forward alone with its params through the case's producer: an abort here is the
    # forward rejecting that input layout (a contiguity assert), nothing about the backward
    PRODUCER_FORWARD = "producer-forward"
    PRODUCER_CHECK = "producer-check"   # the producer alone, from a param's leaf to the loss
    CONSUMER_CHECK = "consumer-check"   # the consumer alone, on a stand-in for the op's output
    BUILD_BACKWARD = "build-backward"
    COMPUTE = "compute"
    NUMERIC = "numeric"
    COMPARE = "compare"
    # the backward again in training's memory (check/regimes.py): ggml's graph allocator, forced aliases
    ALLOCATION = "allocation"
    GGML_OPT = "ggml-opt"           # the case trained by ggml-opt itself (check/regimes.py)
    DONE = "done"                   # got through compare
    UNKNOWN = "unknown"             # the worker died while its child ran the case: where it was is lost


class Diagnosis(_Word):
    """What kind of wrong a failed (or suspicious) case shows; the text says the details."""
    NONE = ""
    WRONG_POSITIONS = "wrong-positions"   # right values at wrong positions: strides or order
    WRONG_SCALE = "wrong-scale"
    WRONG_SIGN = "wrong-sign"
    DROPPED = "dropped"                   # analytic zero where the numeric one is not
    # at every element that disagrees, and only there, the numeric gradient is zero and the
    # analytic is not (a mask not applied: max-pool's other elements, a clamp's flat part) ...
    UNMASKED = "gradient-where-zero"
    # ... or the analytic is zero and the numeric is not (a gradient lost for some elements only)
    LOST = "gradient-lost"
    CONCENTRATED = "concentrated"         # a few elements hold the error, the others agree (named)
    # each (i2, i3) slice that disagrees is, whole, the numeric gradient of another slice: a batch
    # written or read at another batch's place (dims 2 and 3 confused, an offset of a batch off)
    BATCH_MISPLACED = "batch-misplaced"
    # the memory checks (check/memory.py, check/determinism.py): facts of the run, not of the values
    OUT_OF_BOUNDS_WRITE = "out-of-bounds-write"   # a guard zone beside a tensor changed
    UNWRITTEN = "unwritten-elements"      # a kernel left elements of its output unwritten
    NONDETERMINISTIC = "nondeterministic"  # two runs (thread counts) of the backward disagree
    # the gradients change when an op's output lies over one of its sources, as training's graph
    # allocator lays it (check/regimes.py): the kernel reads that source after writing there
    ALIAS = "alias"
    DISAGREE = "disagree"                 # none of the above
    FORWARD_DIFFERS = "forward-differs"   # equivalence: the formulations' outputs differ; no gradient claim
    NONFINITE_BACKWARD = "nonfinite-backward"
    NONFINITE_LOSS = "nonfinite-loss"     # the forward is out of its domain: nothing to blame
    SAMPLE_AGREES = "sample-agrees"       # fast mode: directions disagree, no sampled element does
    BLIND = "blind"                       # passed, but a scrambled gradient would pass too
    NO_BACKWARD = "no-backward"           # ggml has no backward for an op
    GGML_ABORT = "ggml-abort"             # ggml aborted with a message
    SANITIZER = "sanitizer"               # a sanitizer build's report ended the case (--gradgate-sanitize)
    DIED = "died"                         # died without a ggml message
    HUNG = "hung"
    CONSUMER_FAILS = "consumer-fails"     # the consumer's own backward aborts or is wrong
    PRODUCER_FAILS = "producer-fails"     # the producer's own backward aborts or is wrong
    FORWARD_REJECTS_LAYOUT = "forward-rejects-layout"   # the op's forward asserts on the producer's layout
    FORWARD_WRONG_ON_LAYOUT = "forward-wrong-on-layout"   # ... or gives other values on it than on a copy
    NUMERIC_UNRELIABLE = "numeric-unreliable"   # the finite differences are not evidence here
    INCONCLUSIVE = "inconclusive"         # fast mode: too little evidence to pass or to fail
    BROKEN_BUILD = "broken-build"         # the worker cannot load the library: no case can run
    WORKER_START = "worker-start"         # the worker could not start


# kinds that, behind a non-contiguous consumer, point at a backward that ignores grad's strides
STRIDE_SUSPECTS = frozenset({Diagnosis.DISAGREE, Diagnosis.WRONG_SCALE, Diagnosis.WRONG_SIGN})


# One misreading backward shows as any of these, by the draw: for matching a known failure (a
# baseline's entry, explore's key) they are one kind
MISREAD = "misread"
_MISREAD_KINDS = frozenset({Diagnosis.DISAGREE, Diagnosis.WRONG_POSITIONS, Diagnosis.CONCENTRATED,
                            Diagnosis.BATCH_MISPLACED})


def kind_family(kind):
    """A failure's kind as a known failure is matched by: the misread kinds are one."""
    kind = Diagnosis(str(kind or Diagnosis.DISAGREE))
    return MISREAD if kind in _MISREAD_KINDS else str(kind)
