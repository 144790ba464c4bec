"""Two sets of gradients of one computation, compared, whatever produced them.

A GradientSet is one computation's forward output and the gradient of the loss for each
param, with the f32 rounding steps it took (check/roundoff.py). An equivalence case makes
one per formulation (check/equivalence.py). A cross-backend parity check (one graph on CPU
and on CUDA) makes one per backend and calls the same `compare_sets`: nothing here knows
what produced a set, so the limit, the metrics and the diagnoses are the same for both.

The forward outputs are compared first. When they differ beyond roundoff the two
computations are not of one function, and their gradients say nothing about a backward:
the comparison then makes no gradient claim at all.
"""

from dataclasses import dataclass, field

import numpy as np

from pytest_gradgate.check import concentration, precision
from pytest_gradgate.check.metrics import ggml_index
from pytest_gradgate.check.outcome import Diagnosis, Status

F32_EPS = float(np.finfo(np.float32).eps)
# margin over F32_EPS * sqrt(steps) for what the step count leaves out (conditioning,
# kernels that round more than once per term); check/roundoff.py's docstring has the figures
SAFETY = 16.0
N_WORST = 5


@dataclass
class GradientSet:
    label: str                      # "chunked", "whole", "cpu", "cuda0", ...
    output: np.ndarray              # forward output, logical order (i0 fastest), float64
    output_shape: tuple             # ne4 of the output
    grads: dict                     # param -> gradient, logical order, float64
    shapes: dict                    # param -> ne4
    forward_steps: float = 1.0      # rounding steps of the forward (roundoff.steps_of)
    steps: float = 1.0              # ... of the forward and the backward
    extra: dict = field(default_factory=dict)
    matmuls: int = 0                # matmul products in the forward and backward (roundoff.Steps)
    forward_matmuls: int = 0        # ... in the forward
    precision: str = "f32"          # what its matmuls round their inputs to (check/precision.py)

    def variance(self, forward=False):
        """(f32 part, input-rounding part) of this computation's relative roundoff variance: each
        rounding step of size F32_EPS (matmuls' sums included: they still sum in f32), and,
        where this side's matmuls round their inputs (TF32), precision.input_variance per matmul."""
        steps, matmuls = (self.forward_steps, self.forward_matmuls) if forward else (self.steps, self.matmuls)
        return F32_EPS ** 2 * steps, precision.input_variance(self.precision) * matmuls


def nmse_limit(steps_a, steps_b):
    """NMSE two f32 computations of one quantity may show from their roundoff alone."""
    return (SAFETY * F32_EPS) ** 2 * max(steps_a + steps_b, 1.0)


def set_limit(a, b, forward=False):
    """NMSE GradientSets a and b may show from their roundoff alone, each at its own precision
    (nmse_limit when both are f32)."""
    (fa, ra), (fb, rb) = a.variance(forward), b.variance(forward)
    return SAFETY ** 2 * max(fa + fb, F32_EPS ** 2) + precision.SAFETY ** 2 * (ra + rb)


