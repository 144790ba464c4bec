"""Are the finite differences evidence here? Asked before a failed comparison blames the backward.

Central differences are only evidence where the loss is smooth over [x - h, x + h]. Where the
step crosses a kink, a pole or a jump (div with b near 0, step near 0, relu at 0), the estimate
says nothing about the true gradient, and its error bound (metrics.numeric_noise, which
extrapolates a Taylor series) does not hold either. The sign used: halve the step and estimate
again. Where the series holds, the estimate moves by a small part of the term the stencil
removed; where it does not, it moves by as much as that term or more: a jump gives 1/(2h)
against 1/h, a pole a series that does not converge, a kink an estimate that moves with the
step. (The error bound itself cannot be the yardstick: it grows with the stencil's gap, which
is largest exactly there.)

An element that fails this is left out of the verdict. If the elements that are left still
disagree, the backward is blamed as before; if they agree (or none are left), the outcome is
"numeric gradient unreliable here", with what to change, and the backward is not blamed.
"""

import numpy as np

from pytest_gradgate.check import metrics


SERIES_RATIO = 0.25      # how much of the h^2 term the estimate may still move by when h is halved


def halved_step_disagrees(numeric_h, numeric_half, gap_h, roundoff, max_maa):
    """Per element: the estimate moves with the step by more than a convergent series allows.

    For a smooth loss the 4-point estimates at h and h/2 differ by an h^4 term, a small part of
    the h^2 term that the 4-point stencil removed (gap_h = |g4 - g_h|, ~0.05 of it for exp at
    h = 0.1); across a jump they differ by as much as that term itself (7/6h against 7/3h), near
    a pole by more. The 2-point stencil has no gap to scale by (gap_h = 0): any change beyond
    roundoff is truncation that its error bound does not cover. A change below the case's own
    limit relative to the estimate does not matter either way."""
    n_h, n_half = np.asarray(numeric_h, dtype=np.float64), np.asarray(numeric_half, dtype=np.float64)
    moved = np.abs(n_h - n_half)
    return ((moved > metrics.NOISE_FACTOR * roundoff) & (moved > max_maa * np.abs(n_h))
            & (moved > SERIES_RATIO * np.asarray(gap_h)))


def reliable_part_passes(analytic, numeric, noise, unreliable, max_maa):
    """-> (passes, metrics of the reliable elements or None when no element is left)."""
    keep = ~unreliable
    if not keep.any():
        return True, None
    m = metrics.compare(np.asarray(analytic)[keep], np.asarray(numeric)[keep],
                        np.broadcast_to(noise, np.shape(numeric))[keep], max_maa)
    return m["passed"], m


def advice(name, values, unreliable, h, shape_ne, n_show=3):
    """What to change, naming where the step is not trustworthy and the param's values there."""
    where = np.flatnonzero(unreliable)
    shown = ", ".join(f"{metrics.ggml_index(int(i), shape_ne)} (x = {values[i]:+.3g})" for i in where[:n_show])
    return (f"{name}: numeric gradient unreliable at {where.size} of {unreliable.size} elements: halving the step "
            f"{h:g} moves the finite difference more than a smooth loss allows (the step crosses a kink, pole or "
            "jump), "
            f"e.g. at {shown}; use a smaller eps, or an init range that keeps the inputs more than eps away from "
            "the op's singular points; the backward is not blamed")
