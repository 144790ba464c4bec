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

The central differences see only the odd part of the loss around x. A pole inside the step can
hide from them: div(a, b) with |b| << h, where L(x+h) and L(x-h) are both small and nearly equal
while L(x) is huge, gives central differences of about 0 at h and at h/2 alike, and the halved
estimate agrees with the first. Its even part, L(x+h) + L(x-h) - 2 L(x), does not: where the loss
is smooth it is h^2 times the curvature plus higher even powers of h, so halving the step divides
it by 4 or more; across a kink by 2, across a pole or a jump by about 1 (it is the value at x
against the values out of reach). So an element is also unreliable where its even part, larger
than its odd part over the step and than roundoff, shrinks by less than EVEN_RATIO when h is
halved (even_part_diverges). Both signs come from the finite differences alone: the backward's
own values never decide whether the finite differences are evidence.

An element that fails this is left out of the verdict. If the elements that are left still
disagree, the backward is blamed as before; if they agree (or none are left), the outcome is
"numeric gradient unreliable here", with what to change, and the backward is not blamed.
"""

import numpy as np

from pytest_gradgate.check import metrics


SERIES_RATIO = 0.25      # how much of the h^2 term the estimate may still move by when h is halved
SUSPECT_SHARE = 0.5      # elements whose excess is above this share of max_maa are halved first
EVEN_RATIO = 3.0         # a smooth loss's even part shrinks 4-fold or more with the step halved; a kink 2-fold


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


def even_part_diverges(even_h, even_half, numeric, h, roundoff):
    """Per element: the loss's even part around x (even_h at step h, even_half at h/2) shrinks
    by less than EVEN_RATIO when the step is halved, while it outweighs both the odd part over
    the step (|numeric| h) and the loss's roundoff (roundoff, a gradient's, times h)."""
    e_h, e_half = np.abs(np.asarray(even_h, dtype=np.float64)), np.abs(np.asarray(even_half, dtype=np.float64))
    return ((e_h < EVEN_RATIO * e_half) & (e_h > np.abs(numeric) * h)
            & (np.abs(e_h - 4 * e_half) > metrics.NOISE_FACTOR * roundoff * h))


def unreliable_elements(analytic, numeric, noise, gap_h, roundoff, max_maa, halved_at, even_at=None, h=None):
    """-> (unreliable mask, elements at which the halved step was taken, whether the reliable
    part passes), exactly as halving the step at every element would decide, at less cost.

    The halved step is taken first only where the comparison disagrees: at the elements whose
    excess (metrics.excess) is above SUSPECT_SHARE of max_maa. If what is left once the
    unreliable ones among them are removed still fails, it is taken nowhere else: every other
    element has an excess below max_maa, and removing elements below the limit from a set whose
    mean is above it leaves a mean above it, so no further removal could make it pass. Only when
    it passes is the step halved at the rest too, and the verdict taken over all of them. (At
    test-backend-ops' silu and softplus cases, eps 15 at 5,005 elements, the step is halved at
    602 and 550 of them.)"""
    numeric = np.asarray(numeric, dtype=np.float64).ravel()
    gap_h = np.broadcast_to(np.asarray(gap_h, dtype=np.float64), numeric.shape)
    suspect = metrics.excess(analytic, numeric, noise) > SUSPECT_SHARE * max_maa
    unreliable = np.zeros(numeric.size, dtype=bool)
    taken = 0
    for where in (np.flatnonzero(suspect), np.flatnonzero(~suspect)):
        if where.size:
            unreliable[where] = halved_step_disagrees(numeric[where], halved_at(where), gap_h[where], roundoff,
                                                      max_maa)
            if even_at is not None:
                unreliable[where] |= even_part_diverges(*even_at(where), numeric[where], h, roundoff)
            taken += where.size
        passes, _ = reliable_part_passes(analytic, numeric, noise, unreliable, max_maa)
        if not passes:
            break
    return unreliable, taken, passes


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
            f"{h:g} changes the finite differences (or the loss's even part around x) more than a smooth loss "
            "allows (the step crosses a kink, pole or jump), "
            f"e.g. at {shown}; use a smaller eps, or an init range that keeps the inputs more than eps away from "
            "the op's singular points; the backward is not blamed")
