"""Fast mode: check a gradient along a few random directions instead of element by element.

For a direction d, the analytic side is d . grad and the numeric side is
(L(x + h d) - L(x - h d)) / 2h: 2 (or 4) forward passes per direction whatever the
tensor's size, instead of 2 (or 4) per element. A scrambled gradient g' = P g gives
d . g' unrelated to d . g, so every direction disagrees by O(1).

Why Rademacher directions (every entry +1 or -1) and the case's own eps as step: each
element moves by exactly +-eps, as in the element-wise check, so the case's init range
and eps stay valid (log, sqrt), and the truncation error per element is the same. The
signal d . g grows like |g|_2 while the loss's f32 roundoff (about ulp(L), the same for
any perturbation) does not, so the directional estimate is sqrt(n) times more precise
than one element's. A unit-norm direction would move each element by eps/sqrt(n) only,
and for n = 10^6 the loss change would drown in ulp(L).

Where roundoff still dominates (a loss summing ~10^5 terms or more), the step of that
direction is grown by what is missing, at most 8x, and kept only where the estimates at h
and h/2 agree within roundoff (truncation measured negligible): h balances the two. Fast
mode therefore always evaluates both steps (the 4-point stencil), whatever the case's
stencil says: the gap between them is the evidence the step choice needs.

When a direction disagrees, a random sample of elements is checked one by one (as many as
a time budget allows) to locate the error: worst elements with their indices, and a
diagnosis ("right values at wrong positions, likely" when the sampled elements disagree one
by one while the values' size, their rms, matches the analytic gradient's; a wrong scale
or sign, a dropped gradient, as metrics.diagnose says on the sample otherwise).
"""

import time

import numpy as np

from pytest_gradgate.check import metrics
from pytest_gradgate.check.outcome import Diagnosis

STEP_GROWTH_MAX = 8.0       # a longer step than 8 eps leaves the regime the case's eps was chosen for
LOCATE_BUDGET_S = 0.5       # forward-pass time per param spent locating an error along the elements
LOCATE_MIN, LOCATE_MAX = 8, 256
LOCATE_TARGET = 0.05        # locating needs each sampled element to 5%, not to max_maa
LOCATE_GROWTH_MAX = 64.0    # elements alone need longer steps; kept only where truncation stays small
SCRAMBLE_RMS_RATIO = 1.5    # a scramble keeps the values' size: sampled rms within this of the analytic's


PROJECT_BLOCK = 1 << 15     # columns of the directions cast to float64 at a time (project)


def rademacher(seed, k, n):
    rng = np.random.default_rng(seed + 104729)
    return (rng.integers(0, 2, size=(k, n), dtype=np.int8) * 2 - 1).astype(np.float32)


def project(dirs, values):
    """dirs @ values, accumulated in float64, without a float64 copy of all the directions:
    for a 1M-element param that copy is 48 MB of fresh pages, which the kernel zeroes in
    each case's child (8% of a suite run's CPU); a block of columns at a time costs 1.5 MB."""
    values = np.asarray(values).ravel()    # float32 values are cast a block at a time too
    k, n = dirs.shape
    out = np.zeros(k)
    block = np.empty((k, min(n, PROJECT_BLOCK)))
    for start in range(0, n, PROJECT_BLOCK):
        width = min(PROJECT_BLOCK, n - start)
        part = block[:, :width]
        np.copyto(part, dirs[:, start:start + width])
        out += part @ values[start:start + width]
    return out


def roundoff(loss_scale, h, precise=True):
    """The roundoff part of metrics.numeric_noise: ulp of the loss's f32 sum, over the step."""
    return float(np.max(metrics.numeric_noise(loss_scale, h, np.zeros(1), np.zeros(1) if precise else None)))


def _estimate(d_h, d_half, loss_scale, h):
    """(numeric, noise): the Richardson combination when there is a half step, and its error bound."""
    numeric = d_h if d_half is None else (4 * d_half - d_h) / 3
    return numeric, metrics.numeric_noise(loss_scale, h, d_h, None if d_half is None else numeric)


def _along(g, session, gf, t, loss, dirs, h, precise=True):
    lib, ffi = g.lib, g.ffi
    k = dirs.shape[0]
    d_h = np.empty(k)
    d_half = np.empty(k) if precise else None
    st = lib.gg_directional(session, gf, t, loss, ffi.from_buffer("float[]", dirs), k, h,
                            ffi.from_buffer("double[]", d_h), ffi.from_buffer("double[]", d_half) if precise else ffi.NULL)
    if st != 0:
        raise RuntimeError(f"forward compute failed during finite differences (ggml_status {st})")
    return d_h, d_half


