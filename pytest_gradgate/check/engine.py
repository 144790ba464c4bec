"""The engine: one Case in, one Result out. Runs inside the isolated worker.

Build the forward graph from the case, put the consumer and the loss behind it, expand
the backward graph, compute analytic gradients on the case's backend, compute numeric
gradients in the shim's C loop, compare. `phase` is called as each stage starts so the
parent can say where a child died.
"""

import math
import time

import numpy as np

from pytest_gradgate.library import binding
from pytest_gradgate.check import alone, determinism, directional, lanes, memory, metrics, power, regimes, reliability, selfcheck
from pytest_gradgate.ops.consumers import CONSUMERS, check_consumer
from pytest_gradgate.ops.producers import laid_out_params
from pytest_gradgate.declare.expr import main_op, ops_used, parse_graph
from pytest_gradgate.declare.graph import walk
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.declared import table_for
from pytest_gradgate.ops.table import ne4
from pytest_gradgate.check.outcome import STRIDE_SUSPECTS, Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result
from pytest_gradgate.check.ggml_graph import GraphBuilder, build_leaves, forward_parts, graph_tensors, read_tensor, write_tensor

def _forward_takes(case, lib, lines):
    """Compute the case's forward alone with its params through the producer, and again from
    contiguous copies of the same views (ggml's CONT). An op whose forward rejects the layout (a
    constructor's or kernel's contiguity assert) aborts here, in Phase.PRODUCER_FORWARD, before
    anything about its backward is claimed. -> None, or what is wrong when the forward runs but
    gives other values on the layout than on the copy: then the finite differences would
    differentiate that wrong forward, and a disagreement would be blamed on the backward."""
    g = GraphBuilder(lib, case, n_tensors=128 + 32 * max(len(lines), len(ops_used(lines))) + 4 * len(case.params)
                     + len(case.inputs))
    session = None
    try:
        leaves, _, _, laid_out = build_leaves(g, case)
        y = walk(lines, leaves, lambda spec, tensors, p: spec.build(g, tensors, p), table_for(case.ops))
        copies = {name: (lib.ggml_cont(g.ctx, t) if name in laid_out else t) for name, t in leaves.items()}
        y_copy = walk(lines, copies, lambda spec, tensors, p: spec.build(g, tensors, p), table_for(case.ops))
        gf = g.forward_graph(LOSSES[case.loss].build(g, g.contiguous(y)))
        gf_copy = g.forward_graph(LOSSES[case.loss].build(g, g.contiguous(y_copy)))
        err = g.ffi.new("char[256]")
        session = lib.gg_session_new(case.backend.encode(), 1, err, 256)
        if session == g.ffi.NULL or not lib.gg_session_alloc(session, g.ctx):
            return None      # the case itself reports a backend that cannot start
        for t, values in g.values:
            write_tensor(g, t, values)
        # a status != 0 shows again in the case's own compute
        if lib.gg_session_compute(session, gf) != 0 or lib.gg_session_compute(session, gf_copy) != 0:
            return None
        return _forward_difference(read_tensor(g, y), read_tensor(g, y_copy), ne4(g.layout(y)[0]))
    finally:
        if session is not None and session != g.ffi.NULL:
            lib.gg_session_free(session)
        g.free()


# the same kernel on the same values, only laid out differently: a kernel may sum in another
# order on another layout, never by more than f32 roundoff over the row; a misread is O(1)
FORWARD_RTOL = 1e-4


def _forward_difference(on_layout, on_copy, ne):
    """None when the two forwards agree (NaN where both are NaN), else the largest difference."""
    same = (on_layout == on_copy) | (np.isnan(on_layout) & np.isnan(on_copy))
    scale = max(float(np.nanmax(np.abs(on_copy))) if on_copy.size and not np.isnan(on_copy).all() else 0.0,
                metrics.TINY)
    with np.errstate(invalid="ignore"):
        diff = np.abs(on_layout - on_copy)
        off = ~same & ~(diff <= FORWARD_RTOL * scale)
    if not off.any():
        return None
    i = int(np.argmax(np.where(off, np.nan_to_num(diff, nan=np.inf), -1.0)))
    return (f"{int(off.sum())} of {off.size} output values differ, e.g. at {metrics.ggml_index(i, ne)}: "
            f"{on_layout[i]:.6g} against {on_copy[i]:.6g}")


