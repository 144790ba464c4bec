"""Comparing an analytic gradient with a numeric one, and saying what is wrong.

MAA is test-backend-ops' metric: mean over elements of |a - n| / |a + n|. Unlike
test-backend-ops we never let 0/0 or NaN pass: elements where both sides are zero within
the numeric noise are left out *and counted*, non-finite values fail with a reason.

No false alarms, on principle rather than per-case limits: each numeric element comes with
an estimate of its own error, roundoff (the loss is an f32, so L(x+h) - L(x-h) is only
known to about ulp(L)) plus truncation (the gap between the 2- and 4-point estimates).
A case fails only when its MAA exceeds max_maa plus what that error can explain.
"""

import numpy as np

F32_EPS = float(np.finfo(np.float32).eps)
NOISE_FACTOR = 2.0      # how many times the estimated numeric error an MAA may exceed the limit by
TINY = 1e-30


def numeric_noise(loss_value, n_loss_terms, h, g_h, g4):
    """Per-element error estimate of the numeric gradient g4 (or g_h when g4 is None)."""
    roundoff = F32_EPS * max(abs(loss_value), TINY) * np.sqrt(max(n_loss_terms, 1)) / h
    noise = np.full(np.shape(g_h), roundoff)
    if g4 is not None:
        noise = noise + np.abs(g4 - g_h) / 3.0   # Richardson: |g_half - g4| = |g4 - g_h| / 3
    return noise


def _multi_index(flat, shape_ne):
    """Logical element index -> ggml index (i0, i1, i2, i3)."""
    idx, out = int(flat), []
    for n in shape_ne:
        out.append(idx % n)
        idx //= n
    return out


def compare(analytic, numeric, noise, max_maa, shape_ne=None, n_worst=5):
    """Metrics for one gradient (flat arrays in logical order, i0 fastest)."""
    a = np.asarray(analytic, dtype=np.float64).ravel()
    n = np.asarray(numeric, dtype=np.float64).ravel()
    noise = np.broadcast_to(np.asarray(noise, dtype=np.float64), a.shape)
    shape_ne = shape_ne or [a.size, 1, 1, 1]
    out = {"n_elements": int(a.size), "excluded": {}}
    bad_a, bad_n = ~np.isfinite(a), ~np.isfinite(n)
    if bad_a.any() or bad_n.any():
        out.update(maa=float("inf"), noise_maa=0.0, cosine=float("nan"), norm_ratio=float("nan"),
                   max_abs_err=float("inf"), n_compared=0, passed=False,
                   nonfinite_analytic=int(bad_a.sum()), nonfinite_numeric=int(bad_n.sum()),
                   first_nonfinite=_multi_index(int(np.argmax(bad_a | bad_n)), shape_ne), worst=[])
        return out
    both_zero = (np.abs(a) <= noise) & (np.abs(n) <= noise)
    if both_zero.any():
        out["excluded"]["both zero within numeric noise"] = int(both_zero.sum())
    keep = ~both_zero
    ak, nk, noisek = a[keep], n[keep], noise[keep]
    denom = np.maximum(np.abs(ak + nk), TINY)
    asym = np.abs(ak - nk) / denom
    maa = float(asym.mean()) if asym.size else 0.0
    noise_maa = float(np.minimum(noisek / denom, 1.0).mean()) if asym.size else 0.0
    na, nn = float(np.linalg.norm(a)), float(np.linalg.norm(n))
    cosine = float(a @ n / (na * nn)) if na > 0 and nn > 0 else (1.0 if na == nn else 0.0)
    err = np.abs(a - n)
    worst = np.argsort(-err, kind="stable")[:n_worst]
    out.update(
        maa=maa, noise_maa=noise_maa, limit=max_maa + NOISE_FACTOR * noise_maa,
        cosine=cosine, norm_ratio=(na / nn) if nn > 0 else (float("inf") if na > 0 else 1.0),
        max_abs_err=float(err.max()) if err.size else 0.0, n_compared=int(keep.sum()),
        passed=bool(maa <= max_maa + NOISE_FACTOR * noise_maa),
        worst=[{"index": _multi_index(i, shape_ne), "analytic": float(a[i]), "numeric": float(n[i])}
               for i in worst if err[i] > 0],
    )
    return out


def scramble(values, seed):
    """The same values at other positions: what a backward reading the wrong strides yields."""
    rng = np.random.default_rng(seed)
    flat = np.asarray(values, dtype=np.float64).ravel()
    return flat[rng.permutation(flat.size)]


def has_power(analytic, numeric, noise, max_maa, seed=1234):
    """True when a scrambled copy of the analytic gradient would fail the comparison.

    Two scrambles (a random permutation and a reversal) must both fail: a case whose
    incoming gradient is uniform (SUM loss on a linear op) fails neither."""
    a = np.asarray(analytic, dtype=np.float64).ravel()
    for scrambled in (scramble(a, seed), a[::-1]):
        if compare(scrambled, numeric, noise, max_maa)["passed"]:
            return False
    return True


def diagnose(analytic, numeric, noise, metrics, max_maa):
    """A sentence a person can act on, for a comparison that failed."""
    if metrics.get("nonfinite_analytic"):
        return (f"analytic gradient has {metrics['nonfinite_analytic']} non-finite values "
                f"(first at {metrics['first_nonfinite']}): the backward produces NaN/Inf")
    if metrics.get("nonfinite_numeric"):
        return (f"the loss is not finite near the inputs ({metrics['nonfinite_numeric']} numeric gradient values "
                "are NaN/Inf): narrow the case's init range")
    a = np.asarray(analytic, dtype=np.float64).ravel()
    n = np.asarray(numeric, dtype=np.float64).ravel()
    noise = np.broadcast_to(np.asarray(noise, dtype=np.float64), a.shape)
    if np.all(np.abs(a) <= noise) and not np.all(np.abs(n) <= noise):
        return "analytic gradient is zero where the numeric one is not: the backward drops this gradient"
    cos = metrics["cosine"]
    sorted_metrics = compare(np.sort(a), np.sort(n), np.sort(noise), max_maa)
    if sorted_metrics["maa"] <= max(10 * max_maa, sorted_metrics["limit"]) and abs(cos) < 0.999:
        return ("right values at wrong positions: the analytic gradient is a permutation of the numeric one "
                f"(cosine {cos:.3f}); the backward reads the incoming gradient with the wrong strides or order")
    if abs(cos) > 0.999:
        k = float(a @ n / max(n @ n, TINY))
        if abs(k + 1) < 0.01:
            return "wrong sign: analytic = -numeric"
        return f"wrong scale: analytic = {k:.4g} x numeric (cosine {cos:.4f})"
    return f"values disagree (cosine {cos:.3f}, norm ratio {metrics['norm_ratio']:.3g})"