def compare_values(a, b, limit, shape_ne, labels=("a", "b")):
    """Metrics of two computations of one tensor: NMSE (of the difference, over the mean
    energy of the two, so that neither is taken for the truth), cosine, norm ratio a/b,
    the largest differences with their ggml indices."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    out = {"n_elements": int(a.size), "limit": float(limit), "labels": list(labels)}
    bad_a, bad_b = ~np.isfinite(a), ~np.isfinite(b)
    if bad_a.any() or bad_b.any():
        out.update(nmse=float("inf"), cosine=float("nan"), norm_ratio=float("nan"), max_abs_diff=float("inf"),
                   passed=False, nonfinite={labels[0]: int(bad_a.sum()), labels[1]: int(bad_b.sum())},
                   first_nonfinite=ggml_index(int(np.argmax(bad_a | bad_b)), shape_ne), worst=[])
        return out
    diff = a - b
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    energy = 0.5 * (na * na + nb * nb)
    nmse = float(diff @ diff / energy) if energy > 0 else 0.0
    cosine = float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    err = np.abs(diff)
    worst = np.argsort(-err, kind="stable")[:N_WORST]
    out.update(nmse=nmse, cosine=cosine, norm_ratio=(na / nb) if nb > 0 else (float("inf") if na > 0 else 1.0),
               max_abs_diff=float(err.max()) if err.size else 0.0, passed=bool(nmse <= limit),
               worst=[{"index": ggml_index(i, shape_ne), labels[0]: float(a[i]), labels[1]: float(b[i])}
                      for i in worst if err[i] > 0])
    return out


# two copies of one f32 value computed by the same kernels agree to a few ulps; values that
# match this closely by chance are rare, and a control measures how rare (_recurring)
MATCH_RTOL = 8 * F32_EPS
# "wrong positions" when at least this share of the values recur elsewhere beyond chance, and
# at least RECURRING_OVER_CHANCE times as often as chance: on 10^5 values chance is known to
# a few 0.01%, so both are far outside its noise (the seed's bug at 1.5B: 19% against 1.3%)
MIN_RECURRING = 0.1
RECURRING_OVER_CHANCE = 5.0


def _found(values, pool):
    """Share of `values` with an element of `pool` within MATCH_RTOL of it."""
    pool = np.sort(pool)
    if pool.size < 2 or not values.size:
        return 0.0
    pos = np.clip(np.searchsorted(pool, values), 1, pool.size - 1)
    nearest = np.minimum(np.abs(pool[pos] - values), np.abs(pool[pos - 1] - values))
    return float((nearest <= MATCH_RTOL * np.abs(values)).mean())


def _recurring(a, b, seed=0):
    """(share of a's values found in b at *other* positions, the share a control finds by chance).

    The control is a with each value moved by up to 100 MATCH_RTOL: the same distribution,
    but no value is really b's. In a large gradient almost every value has a near neighbour in
    b, so "found" alone would say nothing; only what is found beyond the control is evidence."""
    same_place = float((np.abs(a - b) <= MATCH_RTOL * np.abs(a)).mean())
    control = a * (1 + np.random.default_rng(seed).uniform(-100, 100, a.size) * MATCH_RTOL)
    return max(_found(a, b) - same_place, 0.0), _found(control, b)


def diagnose(a, b, m, labels, shape_ne=None):
    """(Diagnosis, sentence) for two gradients that differ: the verdict classes of the
    finite-difference check (metrics.diagnose), said of two computations, neither the truth,
    and each claimed only on evidence this comparison has."""
    la, lb = labels
    if m.get("nonfinite"):
        which = [k for k, n in m["nonfinite"].items() if n]
        return Diagnosis.NONFINITE_BACKWARD, (f"{' and '.join(which)} give non-finite values (first at "
                                              f"{m['first_nonfinite']})")
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    scale = float(np.sqrt(0.5 * (a @ a + b @ b) / max(a.size, 1)))
    tiny = np.sqrt(m["limit"]) * scale      # what roundoff explains, per element
    for x, y, lx, ly in ((a, b, la, lb), (b, a, lb, la)):
        if np.all(np.abs(x) <= tiny) and not np.all(np.abs(y) <= tiny):
            return Diagnosis.DROPPED, f"{lx}'s gradient is zero where {ly}'s is not: one backward drops this gradient"
    cos, ratio = m["cosine"], m["norm_ratio"]
    sorted_m = compare_values(np.sort(a), np.sort(b), m["limit"], [a.size, 1, 1, 1])
    if sorted_m["passed"] and abs(cos) < 0.999:
        return Diagnosis.WRONG_POSITIONS, (f"right values at wrong positions: {la}'s gradient is a permutation of "
                                           f"{lb}'s (cosine {cos:.3f}); one of their backwards reads a gradient with "
                                           "the wrong strides or order")
    if abs(cos) > 0.999:
        k = float(a @ b / max(b @ b, 1e-300))
        if abs(k + 1) < 0.01:
            return Diagnosis.WRONG_SIGN, f"wrong sign: {la} = -{lb}"
        # only a scale whose undoing makes the two agree (as metrics.diagnose)
        if k != 0 and compare_values(a / k, b, m["limit"], [a.size, 1, 1, 1])["passed"]:
            return Diagnosis.WRONG_SCALE, f"wrong scale: {la} = {k:.4g} x {lb} (cosine {cos:.4f})"
    few = concentration.concentrated(
        a - b, lambda i: ggml_index(i, shape_ne or [a.size, 1, 1, 1]),
        lambda keep: compare_values(a[keep], b[keep], m["limit"], [int(keep.sum()), 1, 1, 1])["passed"])
    if few is not None:
        return Diagnosis.CONCENTRATED, f"{few} (cosine {cos:.6f})"
    if abs(cos) > 0.999:
        return Diagnosis.DISAGREE, (f"values disagree by an error spread over the elements, with no wrong scale, sign "
                                    f"or positions behind it (cosine {cos:.6f}, {la} = {k:.6g} x {lb})")
    for x, y, lx, ly in ((a, b, la, lb), (b, a, lb, la)):
        found, chance = _recurring(x, y)
        if found - chance >= MIN_RECURRING and found >= RECURRING_OVER_CHANCE * chance:
            # a slice read with the wrong strides returns real gradient values from wrong places,
            # some summed with others (a prefix read by several chunks), so not a permutation
            return Diagnosis.WRONG_POSITIONS, (
                f"right values at wrong positions: {found:.0%} of {lx}'s gradient values occur in {ly}'s at other "
                f"positions (a control finds {chance:.0%} by chance; cosine {cos:.3f}, norm ratio {ratio:.3g}); one of "
                "their backwards reads a gradient with the wrong strides or offsets")
    return Diagnosis.DISAGREE, f"values disagree (cosine {cos:.3f}, norm ratio {ratio:.3g})"


def compare_sets(a, b):
    """Compare GradientSet a with b: the forward first, then each param's gradient.

    -> {"pair", "forward": metrics, "forward_differs": bool, "params": [metrics + name, shape,
    diagnosis_kind, diagnosis], "failed": [param names]}; no param is compared when the
    forwards differ."""
    labels = (a.label, b.label)
    if a.output_shape != b.output_shape:
        forward = {"nmse": float("inf"), "passed": False, "limit": 0.0, "labels": list(labels),
                   "shape_mismatch": [list(a.output_shape), list(b.output_shape)], "worst": []}
    else:
        forward = compare_values(a.output, b.output, set_limit(a, b, forward=True),
                                 list(a.output_shape), labels)
    out = {"pair": f"{a.label}/{b.label}", "forward": forward, "forward_differs": not forward["passed"],
           "params": [], "failed": []}
    if out["forward_differs"]:
        return out
    limit = set_limit(a, b)
    for name, ga in a.grads.items():
        gb = b.grads[name]
        m = compare_values(ga, gb, limit, list(a.shapes[name]), labels)
        m.update(name=name, shape=list(a.shapes[name]), pair=out["pair"])
        if not m["passed"]:
            kind, m["diagnosis"] = diagnose(ga, gb, m, labels, list(a.shapes[name]))
            m["diagnosis_kind"] = str(kind)
            out["failed"].append(name)
        out["params"].append(m)
    return out


def settle(result, params):
    """Put a case's param comparisons on its result: the worst param's figures, the elements
    compared, PASSED, or FAILED with the first failing param's diagnosis kind -> the failing
    params (the equivalence and parity checks word the failure each their own way)."""
    result.params.extend(params)
    worst = max(result.params, key=lambda m: m["nmse"] / max(m["limit"], 1e-300))
    result.nmse, result.limit, result.cosine = worst["nmse"], worst["limit"], worst.get("cosine")
    result.n_compared = sum(m["n_elements"] for m in result.params)
    failed = [m for m in result.params if not m["passed"]]
    result.status = Status.FAILED if failed else Status.PASSED
    if failed:
        result.kind = Diagnosis(failed[0]["diagnosis_kind"])
    return failed