def run_case(case, lib, phase=lambda name: None):
    if case.gradients_out:  # one side of a parity item: analytic gradients only
        from pytest_gradgate.check import analytic
        return analytic.run_case(case, lib, phase)
    if case.equivalent:     # formulations against each other, no finite differences
        from pytest_gradgate.check import equivalence
        return equivalence.run_case(case, lib, phase)
    started = time.perf_counter()
    result = Result.for_case(case)
    lines = parse_graph(case.graph)
    result.op = main_op(lines)

    timings = result.timings
    clock = {"phase": None, "since": started}

    def enter(name):
        """phase() for the parent, and this phase's seconds for result.timings (bench/ reads them)."""
        now = time.perf_counter()
        if clock["phase"] is not None:
            timings[str(clock["phase"])] = timings.get(str(clock["phase"]), 0.0) + now - clock["since"]
        clock["phase"], clock["since"] = name, now
        if name is not None:
            phase(name)

    if laid_out_params(case.producer, {name: ne4(shape) for name, shape in case.params.items()}):
        enter(Phase.PRODUCER_FORWARD)
        wrong = _forward_takes(case, lib, lines)
        if wrong is not None:
            # a verified bug, of the forward: the backward is neither checked nor blamed
            result.kind = Diagnosis.FORWARD_WRONG_ON_LAYOUT
            result.diagnosis = (f"the op's forward gives other values with its input through producer "
                                f"'{case.producer}' than on a contiguous copy of the same input: {wrong}; the "
                                "forward mishandles this layout, so the backward was not checked")
            result.message = f"{case.id}: the forward is wrong on producer '{case.producer}'s layout"
            enter(None)
            return result.finish(Status.FAILED, Phase.PRODUCER_FORWARD, started=started)

    enter(Phase.BUILD_FORWARD)
    g = GraphBuilder(lib, case, n_tensors=graph_tensors(case, lines))
    session = None
    extra_lanes = []
    try:
        declared, laid_out, params, shapes, y = forward_parts(g, case, lines)
        if case.ops:    # a declared op's output shape was ggml's to say: the consumer is checked now
            why = check_consumer(case.consumer, tuple(g.layout(y)[0]))
            if why is not None:
                return result.finish(Status.ERROR, Phase.BUILD_FORWARD,
                                     message=f"{case.id}: consumer '{case.consumer}' cannot read this output: {why}",
                                     started=started)
        # an op whose output is a view (transpose, permute) would reach the loss's sqr kernel
        # non-contiguous, which ggml's CPU unary kernels reject; the cont makes the gradient
        # reach the op contiguous, which is what consumer `none` means
        z = g.contiguous(CONSUMERS[case.consumer].build(g, y))
        loss = LOSSES[case.loss].build(g, z)

        if laid_out:
            # before the op is blamed for anything: can the producer carry a gradient at all here?
            enter(Phase.PRODUCER_CHECK)
            for ne in dict.fromkeys(declared[name] for name in laid_out):    # once per shape
                why = selfcheck.check_producer(case, lib, ne, case.threads)
                if why is not None:
                    result.kind = Diagnosis.PRODUCER_FAILS
                    result.diagnosis = alone.producer_failure_text(case.producer, why)
                    return result.finish(Status.PRODUCER_FAILED, Phase.PRODUCER_CHECK, started=started)

        if case.consumer != "none":
            # before the op is blamed for anything: can the consumer carry a gradient at all here?
            enter(Phase.CONSUMER_CHECK)
            why = selfcheck.check(case, lib, g.layout(y), case.threads)
            if why is not None:
                result.kind = Diagnosis.CONSUMER_FAILS
                result.diagnosis = alone.failure_text(case.consumer, why)
                return result.finish(Status.CONSUMER_FAILED, Phase.CONSUMER_CHECK, started=started)

        enter(Phase.BUILD_BACKWARD)
        gf = g.forward_graph(loss)
        gb = g.backward_graph(gf)
        grads = {name: lib.ggml_graph_get_grad(gb, t) for name, t in params.items()}
        probe = _PowerProbe(g, y, gb, params)

        enter(Phase.COMPUTE)
        err = g.ffi.new("char[256]")
        # the backward on case.threads threads: a row lost or doubled at a thread boundary shows
        session = lib.gg_session_new(case.backend.encode(), case.threads, err, 256)
        if session == g.ffi.NULL:
            return result.finish(Status.ERROR, Phase.COMPUTE, message=g.ffi.string(err).decode(), started=started)
        unsupported = lib.gg_session_first_unsupported(session, g.ctx)
        if unsupported != g.ffi.NULL:
            name = g.ffi.string(lib.gg_tensor_op_name(unsupported)).decode()
            return result.finish(Status.SKIPPED, Phase.COMPUTE, message=f"backend {case.backend} does not support {name} "
                                 "(ggml_backend_supports_op)", started=started)
        if not lib.gg_session_alloc(session, g.ctx):
            return result.finish(Status.ERROR, Phase.COMPUTE, message="could not allocate the graph's tensors", started=started)
        for t, values in g.values:
            write_tensor(g, t, values)
        lib.ggml_graph_reset(gb)
        status = lib.gg_session_compute(session, gb)
        if status != 0:
            return result.finish(Status.ERROR, Phase.COMPUTE, message=f"backward compute failed (ggml_status {status})",
                                 started=started)
        # before any value is read: did a kernel write outside its tensor, or leave elements unwritten?
        checks_started = time.perf_counter()
        wrong_memory = (memory.guard_breach(g, session, gb, "forward and backward compute")
                        or memory.unwritten(g, session, gb))
        timings["memory-checks"] = time.perf_counter() - checks_started
        if wrong_memory is not None:
            return _memory_failure(result, case, wrong_memory, Phase.COMPUTE, started)
        loss_value = float(lib.gg_read_scalar(loss))

        def gradients():
            return {name: read_tensor(g, grads[name]) if grads[name] != g.ffi.NULL else np.zeros(int(np.prod(shapes[name])))
                    for name in params}
        analytic = gradients()
        checks_started = time.perf_counter()
        varies = _determinism(lib, session, gb, case, analytic, gradients)
        timings["determinism"] = time.perf_counter() - checks_started
        if not math.isfinite(loss_value):
            # every finite difference of a loss that is already NaN/Inf at the inputs is NaN/Inf
            # as well (the other elements stay where they are): they could tell nothing about
            # the backward, so they are not taken (test-backend-ops' init of expm1 up to +-150
            # overflows: 0.35 s of evaluations at 5,005 elements for no information)
            return _nonfinite_loss(result, case, loss_value, analytic, started)
        loss_scale = LOSSES[case.loss].scale(g, z, loss_value, lambda t: read_tensor(g, t))

        # the forwards of the finite differences on one: the reference must not share the bug
        # (a big case's are spread over lanes, copies of the graph each on one thread: lanes.py)
        lib.gg_session_set_n_threads(session, 1)
        needed = sum(int(np.prod(shapes[name])) * case.stencil for name in params)
        for _ in range(lanes.wanted(case, lib, session, gf, needed) - 1):
            try:
                extra_lanes.append(lanes.Lane(lib, case, lines, graph_tensors(case, lines)))
            except (MemoryError, lanes.LaneUnavailable):
                break       # the lanes made so far take every element
            if not all(extra_lanes[-1].same_values(name, read_tensor(g, t)) for name, t in params.items()):
                raise RuntimeError("a lane's copy of the graph holds other values than the case's")
        result.lanes = 1 + len(extra_lanes)
        enter(Phase.NUMERIC)
        checks = {}
        for name, t in params.items():
            checks[name] = _numeric(g, session, gf, t, loss, case, analytic[name], loss_scale, extra_lanes, name)
            result.evaluations += checks[name].get("evaluations", 0)
            if "lane_seconds" in checks[name]:
                timings["numeric-lane-cpu-seconds"] = timings.get("numeric-lane-cpu-seconds", 0.0) + checks[name]["lane_seconds"]

        # the finite differences' forwards, each on fresh values: a write outside a tensor persists
        checks_started = time.perf_counter()
        breach = memory.guard_breach(g, session, gf, "finite differences' forward computes") or next(
            (b for b in (memory.guard_breach(lane.g, lane.session, lane.gf, "finite differences' forward computes "
                                             "(a lane's copy of the graph)") for lane in extra_lanes) if b), None)
        timings["memory-checks"] += time.perf_counter() - checks_started
        if breach is not None:
            return _memory_failure(result, case, breach, Phase.NUMERIC, started)

        enter(Phase.COMPARE)
        # fast mode compares along the directions: each prediction is projected as soon as it
        # is read, so no scramble's full-size gradients are kept (4 scrambles x every param)
        project = None if case.mode == "full" else (lambda name, values: checks[name]["project"](values))
        predictions = probe.predictions(session, project)
        _compare(result, case, checks, predictions, shapes, laid_out)
        result.loss_value = loss_value
        underflow = _underflow(loss_value, analytic)
        if underflow is not None and result.status in (Status.PASSED, Status.FAILED):
            # below float32's normal range both sides have lost their digits: a pass there (every
            # element zero on both sides) is no evidence, and neither is a disagreement
            result.status, result.kind = Status.INCONCLUSIVE, Diagnosis.INCONCLUSIVE
            result.diagnosis = (f"{underflow}: at that scale neither the backward's gradients nor the finite "
                                "differences can be read; scale the case's values up (its init, or the op's "
                                "parameters)")
        if varies is not None:
            # a backward whose gradients change from run to run cannot be compared across layouts
            _nondeterministic(result, case, varies, checks)
            return result.finish(result.status, Phase.DONE, started=started)
        if result.status == Status.FAILED:
            # a backward already wrong in memory of its own may read memory it does not own, whose
            # contents change with the layout: a difference between layouts would blame no alias
            return result.finish(result.status, Phase.DONE, started=started)
        # last: the regimes lay the graph's tensors out again, so nothing of own memory is read after
        enter(Phase.ALLOCATION)
        runs, alias = regimes.check(g, session, gb, case, params, grads, loss, analytic, shapes, enter)
        result.alloc = [run.to_dict(g, gb) for run in runs]
        if alias is not None:
            _alias_failure(result, case, alias)
            return result.finish(result.status, alias.phase, started=started)
        return result.finish(result.status, Phase.DONE, started=started)
    finally:
        enter(None)
        for lane in extra_lanes:
            lane.free()
        if session is not None and session != g.ffi.NULL:
            lib.gg_session_free(session)
        g.free()


