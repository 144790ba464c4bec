"""Result: plain data about how one case ended. Built in the worker, read by the reports."""

import time
from dataclasses import dataclass, field, fields

from pytest_gradgate.check.outcome import Diagnosis, Phase, Status


@dataclass
class Result:
    case_id: str
    name: str
    consumer: str
    loss: str
    backend: str
    op: str = ""
    producer: str = "none"
    status: Status = Status.ERROR
    phase: Phase = Phase.BUILD_FORWARD   # where it stopped; DONE when it got through compare
    maa: float = None
    max_maa: float = None
    limit: float = None
    cosine: float = None
    n_compared: int = 0
    power: bool = None
    blind_params: list = field(default_factory=list)
    # scramble of the op's incoming gradient -> param -> the MAA a backward reading it would show
    power_scrambles: dict = field(default_factory=dict)
    kind: Diagnosis = Diagnosis.NONE    # what kind of wrong; `diagnosis` says it in words
    # the ggml op a memory check verified at fault (the node that wrote past a tensor or left
    # elements unwritten, check/memory.py): explore keys such a finding by it, not by the case's op
    culprit: str = ""
    diagnosis: str = ""
    message: str = ""
    params: list = field(default_factory=list)
    loss_value: float = None
    signal: str = None
    stderr_tail: str = ""
    duration: float = 0.0
    # seconds per phase inside the engine, and the forward evaluations of the full-mode numeric
    # phase: what bench/ divides by (not in the reports)
    timings: dict = field(default_factory=dict)
    evaluations: int = 0
    evaluations_halved: int = 0      # ... and those of the halved step, taken before a failure is blamed
    lanes: int = 1                   # copies of the forward graph the numeric phase ran on (check/lanes.py)
    mode: str = "full"
    # equivalence cases (check/equivalence.py): the formulations, the forwards' comparisons
    # (one per pair), and the worst NMSE of a gradient against its roundoff limit
    formulations: list = field(default_factory=list)
    forward: list = field(default_factory=list)
    nmse: float = None
    threads: int = 1                 # CPU threads the analytic backward ran on
    # the allocation regimes the backward also ran in (check/regimes.py): [{regime, agrees, aliases}]
    alloc: list = field(default_factory=list)
    # isolate=case: the cases this one's child ran before it (each passed); every verdict
    # other than passed is a fresh child's, 0 (isolation/worker.py)
    earlier_in_child: int = 0
    # ... and this is a fresh child's run of a case that a child with earlier cases did not pass
    rerun: bool = False
    origin: dict = field(default_factory=dict)

    @classmethod
    def for_case(cls, case):
        return cls(case.id, case.name, case.consumer, case.loss, case.backend, op=case.op,
                   producer=case.producer,
                   max_maa=case.max_maa, mode=case.mode, threads=case.threads, origin=dict(case.origin),
                   formulations=list(case.equivalent))

    def finish(self, status, phase, message=None, started=None):
        self.status = status
        self.phase = phase
        if message is not None:
            self.message = message
        if started is not None:
            self.duration = time.perf_counter() - started
        return self

    @property
    def no_backward(self):
        """It crashed because the ggml under test has no backward for an op."""
        return self.kind == Diagnosis.NO_BACKWARD

    def to_dict(self):
        """Plain data (str, not the enums): it crosses pipes, xdist's execnet and JSON."""
        data = {name: getattr(self, name) for name in _FIELD_NAMES}   # shallow: see Case.to_dict
        for key in ("status", "phase", "kind"):
            data[key] = str(data[key])
        return data

    @classmethod
    def from_dict(cls, data):
        result = cls(**data)
        result.status, result.phase, result.kind = Status(result.status), Phase(result.phase), Diagnosis(result.kind)
        return result


_FIELD_NAMES = tuple(f.name for f in fields(Result))
