"""How much f32 roundoff one computation of a graph's output and gradients carries.

Two correct formulations of one computation (a chunked and a whole attention, an op and its
composition) round differently, so their gradients differ by roundoff and by nothing else.
The limit of an equivalence check is that difference, estimated before anything runs:

- Each op rounds its results. A result that is a sum of n products (a row of mul_mat, a
  softmax or norm row, a reduction) carries about sqrt(n) roundings of relative size
  F32_EPS: the rounding errors of a long sum behave like a random walk, which is what
  probabilistic error analysis gives for such sums (Higham & Mary, SIAM J. Sci. Comput.
  2019: |error| <~ sqrt(n) u with high probability, where the worst case is n u).
- Along a chain of ops the relative errors add up in the same way: the *rounding steps* of
  a computation are the sum over its ops of their n, forward and backward (the backward of
  a reduction is another reduction: mul_mat's over the other dimension, a norm's or
  softmax's over the row again; a broadcast's backward sums the repeated copies).
- A pure re-indexing (view, permute, transpose, cont, get_rows, concat, reshape) copies
  values exactly and adds no step.

Then a formulation's relative RMS error is about F32_EPS * sqrt(steps), and two of them
differ by about F32_EPS * sqrt(steps_a + steps_b); check/gradsets.py allows SAFETY times
that. SAFETY covers what this count leaves out: conditioning (a softmax or norm backward
subtracts nearly equal numbers; exp and div amplify relative errors), and kernels that
round more often than once per term. Measured with bench/bench_equivalence.py over 20
seeds on the built-in cases (ggml 0.15.3 plus a correct CONCAT backward), the largest NMSE
of correct formulations was 2.6e-4 of the limit (rms_norm and soft_max against their
compositions), 1e-4 (the toy KV walk), 2.5e-6 (the KV walk at 1.5B head sizes) and 0 for
the pure re-indexings, which give bit-identical gradients; the bugs of tests/test_equivalence.py
(wrong positions, wrong sign) come out 10^6 to 10^11 times above it.
"""

from dataclasses import dataclass
from math import prod

from pytest_gradgate.declare.expr import parse_graph
from pytest_gradgate.declare.graph import KnownShape, input_shape, walk
from pytest_gradgate.ops.table import ne4

# ops that copy values without arithmetic: no rounding step
EXACT = frozenset({"view", "permute", "transpose", "cont", "dup", "reshape", "get_rows", "concat", "cpy",
                   "pad", "win_part", "win_unpart", "neg", "abs", "sgn", "step", "relu", "set",
                   "diag_mask_inf", "diag_mask_zero", "clamp"})


def _op_steps(name, s, out):
    """(forward, backward) rounding steps of one op call over input shapes s, output out."""
    a = s.get("a")
    if name == "mul_mat":
        b = s["b"]
        groups = prod(b[2:]) // max(prod(a[2:]), 1)       # broadcast: each a-slice meets this many b-slices
        return a[0], b[1] * groups + a[1]                 # forward: over ne0; backward: over the rows of each side
    if name == "out_prod":
        return a[1], a[0] + s["b"][0]
    if name in ("sum",):
        return prod(a), 1
    if name in ("sum_rows", "mean"):
        return a[0], 1
    if name in ("soft_max", "soft_max_ext", "rms_norm", "norm", "cross_entropy_loss"):
        return 2 * a[0], 2 * a[0]                          # a sum over the row and a scaling, both ways
    if name in ("add", "sub", "mul", "div"):
        repeats = prod(a) // max(prod(s["b"]), 1)         # b's backward sums its repeated copies
        return 2, 2 + repeats
    if name == "repeat":
        return 1, prod(out) // max(prod(a), 1)
    if name == "repeat_back":
        return prod(a) // max(prod(out), 1), 1
    if name in EXACT:
        return 0, 0
    if name in ("im2col", "pool_2d", "rope_ext", "acc", "add1"):
        return 4, a[0]                                    # window sums and rotations: a few terms each
    return 2, 2                                           # elementwise (exp, sqrt, silu, ...): a rounding or two


# ops whose f32 products a backend may round to TF32 (ggml-cuda's cuBLAS calls): mul_mat, and
# out_prod, which mul_mat's backward is made of (check/precision.py)
MATMULS = frozenset({"mul_mat", "out_prod"})


def rounding_steps(case, graph):
    """(forward steps, forward + backward steps) of one graph of `case`, through its loss."""
    steps = steps_of(case, graph)
    return steps.forward, steps.total


@dataclass(frozen=True)
class Steps:
    forward: float          # rounding steps of the forward
    total: float            # ... of the forward and the backward
    forward_matmuls: int = 0    # matmul products (MATMULS) the forward computes
    matmuls: int = 0            # ... the forward and the backward compute (mul_mat's backward: one per operand)


def steps_of(case, graph):
    """The Steps of one graph of `case`, through its loss."""
    leaves = {name: ne4(shape) for name, shape in case.params.items()}
    for name, spec in case.inputs.items():
        leaves[name] = KnownShape(input_shape(spec))
    totals = [0, 0, 0, 0]

    def apply(spec, tensors, params):
        out = tuple(spec.shape(tensors, params))
        fwd, bwd = _op_steps(spec.name, {k: v for k, v in tensors.items() if v is not None}, out)
        totals[0] += fwd
        totals[1] += fwd + bwd
        if spec.name in MATMULS:
            totals[2] += 1
            totals[3] += 3
        return out

    walk(parse_graph(graph), leaves, apply)
    # the loss: sqr and its weights round once each way; its sum does not reach the gradient
    return Steps(totals[0] + 1, totals[1] + 2, totals[2], totals[3])