FLOAT32_TINY = float(np.finfo(np.float32).tiny)     # float32's smallest normal number, 1.18e-38


def _underflow(loss_value, analytic):
    """What underflows float32 in this case (its loss, or a param's whole gradient), or None."""
    if abs(loss_value) < FLOAT32_TINY:
        return f"the loss is {loss_value:.3g} at the case's inputs, below float32's smallest normal number " \
               f"({FLOAT32_TINY:.3g})"
    for name, values in analytic.items():
        peak = float(np.max(np.abs(values))) if np.size(values) else 0.0
        if 0.0 < peak < FLOAT32_TINY:
            return f"the gradient of {name} peaks at {peak:.3g}, below float32's smallest normal number " \
                   f"({FLOAT32_TINY:.3g})"
    return None


def _memory_failure(result, case, finding, phase, started):
    """A verified fault of a kernel's memory use: the case fails whatever its gradients say (they
    were computed with that fault, and another run may show it elsewhere)."""
    result.kind, result.culprit = finding.kind, finding.culprit
    result.diagnosis = finding.text
    result.message = f"{case.id}: {finding.summary}"
    return result.finish(Status.FAILED, phase, started=started)


def _alias_failure(result, case, alias):
    """Wrong in training's memory: the case fails whatever memory of its own gave, and says what
    that gave."""
    text = alias.text
    if result.status != Status.PASSED and result.diagnosis:
        text += f"; in memory of its own, against the finite differences, this run {result.status}: {result.diagnosis}"
    elif result.status == Status.PASSED:
        text += "; in memory of its own the gradients passed the finite differences"
    result.status, result.kind, result.culprit, result.diagnosis = Status.FAILED, Diagnosis.ALIAS, alias.culprit, text
    result.message = f"{case.id}: {alias.summary}"