def _at(g, session, gf, t, loss, idx, h, precise=True):
    lib, ffi = g.lib, g.ffi
    g_h = np.empty(idx.size)
    g_half = np.empty(idx.size) if precise else None
    st = lib.gg_numeric_grad_at(session, gf, t, loss, h, ffi.from_buffer("int64_t[]", idx), idx.size,
                                ffi.from_buffer("double[]", g_h), ffi.from_buffer("double[]", g_half) if precise else ffi.NULL)
    if st != 0:
        raise RuntimeError(f"forward compute failed during finite differences (ggml_status {st})")
    return g_h, g_half


def _with_chosen_step(compute, h, loss_scale, signal, target, growth_max=None):
    """Estimates with a step chosen per entry: h (the case's eps), or longer where roundoff
    would exceed `target` x signal.

    The roundoff bound is known before computing (it needs only loss_scale and the step) and
    the signal comes from the analytic side, so the step is chosen up front. A longer step
    is kept only where the 2- and 4-point estimates agree within roundoff there (truncation
    measured negligible, as for a loss quadratic in the param); elsewhere the entry is
    computed again at h: the error model extrapolates truncation, and at a step it was not
    chosen for that extrapolation has been seen to fall short (attention's K, 8x eps).
    compute(h, idx) -> (d_h, d_half) for the entries idx."""
    need = roundoff(loss_scale, h, True) / np.maximum(target * np.asarray(signal, dtype=np.float64), metrics.TINY)
    # powers of two, so that entries needing similar steps share one call
    grow = np.minimum(growth_max or STEP_GROWTH_MAX, 2.0 ** np.ceil(np.log2(np.maximum(need, 1.0))))
    numeric = np.empty(grow.shape)
    noise = np.empty(grow.shape)
    gap = np.empty(grow.shape)
    steps = h * grow
    for factor in np.unique(grow):
        idx = np.flatnonzero(grow == factor)
        step = float(h * factor)
        d_h, d_half = compute(step, idx)
        numeric[idx], noise[idx] = _estimate(d_h, d_half, loss_scale, step)
        gap[idx] = np.abs(numeric[idx] - d_h)
    settled = gap <= np.array([roundoff(loss_scale, s, True) for s in steps])
    retry = np.flatnonzero((grow > 1) & ~settled)
    if retry.size:
        d_h, d_half = compute(float(h), retry)
        numeric[retry], noise[retry] = _estimate(d_h, d_half, loss_scale, float(h))
        steps[retry] = h
    return numeric, noise, steps


def check(g, session, gf, t, loss, case, analytic, loss_scale):
    """Directional check of one param. Returns what engine._compare reads: analytic and
    numeric projections, their noise, how to project a gradient on the directions, and when it fails, the located elements."""
    n = analytic.size
    points = 4   # always both steps: the gap between them is what the step choice is judged by
    dirs = rademacher(case.seed, case.directions, n)
    projected = project(dirs, analytic)
    target = case.max_maa / 4

    started = time.perf_counter()
    calls = {"forwards": 0}

    def along(h, rows):
        # all of them (one step for every direction: rms_norm's, attention's q) need no copy;
        # for a 1M-element param a copy is 24 MB of fresh pages, 30-40 ms in a case's child
        chosen = dirs if len(rows) == len(dirs) else np.ascontiguousarray(dirs[rows])
        calls["forwards"] += chosen.shape[0] * points
        return _along(g, session, gf, t, loss, chosen, h)

    numeric, noise, steps = _with_chosen_step(along, float(case.eps), loss_scale, np.abs(projected), target)
    forward_s = (time.perf_counter() - started) / max(calls["forwards"], 1)

    # "worst" of the projections would name direction numbers, not elements: filled only by locate()
    report = {"worst": [], "fast": {"directions": int(case.directions), "kind": "rademacher",
                                    "steps": [float(s) for s in steps], "forward_passes": calls["forwards"],
                                    # the numeric side's own error bound, relative: what the step choice keeps small
                                    "relative_error_bound": float(np.max(noise) / max(np.sqrt(np.mean(numeric ** 2)),
                                                                                      metrics.TINY)),
                                    "forward_ms": round(forward_s * 1e3, 3),
                                    # which error is large, for what would settle an inconclusive case
                                    "noise_max": float(np.max(noise)),
                                    "roundoff": roundoff(loss_scale, float(case.eps))}}
    # the power probe's parameter gradients are compared along the same directions
    out = {"analytic": projected, "numeric": numeric, "noise": noise, "report": report,
           "project": lambda values: project(dirs, values)}
    if not metrics.verdict(projected, numeric, noise, case.max_maa)[1]:
        located, (kind, text) = locate(g, session, gf, t, loss, case, analytic, loss_scale, forward_s * points)
        # the evidence behind the failure: which directions disagree, and (located) which elements
        err = np.abs(projected - numeric)
        off = np.flatnonzero(err > metrics.NOISE_FACTOR * noise + case.max_maa * np.abs(projected + numeric))
        report["disagreeing_directions"] = [int(i) for i in off]
        report["located"] = located
        report["worst"] = located["worst"]
        out["diagnosis"] = (kind, f"{text}; directions {', '.join(map(str, off.tolist())) or '-'} of "
                                  f"{int(case.directions)} disagree")
    return out


