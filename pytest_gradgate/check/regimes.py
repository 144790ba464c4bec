"""Allocation regimes: the case's backward run again in the memory that training gives it.

The engine computes a case's backward with every tensor in memory of its own (the guard zones,
the unwritten elements and the determinism check need that). Training does not: ggml-opt lays a
step out with ggml's graph allocator (ggml-alloc), which lets an op that `ggml_op_can_inplace`
write its output over a source whose last use it is. A kernel that writes its output before it
has read all of that source is right in the first memory and wrong in the second (SOFT_MAX_BACK
over its softmax output under a residual; RMS_NORM_BACK before ggml #1491).

Regimes, each the same backward graph (same nodes, same values) laid out again:
- `graph`: as ggml-opt lays out a training step: params and the loss's gradient accumulator in
  a static buffer, the param gradients and the loss flagged outputs, the other leaves inputs,
  everything else by ggml's own graph allocator (`ggml_gallocr_alloc_graph`).
- `ggml-opt`: the case's graph trained by ggml-opt itself, as llama.cpp's training runs it:
  `ggml_opt_init` over a backend scheduler of the case's backend, its own gradient graph with
  gradient accumulators, SGD with weight decay 0, two micro-batches per optimizer step. Its
  gradient is read where ggml-opt keeps it (the accumulator, `ggml_opt_grad_acc`) after the
  first micro-batch, and again after the second, which must hold the sum of the two. The second
  micro-batch has other values (every leaf's reversed, `second_values`), as training's next
  batch has: the sum of two equal gradients is right for an accumulator that keeps one of them
  twice. Its single-batch gradient is computed apart, on a graph and in memory of its own. A
  graph rebuilt in a context of its own, since ggml-opt builds its graphs and gradient tensors
  in the model's compute context.
- `forced-srcJ`: which source the allocator picks depends on the graph around a node (src0 unless
  it is still needed or an output). So that a small case meets every alias a training graph could
  give it, each in-place-capable node's output is laid over its src J wherever that is legal (the
  same layout, memory of its own, no output in it, nothing after the node reads it), one J at a
  time, everything else in memory of its own.

The forward's own in-place ops are laid out by the same plans: the backward graph holds the
forward's nodes, and a forward node's memory is taken only after its last read, backward
included, as the allocator does for a training step.

A regime's gradients are compared with those of memory of its own (which the finite differences
checked): an alias changes no arithmetic, so a right kernel gives the same bits, and any
difference beyond roundoff is the alias's doing. The alias is then named by laying each of the
regime's aliases alone, every other tensor in memory of its own: the one that reproduces the
difference is a kernel that reads a source after it has written its output there.
"""

from dataclasses import dataclass

import numpy as np

from pytest_gradgate.check import determinism
from pytest_gradgate.check.ggml_graph import GraphBuilder, build_forward, graph_tensors, read_tensor, write_tensor
from pytest_gradgate.declare.expr import parse_graph
from pytest_gradgate.check.metrics import ggml_index
from pytest_gradgate.check.memory import describe
from pytest_gradgate.check.outcome import Phase

# --gradgate-alloc: which regimes besides memory of its own
SELECTIONS = {"all": ("graph", "forced", "ggml-opt"), "graph": ("graph",), "forced": ("forced",),
              "ggml-opt": ("ggml-opt",), "own": ()}
# ggml-opt's graphs: GGML_DEFAULT_GRAPH_SIZE nodes each, made in the case's context
GGML_OPT_GRAPH_SIZE = 2048
# ggml ops have at most 3 sources an in-place op could lie over with the same layout (ROPE's
# third is its freq factors, SOFT_MAX's its sinks)
FORCED_SOURCES = (0, 1, 2)
MAX_NODES = 4096


@dataclass
class Run:
    regime: str             # "graph", "forced-src1"
    aliases: list           # [(node index, src index)] the layout gave
    differs: dict           # determinism.differences(expected, this regime's); empty when they agree
    got: dict               # param name -> this regime's gradient, kept where it differs
    expected: dict = None   # what it was compared with, where that is not memory of its own's

    def to_dict(self, g, gb):
        return {"regime": self.regime, "agrees": not self.differs,
                "aliases": [{"node": i, "op": _op(g, gb, i), "src": j} for i, j in self.aliases]}


