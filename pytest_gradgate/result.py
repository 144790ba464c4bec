"""Result: plain data about how one case ended. Built in the worker, read by the reports."""

import re
import time
from dataclasses import asdict, dataclass, field



@dataclass
class Result:
    case_id: str
    name: str
    consumer: str
    loss: str
    backend: str
    op: str = ""
    status: str = "error"
    phase: str = "build-forward"     # where it stopped; "done" when it got through compare
    maa: float = None
    max_maa: float = None
    limit: float = None
    cosine: float = None
    n_compared: int = 0
    power: bool = None
    blind_params: list = field(default_factory=list)
    diagnosis: str = ""
    message: str = ""
    params: list = field(default_factory=list)
    loss_value: float = None
    signal: str = None
    no_backward: bool = False       # crashed because ggml has no backward for an op
    stderr_tail: str = ""
    duration: float = 0.0
    mode: str = "full"
    origin: dict = field(default_factory=dict)

    @classmethod
    def for_case(cls, case):
        from .expr import main_op, parse_graph
        return cls(case.id, case.name, case.consumer, case.loss, case.backend, op=main_op(parse_graph(case.graph)),
                   max_maa=case.max_maa, mode=case.mode, origin=dict(case.origin))

    def finish(self, status, phase, message=None, started=None):
        self.status = status
        self.phase = phase
        if message is not None:
            self.message = message
        if started is not None:
            self.duration = time.perf_counter() - started
        return self

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


_NO_BACKWARD = [
    re.compile(r"unsupported ggml op for backward pass: (\w+)"),
    re.compile(r"unsupported (?:unary|glu) op for backward pass: (\w+)"),
    re.compile(r"backward pass for (\w+(?: \w+)?) not implemented"),
    re.compile(r"(\w+) backward pass not implemented"),
]
_GGML_MESSAGE = re.compile(r"^(\S+:\d+: .*)$", re.M)
# C's assert() (live in Debug builds): "prog: file.cpp:2777: void f(...): Assertion `x' failed."
_C_ASSERT = re.compile(r"^\S+: (\S+:\d+: .*Assertion .* failed\.?)$", re.M)


def ggml_message(stderr):
    """ggml's own abort line (`ggml.c:6662: GGML_ASSERT(...) failed`), or a failed C assert()."""
    found = _GGML_MESSAGE.findall(stderr or "") or _C_ASSERT.findall(stderr or "")
    return found[-1].strip() if found else ""


def explain_crash(phase, stderr):
    """What a dead child's phase and stderr say about why it died."""
    if phase == "build-backward":
        for pattern in _NO_BACKWARD:
            m = pattern.search(stderr or "")
            if m:
                return f"no backward for {m.group(1).upper()} in this ggml", True
    msg = ggml_message(stderr)
    if msg:
        return f"ggml aborted in phase {phase}: {msg}", False
    return f"died in phase {phase}", False
