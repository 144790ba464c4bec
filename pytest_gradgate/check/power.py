"""Power: would this case fail if the op's backward read its incoming gradient from other
positions (transposed, permuted, shifted)?

That is a property of the gradient *arriving at the op* (dL/dy, y the op's output), not of
the parameter's gradient: with a SUM loss dL/dy is all ones, and a backward that reads it
from any other positions gets the same ones, however varied the parameter's gradient is.

So the engine reads dL/dy from ggml's backward graph (ggml_graph_get_grad of y), scrambles
it, and asks ggml for the parameter gradients a backward reading the scrambled copy would
produce: J^T (P dL/dy), the gradient of a probe loss sum(cont(y) * W) with W = P dL/dy. The
probe reaches y contiguously (no consumer), so its backward is the op's ordinary one even
where the case's consumer makes the real backward fail. The case has power when every
scramble's parameter gradients fail the case's own comparison (same numeric side, same
noise, same limit); a scramble that leaves dL/dy unchanged (all ones) passes it, and the
case is reported blind.
"""

import numpy as np

from pytest_gradgate.check import metrics

SCRAMBLE_SEED = 1234


def scrambles(incoming, ne, seed=SCRAMBLE_SEED):
    """(name, values) of dL/dy read from other positions; `incoming` in y's logical order.

    Only reads that move elements for this shape are listed: a transposed read of a tensor
    with one row is the identity, not a wrong-position read."""
    g = np.asarray(incoming, dtype=np.float64).ravel()
    if g.size < 2:
        return []
    ne0, ne1, ne2, ne3 = (int(x) for x in ne)
    out = []
    if ne0 > 1 and ne1 > 1:
        # the classic stride bug: a transposed gradient's buffer read as if it were contiguous
        out.append(("transposed", g.reshape(ne3, ne2, ne1, ne0).swapaxes(2, 3).ravel()))
    out.append(("permuted", g[np.random.default_rng(seed).permutation(g.size)]))
    out.append(("shifted", np.roll(g, 1)))       # read one element off
    out.append(("reversed", g[::-1].copy()))
    return out


def judge(predictions, checks, max_maa):
    """-> ({param: has power}, {scramble: {param: maa}}, scrambles no param catches).

    The case has power when the last is empty (and there was something to scramble).

    predictions: {scramble: {param: J^T (P dL/dy)}}, each on what the case compares (fast
    mode: projected on the directions, engine._PowerProbe); checks: {param: {"numeric", "noise"}}."""
    per_param = {name: True for name in checks}
    detail = {}
    uncaught = []
    for scramble, grads in predictions.items():
        detail[scramble] = {}
        caught = False
        for name, c in checks.items():
            detail[scramble][name], passed = metrics.verdict(grads[name], c["numeric"], c["noise"], max_maa)
            if passed:
                per_param[name] = False
            else:
                caught = True
        if not caught:
            uncaught.append(scramble)
    return per_param, detail, uncaught