@dataclass
class Failure:
    text: str
    summary: str
    culprit: str            # the op at fault, when one alias alone reproduces it ("" otherwise)
    phase: Phase = Phase.ALLOCATION


def check(g, session, gb, case, params, grads, loss, own, shapes, phase=lambda name: None):
    """Run the backward gb in each selected regime -> ([Run], Failure or None). `grads`: param
    name -> its gradient tensor in gb; `own`: param name -> the gradient computed in memory of its
    own; `shapes`: param name -> ne. The tensors of g.ctx lose their own memory: call this after
    everything else is read. phase(Phase.GGML_OPT) is called before ggml-opt's run, so that an
    abort there is said to be ggml-opt's."""
    selected = SELECTIONS[case.alloc]
    if not selected:
        return [], None
    lib, ffi = g.lib, g.ffi
    statics = list(params.values())
    loss_acc = lib.ggml_graph_get_grad_acc(gb, loss)
    if loss_acc != ffi.NULL:
        statics.append(loss_acc)
    outputs = [t for t in grads.values() if t != ffi.NULL] + [loss]
    runs = []

    def computed(allocate):
        lib.gg_ctx_detach(g.ctx)
        if not allocate():
            raise RuntimeError("could not lay out the backward graph in an allocation regime")
        for t, values in g.values:
            write_tensor(g, t, values)
        lib.ggml_graph_reset(gb)
        status = lib.gg_session_compute(session, gb)
        if status != 0:
            raise RuntimeError(f"backward compute failed in an allocation regime (ggml_status {status})")
        # float32, as ggml computed them: a big case's gradients are read once per regime
        return {name: read_tensor(g, t, np.float32) if t != ffi.NULL else own[name] for name, t in grads.items()}

    if "graph" in selected:
        got = computed(lambda: lib.gg_session_alloc_graph(session, g.ctx, gb, ffi.new("struct ggml_tensor *[]", statics),
                                                          len(statics), ffi.new("struct ggml_tensor *[]", outputs),
                                                          len(outputs)))
        runs.append(_run("graph", _aliases(lib, ffi, gb), own, got))
    if "forced" in selected:
        seen = {tuple(r.aliases) for r in runs}
        keep = ffi.new("struct ggml_tensor *[]", outputs)
        for j in FORCED_SOURCES:
            nodes = ffi.new("int[]", MAX_NODES)
            n = lib.gg_graph_alias_candidates(gb, j, keep, len(outputs), nodes, MAX_NODES)
            plan = [(nodes[k], j) for k in range(n)]
            if not plan or tuple(plan) in seen:
                continue        # no alias, or exactly the layout of a regime already run
            seen.add(tuple(plan))
            got = computed(lambda: _alloc_aliased(lib, ffi, session, g.ctx, gb, plan))
            runs.append(_run(f"forced-src{j}", plan, own, got))
    if "ggml-opt" in selected:
        phase(Phase.GGML_OPT)
        lib.gg_session_release(session)     # ggml-opt lays out a copy of the graph: one at a time
        runs += _through_ggml_opt(lib, case, own)
    failing = next((r for r in runs if r.differs and r.regime.startswith(("graph", "forced"))), None)
    if failing is None:
        failing = next((r for r in runs if r.differs), None)
        return runs, None if failing is None else _opt_failure(failing, own, shapes)
    culprit = None
    for alias in failing.aliases:
        alone = computed(lambda: _alloc_aliased(lib, ffi, session, g.ctx, gb, [alias]))
        differs = determinism.differences(own, alone)
        if differs:
            culprit = alias, differs, alone
            break
    return runs, _failure(g, gb, failing, culprit, own, shapes)


def _run(regime, aliases, own, got, expected=None):
    """A Run; a regime that agrees keeps no gradients (a big case's would add up over the regimes)."""
    differs = determinism.differences(own if expected is None else expected, got)
    return Run(regime, aliases, differs, got if differs else {}, expected if differs else None)


def _alloc_aliased(lib, ffi, session, ctx, gb, plan):
    return lib.gg_session_alloc_aliased(session, ctx, gb, ffi.new("int[]", [i for i, _ in plan]),
                                        ffi.new("int[]", [j for _, j in plan]), len(plan))


def _aliases(lib, ffi, gb):
    nodes, srcs = ffi.new("int[]", MAX_NODES), ffi.new("int[]", MAX_NODES)
    n = lib.gg_graph_aliases(gb, nodes, srcs, MAX_NODES)
    return [(nodes[k], srcs[k]) for k in range(n)]