MIN_DIRECTIONS_COMPARED = 4   # fewer is not evidence: one or two directions can agree by chance
NOISE_DOMINATES = 10.0        # a limit above 10 x max_maa from numeric noise alone passes real bugs


def lacks_evidence(m, case):
    """Why the comparison of the directions is no evidence either way, or "" when it is.

    Evidence needs enough directions compared (a direction where both sides are zero within
    the numeric noise is left out) and a limit that the numeric side's own error does not
    dominate (noise_maa far above max_maa: the comparison would pass a gradient wrong by that
    much). What would settle it depends on which error is large: truncation (the step leaves the
    range where the loss is near quadratic in the param) wants a smaller eps, roundoff a longer
    one or more directions."""
    fast = m.get("fast") or {}
    if fast.get("noise_max", 0.0) > 2 * fast.get("roundoff", 0.0):
        fix = "a smaller eps (the numeric error is truncation: the step is too long for this param)"
    else:
        fix = f"a longer eps or more directions (directions: {2 * int(case.directions)})"
    settle = f"{fix}, or this case in full mode on a smaller shape, would settle it"
    if m["n_compared"] < MIN_DIRECTIONS_COMPARED:
        return (f"only {m['n_compared']} of {int(case.directions)} directions compared (the others are zero within "
                f"the numeric noise); {settle}")
    if m.get("noise_maa", 0.0) > NOISE_DOMINATES * case.max_maa:
        return (f"the numeric side's own error dominates the limit (limit {m['limit']:.3g}, of which "
                f"{m['noise_maa']:.3g} is numeric noise, against max_maa {case.max_maa:g}); {settle}")
    return ""


def locate(g, session, gf, t, loss, case, analytic, loss_scale, seconds_per_element):
    """Check a random sample of elements one by one; -> (located dict, diagnosis)."""
    n = analytic.size
    k = int(LOCATE_BUDGET_S / max(seconds_per_element, 1e-9))
    k = min(n, max(LOCATE_MIN, min(LOCATE_MAX, k)))
    rng = np.random.default_rng(case.seed + 7)
    idx = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
    a = analytic[idx]

    def at(h, rows):
        chosen = np.ascontiguousarray(idx[rows])
        return _at(g, session, gf, t, loss, chosen, h)

    numeric, noise, steps = _with_chosen_step(at, float(case.eps), loss_scale, np.abs(a), LOCATE_TARGET,
                                              LOCATE_GROWTH_MAX)
    m = metrics.compare(a, numeric, noise, case.max_maa)
    shape = _shape_of(g, t)
    err = np.abs(a - numeric)
    order = np.argsort(-err, kind="stable")[:5]
    mismatched = err > 3 * noise + 10 * case.max_maa * np.abs(a + numeric)
    located = {
        "n_sampled": int(k), "n_elements": int(n), "n_mismatched": int(mismatched.sum()),
        "maa": float(m["maa"]), "cosine": float(m["cosine"]), "step": float(np.max(steps)),
        "worst": [{"index": metrics.ggml_index(int(idx[i]), shape), "analytic": float(a[i]),
                   "numeric": float(numeric[i])} for i in order if err[i] > 0],
    }
    return located, _diagnose(analytic, a, numeric, noise, m, mismatched, case.max_maa, k, n)


def _shape_of(g, t):
    ne, _ = g.layout(t)
    return [int(x) for x in ne]


def _diagnose(analytic, a, numeric, noise, m, mismatched, max_maa, k, n):
    """What a sample of elements says about a disagreement found along the directions.

    Large tensors hold so many distinct values that "does each numeric value occur somewhere
    in the analytic gradient" is true of anything; what a scramble keeps is the size of the
    values (the norm), while position by position they no longer agree."""
    sample = f"{k} of {n} elements checked one by one"
    if not mismatched.any() and m["passed"]:
        return Diagnosis.SAMPLE_AGREES, (f"directions disagree but no sampled element does ({sample}): the error sits in few elements, "
                "or is below what one element's finite difference resolves; run the case in full mode on a "
                "smaller shape to see it")
    rms_ratio = float(np.sqrt(np.mean(analytic ** 2)) / max(np.sqrt(np.mean(numeric ** 2)), metrics.TINY))
    cos = m["cosine"]
    if k >= LOCATE_MIN and abs(cos) < 0.9 and 1 / SCRAMBLE_RMS_RATIO < rms_ratio < SCRAMBLE_RMS_RATIO:
        return Diagnosis.WRONG_POSITIONS, (f"right values at wrong positions, likely: {int(mismatched.sum())} of {sample} disagree "
                f"(cosine {cos:.3f}) while the gradient's size matches (rms ratio {rms_ratio:.2f}); "
                "the backward reads the incoming gradient with the wrong strides or order")
    kind, text = metrics.diagnose(a, numeric, noise, m, max_maa)
    return kind, f"{text} ({sample})"