def _determinism(lib, session, gb, case, analytic, gradients):
    """The backward once more on another thread count (on a backend without threads: the same):
    None when the gradients agree within roundoff, else (differences, other count, whether a
    third run on the case's own count agrees with the first). The last compute is on the case's
    count, so what later reads from the graph is the case's run."""
    other = determinism.other_threads(case.threads) if case.backend == "cpu" else case.threads
    lib.gg_session_set_n_threads(session, other)
    lib.ggml_graph_reset(gb)
    status = lib.gg_session_compute(session, gb)
    lib.gg_session_set_n_threads(session, case.threads)
    _check_status(status)
    diff = determinism.differences(analytic, gradients())
    if not diff:
        return None
    lib.ggml_graph_reset(gb)
    _check_status(lib.gg_session_compute(session, gb))
    repeat_agrees = not determinism.differences(analytic, gradients())
    return diff, other, repeat_agrees


def _nondeterministic(result, case, varies, checks):
    """A backward whose gradients depend on the run fails as nondeterministic, whatever the
    finite differences said of one run: the next run may say otherwise."""
    diff, other, repeat_agrees = varies
    shapes = {m["name"]: m["shape"] for m in result.params}
    text = determinism.describe(diff, case.threads, other, repeat_agrees, shapes, case.backend)
    if result.status == Status.PASSED:
        text += f"; this run's gradient on {case.threads} threads passed the finite differences"
    elif result.diagnosis:
        text += f"; against the finite differences this run {result.status}: {result.diagnosis}"
    result.status, result.kind, result.diagnosis = Status.FAILED, Diagnosis.NONDETERMINISTIC, text
    result.message = f"{case.id}: the backward's gradients differ between runs ({', '.join(diff)})"