def _op(g, gb, i):
    return _op_of(g, g.lib.gg_graph_node(gb, i))


def describe_regime(regime):
    if regime == "graph":
        return "the graph regime (ggml's graph allocator with its in-place reuse, as ggml-opt lays out a training step)"
    return (f"the {regime} regime (every in-place-capable node's output laid over its src{regime[-1]} where that is "
            "legal, every other tensor in memory of its own)")


def _difference_text(differs, own, got, shapes):
    name, (count, i, a, b) = next(iter(differs.items()))
    return (f"{name}'s gradient differs from the one computed with every tensor in memory of its own at {count} of "
            f"{own[name].size} elements, e.g. at {ggml_index(i, list(shapes[name]))}: {b:.6g} against {a:.6g} "
            f"(cosine {_cosine(got[name], own[name]):.2f} to it)")


def _cosine(a, b):
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else float("nan")


def _failure(g, gb, failing, culprit, own, shapes):
    regime_text = describe_regime(failing.regime)
    diff = _difference_text(failing.differs, own, failing.got, shapes)
    if culprit is None:
        listed = ", ".join(f"{_op(g, gb, i)} (node {i}) over its src{j}" for i, j in failing.aliases)
        text = (f"wrong in training's memory: in {regime_text}, {diff}; laid alone, none of the regime's aliases "
                f"({listed}) changes the gradients, so no node is named (the aliases change them together)")
        return Failure(text, f"the gradients change in the {failing.regime} allocation regime", "")
    (i, j), differs, got_alone = culprit
    src = g.lib.gg_tensor_src(g.lib.gg_graph_node(gb, i), j)
    op = _op(g, gb, i)
    alone = _difference_text(differs, own, got_alone, shapes)
    alone = "the same difference" if alone == diff else alone
    text = (f"alias: {op} (node {i} of the backward graph) wrote its output over its src{j}, {describe(g, src)}, "
            f"which it reads afterwards. In {regime_text}, {diff}; that alias alone, every other tensor in memory of "
            f"its own, gives {alone}")
    return Failure(text, f"{op} (node {i}) wrote its output over its src{j}, which it reads afterwards", op)


def second_values(values):
    """The second micro-batch's values of a leaf: its elements in reverse order. Other values at
    every element where the first had any variety, and the same multiset of them, so a leaf drawn
    from an op's domain (positive, one sign, valid row ids, a distribution per row) stays in it."""
    return np.ascontiguousarray(np.asarray(values).reshape(-1)[::-1].reshape(np.shape(values)))


def _through_ggml_opt(lib, case, own):
    """The case trained by ggml-opt, two micro-batches (the case's values, then second_values) ->
    [Run] of the first micro-batch's gradient against memory of its own, and of the accumulated
    two against the sum of the two single-batch gradients. [] where ggml-opt cannot take the case:
    a loss that is not a sum, or a tree whose ggml-opt predates its SGD optimizer
    (gg_opt_supported; the report's alloc then lists no ggml-opt run)."""
    if not lib.gg_opt_supported():
        return []
    lines = parse_graph(case.graph)
    # The second micro-batch's single-batch gradient first, on a graph apart that stays
    # allocated while ggml-opt runs (its memory and tensors are none of ggml-opt's), and its
    # values let go before ggml-opt's graph draws its own: a big case's are megabytes
    # (tests/test_fast_mode.py's peak)
    apart = _Apart(lib, case, lines)
    g = None
    session = opt = apart.g.ffi.NULL
    try:
        if apart.loss_op != "SUM":
            return []       # ggml-opt's loss is a sum of the outputs it is given (losses.py: all are)
        expected = apart.gradients(second_values)
        for name in expected:
            # with the first's: the sum of the two, in place, in float32 as ggml-opt adds them
            np.add(expected[name], own[name], out=expected[name], casting="unsafe")
        g = GraphBuilder(lib, case, n_tensors=3 * graph_tensors(case, lines), graph_room=GGML_OPT_GRAPH_SIZE)
        ffi = g.ffi
        params, _, _, loss = build_forward(g, case, lines)
        outputs = lib.gg_tensor_src(loss, 0)
        err = ffi.new("char[256]")
        session = lib.gg_session_new(case.backend.encode(), case.threads, err, 256)
        if session == ffi.NULL:
            return []
        opt = lib.gg_opt_new(session, g.ctx, outputs, 2, 1.0)
        if opt == ffi.NULL:
            raise MemoryError("could not make ggml-opt's context for the case")
        for t, values in g.values:
            write_tensor(g, t, values)
        lib.gg_opt_step(opt)
        first = _run("ggml-opt", [], own, {name: read_tensor(g, lib.gg_opt_grad_acc(opt, t), np.float32)
                                           for name, t in params.items()})
        for t, values in g.values:
            write_tensor(g, t, second_values(values))
        lib.gg_opt_step(opt)
        both = {name: read_tensor(g, lib.gg_opt_grad_acc(opt, t), np.float32) for name, t in params.items()}
        return [first, _run("ggml-opt-accumulated", [], own, both, expected)]
    finally:
        if opt != apart.g.ffi.NULL:
            lib.gg_opt_free(opt)
        if session != apart.g.ffi.NULL:
            lib.gg_session_free(session)
        if g is not None:
            g.free()
        apart.free()


