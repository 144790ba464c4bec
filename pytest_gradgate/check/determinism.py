"""Determinism of the analytic backward: the same graph computed on two thread counts (on a
backend without threads, twice) must give the same gradients within roundoff.

ggml's CPU kernels split rows between threads; a kernel whose threads write one shared element
(a race) or mishandle the split gives gradients that change with the thread count or from run
to run. Compared with each other, the two runs show it on every run; compared only with the
finite differences, such a bug is a verdict that flips.
"""

import numpy as np

from pytest_gradgate.check.metrics import ggml_index

# Beyond roundoff: the CPU kernels split rows, not sums, so most gradients are bitwise equal on
# any thread count; a kernel that sums per-thread partials (cross-entropy) differs by a few ulps
# of the gradient's scale. A race or a split bug is O(1) of it.
RTOL = 1e-5


def other_threads(threads):
    """The second run's thread count: one (no split at all) against a case's several. A case of
    one thread runs on one again: it asked for no thread team (and a worker must not start one
    before it forks: isolation/worker.py's warm-up)."""
    return 1


def differences(first, second):
    """{param: (count, flat index of the largest, first value, second value)} where the two
    gradient sets differ beyond roundoff (NaN equals NaN); empty when they agree."""
    out = {}
    for name, a in first.items():
        b = second[name]
        both_nan = np.isnan(a) & np.isnan(b)
        scale = max(float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 0.0,
                    float(np.nanmax(np.abs(b))) if np.isfinite(b).any() else 0.0, 1e-30)
        with np.errstate(invalid="ignore"):
            diff = np.where(both_nan, 0.0, np.abs(a - b))
        off = ~(diff <= RTOL * scale)       # NaN on one side only is a difference
        if off.any():
            i = int(np.argmax(np.where(off, np.nan_to_num(diff, nan=np.inf), -1.0)))
            out[name] = (int(off.sum()), i, float(a[i]), float(b[i]))
    return out


def describe(diff, threads, other, repeat_agrees, shapes, backend="cpu"):
    """The diagnosis: which param, how many elements, both values at the worst one, and whether
    two runs on the case's own thread count agree (the thread count matters) or not (a race)."""
    name, (count, i, a, b) = next(iter(diff.items()))
    n = int(np.prod(shapes[name]))
    at = ggml_index(i, list(shapes[name]))
    if backend != "cpu":
        runs = "two runs of the same backward"
        return (f"{name}: nondeterministic: {runs} on {backend} give different gradients at {count} of {n} "
                f"elements, e.g. at {at}: {a:.6g} then {b:.6g} (a race between the backend's threads)")
    if threads == other:
        return (f"{name}: nondeterministic: two runs of the same backward on {threads} thread{'s' if threads != 1 else ''} "
                f"give different gradients at {count} of {n} elements, e.g. at {at}: {a:.6g} then {b:.6g}")
    first = f"{threads} thread{'s' if threads != 1 else ''}"
    second = f"{other} thread{'s' if other != 1 else ''}"
    why = ("two runs on {0} agree with each other, so the result depends on how rows are split between "
           "threads (a row lost, doubled or shared at a thread boundary)" if repeat_agrees
           else "two runs on {0} differ from each other too: a race between the kernel's threads").format(first)
    others = "; " + ", ".join(f"{p}: {c} elements" for p, (c, *_rest) in list(diff.items())[1:]) if len(diff) > 1 else ""
    return (f"{name}: nondeterministic: the backward gives different gradients on {first} and on {second} at "
            f"{count} of {n} elements, e.g. at {at}: {a:.6g} on {first}, {b:.6g} on {second}; {why}{others}")