def _nonfinite_loss(result, case, loss_value, analytic, started):
    """The verdict on a case whose loss is not finite at its inputs: a failure of the case (its
    forward is out of its domain), with the backward neither checked nor blamed."""
    bad = {name: int((~np.isfinite(a)).sum()) for name, a in analytic.items()}
    gradients = ", ".join(f"{name} {n}" for name, n in bad.items())
    result.loss_value = loss_value
    result.kind = Diagnosis.NONFINITE_LOSS
    result.diagnosis = (f"the loss itself is not finite at these inputs (loss = {loss_value}; non-finite analytic "
                        f"gradient values: {gradients}): the forward is out of its domain, so no finite differences "
                        "were taken and the backward was not checked; narrow the case's init range")
    result.message = f"{case.id}: the loss is {loss_value} at the case's inputs"
    return result.finish(Status.FAILED, Phase.COMPUTE, started=started)


class _PowerProbe:
    """What a backward reading the op's incoming gradient from other positions would give
    (check/power.py): a probe loss sum(cont(y) * W) over the same forward nodes, W written
    with a scramble of dL/dy as the case's backward computed it."""

    def __init__(self, g, y, gb, params):
        lib = g.lib
        self.g, self.params = g, params
        self.incoming = lib.ggml_graph_get_grad(gb, y)
        self.ne, _ = g.layout(y)
        if self.incoming == g.ffi.NULL:
            return
        self.weights = g.new_tensor(self.ne, name="__power_weights")
        probe_loss = lib.ggml_sum(g.ctx, lib.ggml_mul(g.ctx, g.contiguous(y), self.weights))
        self.graph = g.backward_graph(g.forward_graph(probe_loss))
        self.grads = {name: lib.ggml_graph_get_grad(self.graph, t) for name, t in params.items()}

    def predictions(self, session, project=None):
        """{scramble: {param: gradient}}, or None when y gets no gradient (nothing to scramble);
        project(param, values): what is kept of each gradient instead (fast mode: its projection
        on the directions, computed from the float32 values)."""
        g = self.g
        if self.incoming == g.ffi.NULL:
            return None
        out = {}
        for name, values in power.scrambles(read_tensor(g, self.incoming), self.ne):
            write_tensor(g, self.weights, values.astype(np.float32))
            g.lib.ggml_graph_reset(self.graph)
            _check_status(g.lib.gg_session_compute(session, self.graph))
            grads = {}
            for p, t in self.grads.items():
                if t == g.ffi.NULL:
                    values = np.zeros(read_tensor(g, self.params[p]).size)
                elif project is None:
                    values = read_tensor(g, t)
                else:
                    values = read_tensor(g, t, np.float32)
                grads[p] = values if project is None else project(p, values)
            out[name] = grads
        return out