class _Apart:
    """The case's graph built again, in memory of its own, for a single-batch gradient at other
    values: the gradient ggml-opt's second micro-batch adds is compared with one computed on
    tensors that never ran a step before (a kernel that keeps state between evaluations of the
    same node shows there, and not on the same graph run again)."""

    def __init__(self, lib, case, lines):
        self.g = GraphBuilder(lib, case, n_tensors=graph_tensors(case, lines))
        self.session = self.g.ffi.NULL
        try:
            params, _, _, loss = build_forward(self.g, case, lines)
            self.loss_op = _op_of(self.g, loss)
            self.gb = self.g.backward_graph(self.g.forward_graph(loss))
            self.grads = {name: lib.ggml_graph_get_grad(self.gb, t) for name, t in params.items()}
            self.shapes = {name: int(np.prod(self.g.layout(t)[0])) for name, t in params.items()}
            err = self.g.ffi.new("char[256]")
            self.session = lib.gg_session_new(case.backend.encode(), case.threads, err, 256)
            if self.session == self.g.ffi.NULL or not lib.gg_session_alloc(self.session, self.g.ctx):
                raise MemoryError("could not allocate the case's graph for a second micro-batch's gradient")
        except BaseException:
            self.free()
            raise

    def gradients(self, values_of):
        """The gradients at values_of(each leaf's values), once: the values are let go as they are
        written (a big case's are megabytes, held while ggml-opt runs)."""
        g = self.g
        while g.values:
            t, values = g.values.pop(0)
            write_tensor(g, t, values_of(values))
            del values
        g.lib.ggml_graph_reset(self.gb)
        status = g.lib.gg_session_compute(self.session, self.gb)
        if status != 0:
            raise RuntimeError(f"backward compute failed for the second micro-batch (ggml_status {status})")
        return {name: read_tensor(g, t, np.float32) if t != g.ffi.NULL else np.zeros(self.shapes[name], np.float32)
                for name, t in self.grads.items()}

    def free(self):
        if self.session != self.g.ffi.NULL:
            self.g.lib.gg_session_free(self.session)
            self.session = self.g.ffi.NULL
        self.g.free()


def _op_of(g, t):
    return g.ffi.string(g.lib.gg_tensor_op_name(t)).decode()


def _opt_failure(failing, own, shapes):
    if failing.regime == "ggml-opt":
        diff = _difference_text(failing.differs, own, failing.got, shapes)
        text = (f"wrong as ggml-opt trains it: the gradient ggml-opt accumulates for one micro-batch (ggml_opt_init "
                f"over a backend scheduler, its own gradient graph and allocation): {diff}")
        return Failure(text, "ggml-opt's gradient differs from the backward's own", "", Phase.GGML_OPT)
    diff = _difference_text(failing.differs, failing.expected, failing.got, shapes).replace(
        "differs from the one computed with every tensor in memory of its own",
        "accumulated over two micro-batches (the case's values, then each leaf's reversed) differs from the sum of "
        "the two single-batch gradients, each computed in memory of its own")
    text = f"gradient accumulation lost or doubled: {diff}"
    return Failure(text, "ggml-opt's gradient accumulation over two micro-batches is not the sum of the two", "",
                   Phase.GGML_OPT)
