"""The harness checks itself on the ggml under test: can the case's consumer (and producer)
carry a gradient at all, with no op of the case between it and the loss?

A consumer is made of ggml ops too (views, permutes, cont), and their backward can abort or
be wrong in the ggml under test whatever op precedes them: ggml 0.15.3's VIEW backward
accumulates a transposed gradient with ACC, whose CPU kernel asserts a contiguous source
(`transpose_view_gap` after any op), and zeroes its source with SCALE, which asserts a padded
row (`view_gap` after an op whose output is a view). Such a failure is the consumer's, not
the op's, and blaming the op would put a false verdict in the report and the baseline.

So before the case's own backward is built, the engine runs the consumer on a stand-in for
the op's output: a param laid out like it (same sizes, and the same strides where they are a
permutation of a contiguous layout, reached through PERMUTE, whose backward is a view), through
the consumer and the case's loss. Its backward must run, and its gradient must match the
finite differences along two directions. The loss is at most quadratic in the stand-in (the
consumers are linear), so central differences are exact up to roundoff there: a disagreement
is the consumer's. A child that dies in this phase (Phase.CONSUMER_CHECK) died in the consumer.

A producer is the mirror (ops/producers.py): views, permutes and transposes between a param's
leaf and the op, whose backward is ggml's too (a VIEW's backward is ACC into a zeroed leaf).
Its check is the same with the producer in the consumer's place: the leaf, through the
producer, made contiguous, into the case's loss (Phase.PRODUCER_CHECK). A producer that fails
there is the producer's failure (Status.PRODUCER_FAILED), not the op's.
"""

import numpy as np

from pytest_gradgate.check import metrics
from pytest_gradgate.ops.consumers import CONSUMERS
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.producers import PRODUCERS
from pytest_gradgate.check.ggml_graph import GraphBuilder, make_values, read_tensor, write_tensor

N_DIRECTIONS = 2
SEED_OFFSET = 4242


def permutation_of(ne, nb, element_size=4):
    """axes such that permute(param of base shape, *axes) has strides nb, or None.

    base[k] = ne[order[k]] with dims ordered by stride; the strides must be exactly those of
    a contiguous tensor of that base shape (no gaps, no offsets)."""
    order = sorted(range(4), key=lambda i: (ne[i] == 1, nb[i], i))
    expected = element_size
    for k in order:
        if ne[k] > 1 and nb[k] != expected:
            return None
        expected *= ne[k]
    base = [int(ne[k]) for k in order]
    axes = [0] * 4
    for k, dim in enumerate(order):
        axes[k] = dim
    return base, axes


def check(case, lib, y_layout, n_threads=1):
    """None when the consumer carries a gradient exactly, else why not (its numbers).

    Aborts inside ggml kill the process: the caller has set Phase.CONSUMER_CHECK before."""
    ne, nb = y_layout

    def stand_in(g):
        permuted = permutation_of(ne, nb)
        if permuted is not None and permuted[1] != [0, 1, 2, 3]:
            base, axes = permuted
            x = g.new_tensor(base, name="__consumer_check")
            return x, base, lib.ggml_permute(g.ctx, x, *axes)
        # contiguous, or a gapped view that no permutation gives: the sizes alone
        base = [int(v) for v in ne]
        x = g.new_tensor(base, name="__consumer_check")
        return x, base, x

    return _carries(case, lib, stand_in, lambda g, y: CONSUMERS[case.consumer].build(g, y), n_threads)


def check_producer(case, lib, ne, n_threads=1):
    """None when the case's producer carries a gradient exactly to a leaf whose view has shape
    ne, else why not. The caller has set Phase.PRODUCER_CHECK before."""
    producer = PRODUCERS[case.producer]

    def leaf(g):
        base = [int(v) for v in producer.leaf_shape(tuple(ne))]
        x = g.new_tensor(base, name="__producer_check")
        return x, base, producer.build(g, x, tuple(ne))

    return _carries(case, lib, leaf, lambda g, y: y, n_threads)


def _carries(case, lib, make_input, chain, n_threads):
    """Run param -> (view) -> chain -> loss; None when its backward matches the finite
    differences along N_DIRECTIONS directions, else why not."""
    from pytest_gradgate.check import directional

    g = GraphBuilder(lib, case, n_tensors=256)
    session = None
    try:
        x, base, y = make_input(g)
        lib.ggml_set_param(x)
        z = g.contiguous(chain(g, y))
        loss = LOSSES[case.loss].build(g, z)
        gf = g.forward_graph(loss)
        gb = g.backward_graph(gf)
        grad = lib.ggml_graph_get_grad(gb, x)
        err = g.ffi.new("char[256]")
        session = lib.gg_session_new(case.backend.encode(), n_threads, err, 256)
        if session == g.ffi.NULL or not lib.gg_session_alloc(session, g.ctx):
            return None     # the case itself reports a backend that cannot start
        rng = np.random.default_rng(case.seed + SEED_OFFSET)
        write_tensor(g, x, make_values(rng, base, (-1.0, 1.0)))
        for t, values in g.values:
            write_tensor(g, t, values)
        lib.ggml_graph_reset(gb)
        if lib.gg_session_compute(session, gb) != 0:
            return "its backward does not compute"
        analytic = read_tensor(g, grad) if grad != g.ffi.NULL else np.zeros(int(np.prod(base)))
        loss_scale = LOSSES[case.loss].scale(g, z, float(lib.gg_read_scalar(loss)), lambda t: read_tensor(g, t))
        dirs = directional.rademacher(case.seed + SEED_OFFSET, N_DIRECTIONS, analytic.size)
        h = float(case.eps)
        d_h, d_half = directional._along(g, session, gf, x, loss, dirs, h)
        numeric, noise = directional._estimate(d_h, d_half, loss_scale, h)
        m = metrics.compare(dirs.astype(np.float64) @ analytic, numeric, noise, case.max_maa)
        if not m["passed"]:
            return (f"its gradient is wrong: MAA {m['maa']:.3g} > limit {m['limit']:.3g} along "
                    f"{N_DIRECTIONS} directions, cosine {m['cosine']:.3f}")
        return None
    finally:
        if session is not None and session != g.ffi.NULL:
            lib.gg_session_free(session)
        g.free()