def _numeric(g, session, gf, t, loss, case, analytic, loss_scale, extra_lanes=(), name=None):
    """(analytic, numeric, noise) for one param, element-wise or along directions (fast mode)."""
    lib, ffi = g.lib, g.ffi
    n = analytic.size
    h = float(case.eps)
    precise = case.stencil == 4
    if case.mode == "fast":
        return directional.check(g, session, gf, t, loss, case, analytic, loss_scale)
    g_h = np.empty(n)
    g_half = np.empty(n) if precise else None
    lane_seconds = None
    if extra_lanes:
        st, lane_seconds = lanes.numeric_grad(lib, session, gf, t, loss, extra_lanes, name, h, g_h, g_half)
    else:
        st = lib.gg_numeric_grad(session, gf, t, loss, h, ffi.from_buffer("double[]", g_h),
                                 ffi.from_buffer("double[]", g_half) if precise else ffi.NULL)
    _check_status(st)
    numeric = (4 * g_half - g_h) / 3 if precise else g_h
    noise = metrics.numeric_noise(loss_scale, h, g_h, numeric if precise else None)

    def halved_at(idx):
        """The same estimate with half the step at elements idx (asked only before a failure is
        blamed, and first only where the comparison disagrees: reliability.unreliable_elements)."""
        return halved_estimate(lib, session, gf, t, loss, h, g_half, idx)

    even_evaluations = [0]

    def even_at(idx):
        """The loss's even part around elements idx at steps h and h/2 (reliability.py)."""
        even_evaluations[0] += 2 * (2 * len(idx) + 1)     # x +- h and x +- h/2 per element; x once a step
        return even_parts(lib, session, gf, t, loss, h, idx), even_parts(lib, session, gf, t, loss, h / 2, idx)
    roundoff = metrics.numeric_noise(loss_scale, h / 2, np.zeros(1), np.zeros(1) if precise else None)[0]
    return {"analytic": analytic, "numeric": numeric, "noise": noise, "halved_at": halved_at, "even_at": even_at,
            "even_evaluations": even_evaluations, "roundoff": roundoff, "h": h,
            "gap": np.abs(numeric - g_h), "values": read_tensor(g, t), "evaluations": n * (4 if precise else 2),
            **({"lane_seconds": lane_seconds} if lane_seconds is not None else {})}


def even_parts(lib, session, gf, t, loss, h, idx):
    """L(x+h) + L(x-h) - 2 L(x) at elements idx, each perturbed alone."""
    ffi = binding.ffi
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    even = np.empty(idx.size)
    _check_status(lib.gg_loss_even_at(session, gf, t, loss, h, ffi.from_buffer("int64_t[]", idx), idx.size,
                                      ffi.from_buffer("double[]", even)))
    return even


