"""Equivalence cases: two or more formulations of one computation must give one gradient.

    - name: kv_walk_equivalence
      params: {q: [...], k: [...], v: [...]}
      equivalent:
        chunked: [...lines...]      # chunks, each with a cached prefix concatenated
        whole: [...lines...]        # the same attention as one graph

Each formulation is built in a context of its own from the same Case (so the same param
and input values, check/engine.py build_leaves), through the case's consumer and loss,
and computed with one backward pass; no finite differences, so a case can have millions of
elements. The formulations' GradientSets are compared pairwise by check/gradsets.py,
the comparison a cross-backend parity check uses too: forwards first, then each param's
gradient against a limit from the f32 roundoff of the two computations (check/roundoff.py).

The consumer is not self-checked as in the finite-difference engine: it sits after every
formulation's output, whose values agree (the forwards are compared first), so each
formulation gets the same incoming gradient from it, right or wrong, and the comparison of
their backwards stands either way.
"""

import time
from itertools import combinations

import numpy as np

from pytest_gradgate.check import gradsets, memory, roundoff
from pytest_gradgate.check.ggml_graph import GraphBuilder, build_leaves, graph_tensors, read_tensor, write_tensor
from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.declare.expr import parse_graph
from pytest_gradgate.declare.graph import walk
from pytest_gradgate.ops.consumers import CONSUMERS
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.declared import table_for
from pytest_gradgate.ops.table import ne4


class _Stop(Exception):
    """A formulation that could not be computed: the Result says why."""

    def __init__(self, status, phase, message, kind=None, diagnosis="", culprit=""):
        super().__init__(message)
        self.status, self.phase, self.message = status, phase, message
        self.kind, self.diagnosis, self.culprit = kind, diagnosis, culprit

    def finish(self, result, started):
        if self.kind is not None:
            result.kind, result.diagnosis, result.culprit = self.kind, self.diagnosis, self.culprit
        return result.finish(self.status, self.phase, message=self.message, started=started)


def compute_formulation(case, lib, label, graph, phase):
    """One formulation's GradientSet: forward, consumer, loss, one backward on case.threads."""
    lines = parse_graph(graph)
    phase(Phase.BUILD_FORWARD)
    g = GraphBuilder(lib, case, n_tensors=graph_tensors(case, lines))
    session = None
    try:
        leaves, params, shapes, _ = build_leaves(g, case)
        y = walk(lines, leaves, lambda spec, tensors, p: spec.build(g, tensors, p), table_for(case.ops))
        z = g.contiguous(CONSUMERS[case.consumer].build(g, y))
        loss = LOSSES[case.loss].build(g, z)
        phase(Phase.BUILD_BACKWARD)
        gf = g.forward_graph(loss)
        gb = g.backward_graph(gf)
        grads = {name: lib.ggml_graph_get_grad(gb, t) for name, t in params.items()}
        phase(Phase.COMPUTE)
        err = g.ffi.new("char[256]")
        session = lib.gg_session_new(case.backend.encode(), case.threads, err, 256)
        if session == g.ffi.NULL:
            raise _Stop(Status.ERROR, Phase.COMPUTE, g.ffi.string(err).decode())
        unsupported = lib.gg_session_first_unsupported(session, g.ctx)
        if unsupported != g.ffi.NULL:
            name = g.ffi.string(lib.gg_tensor_op_name(unsupported)).decode()
            raise _Stop(Status.SKIPPED, Phase.COMPUTE, f"formulation '{label}': backend {case.backend} does not "
                        f"support {name} (ggml_backend_supports_op)")
        if not lib.gg_session_alloc(session, g.ctx):
            raise _Stop(Status.ERROR, Phase.COMPUTE, f"formulation '{label}': could not allocate the graph's tensors")
        for t, values in g.values:
            write_tensor(g, t, values)
        lib.ggml_graph_reset(gb)
        status = lib.gg_session_compute(session, gb)
        if status != 0:
            raise _Stop(Status.ERROR, Phase.COMPUTE, f"formulation '{label}': backward compute failed "
                        f"(ggml_status {status})")
        wrong_memory = (memory.guard_breach(g, session, gb, f"formulation '{label}''s forward and backward compute")
                        or memory.unwritten(g, session, gb))
        if wrong_memory is not None:
            raise _Stop(Status.FAILED, Phase.COMPUTE, f"{case.id}: formulation '{label}': {wrong_memory.summary}",
                        wrong_memory.kind, f"formulation '{label}': {wrong_memory.text}", wrong_memory.culprit)
        out_ne, _ = g.layout(y)
        # the leaves' shapes: through a producer (a parity side's case) a leaf is laid out otherwise
        shapes = {name: ne4(shapes[name]) for name in params}
        values = {name: (read_tensor(g, grads[name]) if grads[name] != g.ffi.NULL
                         else np.zeros(int(np.prod(shapes[name])))) for name in params}
        steps = roundoff.steps_of(case, graph)
        return gradsets.GradientSet(label, read_tensor(g, y), tuple(out_ne), values, shapes, steps.forward,
                                    steps.total, matmuls=steps.matmuls,
                                    forward_matmuls=steps.forward_matmuls, precision=case.matmul_precision)
    finally:
        if session is not None and session != g.ffi.NULL:
            lib.gg_session_free(session)
        g.free()


def run_case(case, lib, phase=lambda name: None):
    started = time.perf_counter()
    result = Result.for_case(case)
    sets = []
    try:
        for label, graph in case.equivalent.items():
            sets.append(compute_formulation(case, lib, label, graph, phase))
    except _Stop as stop:
        return stop.finish(result, started)
    phase(Phase.COMPARE)
    judge(result, case, [gradsets.compare_sets(a, b) for a, b in combinations(sets, 2)])
    return result.finish(result.status, Phase.DONE, started=started)


def judge(result, case, comparisons):
    """Fill result from pairwise comparisons: the forwards first, then the gradients."""
    result.power = None         # power is a finite-difference notion (a scrambled dL/dy); not measured here
    result.forward = [dict(c["forward"], pair=c["pair"]) for c in comparisons]
    differing = [c for c in comparisons if c["forward_differs"]]
    if differing:
        c = differing[0]
        f = c["forward"]
        what = (f"output shapes {f['shape_mismatch'][0]} and {f['shape_mismatch'][1]}" if "shape_mismatch" in f
                else f"NMSE {f['nmse']:.3g} > limit {f['limit']:.3g}, cosine {f.get('cosine', float('nan')):.4f}")
        result.kind = Diagnosis.FORWARD_DIFFERS
        result.diagnosis = (f"the forward differs: {c['pair']} compute different outputs ({what}), so they are not "
                            "formulations of one computation; no claim about their gradients is made")
        result.message = f"{case.id}: forward of {c['pair']} differs"
        result.nmse, result.limit = f["nmse"], f["limit"]
        result.status = Status.FAILED
        return
    failed = gradsets.settle(result, [m for c in comparisons for m in c["params"]])
    if not failed:
        return
    first = failed[0]
    result.diagnosis = f"{first['name']}: {first['pair']}: {first['diagnosis']}"
    result.message = (f"{case.id}: {first['pair']}: NMSE {first['nmse']:.3g} > limit {first['limit']:.3g} "
                      f"for param {first['name']}")