def halved_estimate(lib, session, gf, t, loss, h, g_half, idx):
    """The finite-difference estimate at elements idx with half the step h: the central
    difference at h/2 (g_half None: the 2-point stencil), or the 4-point estimate over h/2 and
    h/4. Its h/2 half is g_half already (the same perturbed points, the same f32 roundings), so
    only the evaluations at +-h/4 are new: 2 per element, not 4."""
    ffi = binding.ffi
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    central = np.empty(idx.size)
    step = h / 2 if g_half is None else h / 4
    _check_status(lib.gg_numeric_grad_at(session, gf, t, loss, step, ffi.from_buffer("int64_t[]", idx), idx.size,
                                         ffi.from_buffer("double[]", central), ffi.NULL))
    return central if g_half is None else (4 * central - g_half[idx]) / 3


def _check_status(st):
    if st != 0:
        raise RuntimeError(f"forward compute failed during finite differences (ggml_status {st})")


def _compare(result, case, checks, predictions, shapes, laid_out=()):
    failed, unreliable, inconclusive = [], [], []
    if predictions is None:
        param_power, detail, uncaught = {name: False for name in checks}, {}, None
    else:
        # in fast mode the predictions are projections already (_PowerProbe.predictions)
        param_power, detail, uncaught = power.judge(predictions, checks, case.max_maa)
    case_power = uncaught == []
    result.power_scrambles = {s: {p: float(v) for p, v in maa.items()} for s, maa in detail.items()}
    for name, c in checks.items():
        ne = list(shapes[name])
        shape_ne = ne if case.mode == "full" else [len(c["numeric"]), 1, 1, 1]
        m = metrics.compare(c["analytic"], c["numeric"], c["noise"], case.max_maa, shape_ne)
        m["power"] = param_power[name]
        m["name"] = name
        m["shape"] = ne
        if name in laid_out:
            m["producer"] = case.producer    # ne is the leaf's; the op read a view of the declared shape
        m.update(c.get("report", {}))   # fast mode: how the directions were taken, the located elements
        # before the backward is blamed: are the finite differences evidence at these elements?
        # Not asked where the numeric side is not finite (a loss that overflows at the inputs):
        # such an element is never called unreliable, and it keeps the rest failing, so another
        # pass of finite differences at half the step could not change the verdict
        m["halved_step_checked"] = (not m["passed"] and "halved_at" in c and bool(np.isfinite(c["numeric"]).all()))
        if m["halved_step_checked"]:
            shaky, m["halved_step_elements"], ok = reliability.unreliable_elements(
                c["analytic"], c["numeric"], c["noise"], c["gap"], c["roundoff"], case.max_maa, c["halved_at"],
                c.get("even_at"), c.get("h"))
            # 2 forwards an element for the halved step, and those of the even parts
            result.evaluations_halved += m["halved_step_elements"] * 2 + c.get("even_evaluations", [0])[0]
            if shaky.any():
                m["numeric_unreliable"] = int(shaky.sum())
                if ok:
                    m["diagnosis_kind"] = str(Diagnosis.NUMERIC_UNRELIABLE)
                    m["diagnosis"] = reliability.advice(name, c["values"], shaky, float(case.eps), shape_ne)
                    unreliable.append(name)
                    result.params.append(m)
                    continue
        if case.mode == "fast":
            lacking = directional.lacks_evidence(m, case)
            if lacking and (m["passed"] or (c.get("diagnosis") or ("",))[0] is Diagnosis.SAMPLE_AGREES):
                # a pass needs evidence, and so does a failure: neither is claimed without it
                m["diagnosis_kind"], m["diagnosis"] = str(Diagnosis.INCONCLUSIVE), f"{name}: {lacking}"
                inconclusive.append(name)
                result.params.append(m)
                continue
        if not m["passed"]:
            reads = (f"its input {name} (through producer '{case.producer}')"
                     if name in laid_out and case.consumer == "none" else "the incoming gradient")
            kind, m["diagnosis"] = c.get("diagnosis") or metrics.diagnose(
                c["analytic"], c["numeric"], c["noise"], m, case.max_maa, reads,
                shape_ne=ne if case.mode == "full" else None)
            m["diagnosis_kind"] = str(kind)
            failed.append(name)
            if case.mode == "full":
                m["analytic_values"] = [float(v) for v in c["analytic"]]
                m["numeric_values"] = [float(v) for v in c["numeric"]]
        result.params.append(m)
    result.power = case_power
    result.blind_params = [name for name in checks if not param_power[name]]
    worst = max(result.params, key=lambda m: m["maa"])
    result.maa, result.cosine = worst["maa"], worst["cosine"]
    result.limit = worst.get("limit", case.max_maa)
    result.n_compared = sum(m.get("n_compared", 0) for m in result.params)
    if not failed and inconclusive:
        result.status, result.kind = Status.INCONCLUSIVE, Diagnosis.INCONCLUSIVE
        result.diagnosis = "; ".join(m["diagnosis"] for m in result.params if m["name"] in inconclusive)
        return
    if not failed and unreliable:
        result.status, result.kind = Status.NUMERIC_UNRELIABLE, Diagnosis.NUMERIC_UNRELIABLE
        result.diagnosis = "; ".join(m["diagnosis"] for m in result.params if m["name"] in unreliable)
        return
    if not failed:
        result.status = Status.PASSED
        if not result.power:
            result.kind = Diagnosis.BLIND
            if predictions is None:
                why = "the op's output gets no gradient in this graph"
            else:
                why = (f"dL/dy read {'/'.join(uncaught)} gives the same parameter gradients within the limit "
                       f"({case.loss} loss through consumer '{case.consumer}')")
            result.diagnosis = ("blind: a backward reading its incoming gradient from other positions would pass "
                                f"this case too: {why}")
        return
    result.status = Status.FAILED
    # the headline speaks of one param: the failed one furthest off (a NaN MAA first), whose
    # MAA, limit and cosine it gives beside that param's own diagnosis
    first = max((m for m in result.params if m["name"] in failed),
                key=lambda m: math.inf if not m["maa"] <= math.inf else m["maa"])
    result.maa, result.cosine = first["maa"], first["cosine"]
    result.limit = first.get("limit", case.max_maa)
    kind, diagnosis = Diagnosis(first["diagnosis_kind"]), first["diagnosis"]
    if case.mode == "full" and len(checks) > 1 and kind is Diagnosis.DISAGREE:
        # per param first: a joint look is asked only when a param's own values say nothing
        # specific. A backward that slices the gradient at wrong offsets scrambles values *across*
        # params, which only the joint look sees; but over a and b together, b = -true next to
        # a = true also looks like "values at other positions", hiding b's plain wrong sign.
        a = np.concatenate([c["analytic"] for c in checks.values()])
        n = np.concatenate([c["numeric"] for c in checks.values()])
        noise = np.concatenate([np.broadcast_to(c["noise"], np.shape(c["numeric"])) for c in checks.values()])
        combined = metrics.compare(a, n, noise, case.max_maa)
        joint_kind, joint = metrics.diagnose(a, n, noise, combined, case.max_maa,
                                             f"its inputs (through producer '{case.producer}')"
                                             if laid_out and case.consumer == "none" else "the incoming gradient")
        if joint_kind is Diagnosis.WRONG_POSITIONS:
            kind, diagnosis = joint_kind, joint + " (across params " + ", ".join(checks) + ")"
    if case.consumer != "none" and kind in STRIDE_SUSPECTS:
        # the usual cause when only a non-contiguous consumer fails: the backward ignores grad's strides
        diagnosis += (f"; the gradient reaches the op through consumer '{case.consumer}' (non-contiguous): "
                      "if consumer 'none' passes, the backward reads the incoming gradient ignoring its strides")
    if first["name"] in laid_out and kind in STRIDE_SUSPECTS:
        # the mirror: only a non-contiguous input fails, so the backward misreads a forward input
        diagnosis += (f"; {first['name']} reaches the op through producer '{case.producer}' (non-contiguous): if "
                      "producer 'none' passes, the backward reads a forward input ignoring its strides")
    result.kind = kind
    result.diagnosis = f"{first['name']}: {diagnosis}"
    # the numbers only: the diagnosis is its own field, and the failure text shows both
    result.message = (f"{case.id}: MAA {first['maa']:.3g} > limit {first.get('limit', case.max_maa):.3g} "
                      f"for param {first['name']}")
