"""Comparing an analytic gradient with a numeric one, and saying what is wrong.

MAA is test-backend-ops' metric: mean over elements of |a - n| / |a + n|. Unlike
test-backend-ops we never let 0/0 or NaN pass: elements where both sides are zero within
the numeric noise are left out *and counted*, non-finite values fail with a reason.

No false alarms, on principle rather than per-case limits: each numeric element comes with
a bound on its own error, and a case fails only when its MAA exceeds max_maa plus the MAA
that this error could cause (`noise_maa`). The bound has two parts:

- roundoff: every loss evaluation is an f32 sum, off by about one ulp of its magnitude
  S = sum |loss terms| (the rounding of the result plus that of the terms that changed).
  The 4-point stencil combines four evaluations with weights 8, 8, 1, 1 over 6h, so its
  roundoff is at most 3 eps S / h; the 2-point one's is eps S / h. Measured on correct
  smooth ops (sqr, exp, sin, silu, sqrt; 10 seeds), the observed error stays below 1.3 eps S / h.
- truncation (Richardson): the 4-point value g4 = (4 g_half - g_h) / 3 removes the h^2 term
  whose size is gap = |g4 - g_h|. Its own error is the next (h^4) term; assuming the series
  shrinks geometrically that is about gap * (gap / |g4|), and never more than gap (a kink,
  where the series says nothing). For smooth ops this bound is ~10x above the real error
  (exp, sin: 0.075 gap^2/|g|), which is still far below the max_maa scale.

An earlier model (roundoff x sqrt(number of loss terms), truncation = gap / 3) gave limits of
1e-2..5e-2 on correct sqr/silu/div cases: a backward off by 5% in scale would have passed.
"""

import numpy as np

from pytest_gradgate.check import concentration
from pytest_gradgate.check.outcome import Diagnosis

F32_EPS = float(np.finfo(np.float32).eps)
NOISE_FACTOR = 2.0      # margin over the error bound (longer op chains round more often)
TINY = 1e-30


def numeric_noise(loss_scale, h, g_h, g4=None):
    """Per-element error bound of the numeric gradient g4 (or g_h when g4 is None).

    loss_scale: sum of |terms| of the loss at the inputs (see losses.Loss.scale)."""
    g_h = np.asarray(g_h, dtype=np.float64)
    if g4 is None:
        return np.full(g_h.shape, F32_EPS * max(abs(loss_scale), TINY) / h)
    g4 = np.asarray(g4, dtype=np.float64)
    roundoff = 3.0 * F32_EPS * max(abs(loss_scale), TINY) / h
    gap = np.abs(g4 - g_h)
    truncation = gap * np.minimum(1.0, gap / np.maximum(np.abs(g4), TINY))
    return roundoff + truncation


def ggml_index(flat, shape_ne):
    """Logical element index -> ggml index (i0, i1, i2, i3)."""
    idx, out = int(flat), []
    for n in shape_ne:
        out.append(idx % n)
        idx //= n
    return out


def _asymmetries(a, n, noise):
    """(kept, asymmetry, explained): the elements compared (not both zero within the noise),
    and for each of them |a - n| / |a + n| and the part of it that its own numeric error can
    explain. A gradient fails when the mean of what is left (maa - noise_maa) exceeds max_maa:
    per element, so a few noisy elements (a kink, a tiny gradient) cannot hide a wrong scale on
    all the others."""
    keep = ~((np.abs(a) <= noise) & (np.abs(n) <= noise))
    ak, nk, noisek = a[keep], n[keep], noise[keep]
    denom = np.maximum(np.abs(ak + nk), TINY)
    return keep, np.abs(ak - nk) / denom, np.minimum(np.abs(ak - nk), NOISE_FACTOR * noisek) / denom


def excess(analytic, numeric, noise):
    """Per element, its part in a failed comparison: the asymmetry its numeric error cannot
    explain (compare() fails a gradient when the mean of these over the compared elements
    exceeds max_maa); -inf where both sides are zero within the noise (not compared), +inf
    where either side is not finite."""
    a = np.asarray(analytic, dtype=np.float64).ravel()
    n = np.asarray(numeric, dtype=np.float64).ravel()
    noise = np.broadcast_to(np.asarray(noise, dtype=np.float64), a.shape)
    out = np.full(a.size, np.inf)
    finite = np.isfinite(a) & np.isfinite(n)
    keep, asym, explained = _asymmetries(a[finite], n[finite], noise[finite])
    part = np.full(int(finite.sum()), -np.inf)
    part[keep] = asym - explained
    out[finite] = part
    return out


def _flat(analytic, numeric, noise):
    a = np.asarray(analytic, dtype=np.float64).ravel()
    n = np.asarray(numeric, dtype=np.float64).ravel()
    return a, n, np.broadcast_to(np.asarray(noise, dtype=np.float64), a.shape)


def _maa(a, n, noise):
    """(kept, maa, noise_maa) of finite flat arrays: the verdict's inputs."""
    keep, asym, explained = _asymmetries(a, n, noise)
    if not asym.size:
        return keep, 0.0, 0.0
    return keep, float(asym.mean()), float(explained.mean())


def verdict(analytic, numeric, noise, max_maa):
    """(maa, passed): compare()'s verdict alone, for the callers that read nothing else (the
    power probe's scrambles, four per param and case): no norms, sort or worst elements."""
    a, n, noise = _flat(analytic, numeric, noise)
    if not (np.isfinite(a).all() and np.isfinite(n).all()):
        return float("inf"), False
    _, maa, noise_maa = _maa(a, n, noise)
    return maa, maa <= max_maa + noise_maa


def compare(analytic, numeric, noise, max_maa, shape_ne=None, n_worst=5):
    """Metrics for one gradient (flat arrays in logical order, i0 fastest)."""
    a, n, noise = _flat(analytic, numeric, noise)
    shape_ne = shape_ne or [a.size, 1, 1, 1]
    out = {"n_elements": int(a.size), "excluded": {}}
    bad_a, bad_n = ~np.isfinite(a), ~np.isfinite(n)
    if bad_a.any() or bad_n.any():
        out.update(maa=float("inf"), noise_maa=0.0, cosine=float("nan"), norm_ratio=float("nan"),
                   max_abs_err=float("inf"), n_compared=0, passed=False,
                   nonfinite_analytic=int(bad_a.sum()), nonfinite_numeric=int(bad_n.sum()),
                   first_nonfinite=ggml_index(int(np.argmax(bad_a | bad_n)), shape_ne), worst=[])
        return out
    keep, maa, noise_maa = _maa(a, n, noise)
    if (~keep).any():
        out["excluded"]["both zero within numeric noise"] = int((~keep).sum())
    na, nn = float(np.linalg.norm(a)), float(np.linalg.norm(n))
    cosine = float(a @ n / (na * nn)) if na > 0 and nn > 0 else (1.0 if na == nn else 0.0)
    err = np.abs(a - n)
    worst = np.argsort(-err, kind="stable")[:n_worst]
    out.update(
        maa=maa, noise_maa=noise_maa, limit=max_maa + noise_maa,
        cosine=cosine, norm_ratio=(na / nn) if nn > 0 else (float("inf") if na > 0 else 1.0),
        max_abs_err=float(err.max()) if err.size else 0.0, n_compared=int(keep.sum()),
        passed=bool(maa <= max_maa + noise_maa),
        worst=[{"index": ggml_index(i, shape_ne), "analytic": float(a[i]), "numeric": float(n[i])}
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
        if verdict(scrambled, numeric, noise, max_maa)[1]:
            return False
    return True


FOUND_FRACTION = 0.9     # share of analytic values that must occur in the numeric gradient
FOUND_RTOL = 1e-3        # how close a value must be to count as the same value
FOUND_OVER_CHANCE = 2.0  # ... and at least this many times the share a chance control finds


def fraction_found(analytic, numeric, noise, seed=0):
    """(share of analytic values that equal, within noise + FOUND_RTOL, some numeric value
    anywhere; the share a control finds by chance). In a large gradient almost every value has
    a near neighbour in the numeric one (on 10^5 Gaussian values, 99.9% of an unrelated
    gradient is "found"), so the share alone is no evidence. The control is the analytic values
    each moved by up to 100 tolerances: the same spread, but no value really the numeric's."""
    a = np.asarray(analytic, dtype=np.float64).ravel()
    pool = np.sort(np.asarray(numeric, dtype=np.float64).ravel())
    if not a.size or pool.size < 2:
        return 0.0, 0.0
    slack = 2 * float(np.median(noise))

    def found(values):
        pos = np.clip(np.searchsorted(pool, values), 1, pool.size - 1)
        nearest = np.minimum(np.abs(pool[pos] - values), np.abs(pool[pos - 1] - values))
        return float((nearest <= FOUND_RTOL * np.abs(values) + slack).mean())

    tolerance = FOUND_RTOL * np.abs(a) + slack
    control = a + np.random.default_rng(seed).uniform(-100, 100, a.size) * tolerance
    return found(a), found(control)


def diagnose(analytic, numeric, noise, metrics, max_maa, reads="the incoming gradient", shape_ne=None):
    """(Diagnosis kind, a sentence a person can act on) for a comparison that failed. `reads`:
    what a backward whose values land at wrong positions misreads (through a producer and a
    contiguous consumer, the gradient arrives contiguous: it is the laid-out input). shape_ne:
    the param's ne, when the values are its elements (full mode): then an error held by a few
    elements is said to be (check/concentration.py)."""
    if metrics.get("nonfinite_analytic") and metrics.get("nonfinite_numeric"):
        return Diagnosis.NONFINITE_LOSS, (f"the loss itself is not finite at these inputs ({metrics['nonfinite_analytic']} analytic and "
                f"{metrics['nonfinite_numeric']} numeric gradient values are NaN/Inf, first at "
                f"{metrics['first_nonfinite']}): the forward is out of its domain; narrow the case's init range")
    if metrics.get("nonfinite_analytic"):
        return Diagnosis.NONFINITE_BACKWARD, (f"analytic gradient has {metrics['nonfinite_analytic']} non-finite values "
                f"(first at {metrics['first_nonfinite']}) where the loss is finite: the backward produces NaN/Inf")
    if metrics.get("nonfinite_numeric"):
        return Diagnosis.NONFINITE_LOSS, (f"the loss is not finite near the inputs ({metrics['nonfinite_numeric']} numeric gradient values "
                "are NaN/Inf): narrow the case's init range")
    a = np.asarray(analytic, dtype=np.float64).ravel()
    n = np.asarray(numeric, dtype=np.float64).ravel()
    noise = np.broadcast_to(np.asarray(noise, dtype=np.float64), a.shape)
    if np.all(np.abs(a) <= noise) and not np.all(np.abs(n) <= noise):
        return Diagnosis.DROPPED, "analytic gradient is zero where the numeric one is not: the backward drops this gradient"
    one_sided = _zero_on_one_side(a, n, noise, max_maa, shape_ne)
    if one_sided is not None:
        return one_sided
    cos = metrics["cosine"]
    misplaced = _batch_misplaced(a, n, noise, max_maa, shape_ne)
    if misplaced is not None:
        return Diagnosis.BATCH_MISPLACED, (f"{misplaced} (cosine {cos:.3f}): the backward writes or reads a batch "
                                           "(dims 2 and 3) at another batch's place")
    sorted_metrics = compare(np.sort(a), np.sort(n), np.sort(noise), max_maa)
    if sorted_metrics["maa"] <= max(10 * max_maa, sorted_metrics["limit"]) and abs(cos) < 0.999:
        return Diagnosis.WRONG_POSITIONS, ("right values at wrong positions: the analytic gradient is a permutation of the numeric one "
                f"(cosine {cos:.3f}); the backward reads {reads} with the wrong strides or order")
    # the evidence is in the elements that disagree where they are: an analytic value that
    # matches its own numeric value says nothing about values read from other positions (a
    # saturated silu's 0s and 1s are "found" everywhere, at their own places)
    off = (np.abs(a - n) > NOISE_FACTOR * noise) & (np.abs(a - n) > max_maa * np.abs(a + n))
    found, chance = fraction_found(a[off], n, noise[off]) if off.any() else (0.0, 0.0)
    if found >= FOUND_FRACTION and found >= FOUND_OVER_CHANCE * chance and abs(cos) < 0.999:
        # a slice taken with the wrong strides reads real gradient values from wrong places: some twice,
        # some never, so it is not a permutation, but every value it returns exists in the true gradient
        return Diagnosis.WRONG_POSITIONS, (f"right values at wrong positions: {found:.0%} of the analytic values that disagree "
                f"occur in the numeric gradient at other positions, some repeated or missing (cosine {cos:.3f}); the backward reads "
                f"{reads} with the wrong strides or offsets")
    k = float(a @ n / max(n @ n, TINY))
    if abs(cos) > 0.999:
        if abs(k + 1) < 0.01:
            return Diagnosis.WRONG_SIGN, "wrong sign: analytic = -numeric"
        # a scale is the wrong only where undoing it makes the two agree: an error spread over
        # the elements (CUDA's f32 matmuls in TF32, seen on an H200) also has cosine 1 and k = 1
        if k != 0 and verdict(a / k, n, noise, max_maa)[1]:
            return Diagnosis.WRONG_SCALE, f"wrong scale: analytic = {k:.4g} x numeric (cosine {cos:.4f})"
    few = None if shape_ne is None else concentration.concentrated(
        a - n, lambda i: ggml_index(i, shape_ne), lambda keep: verdict(a[keep], n[keep], noise[keep], max_maa)[1])
    if few is not None:
        return Diagnosis.CONCENTRATED, f"{few} (cosine {cos:.6f})"
    if abs(cos) > 0.999:
        return Diagnosis.DISAGREE, (f"values disagree by an error spread over the elements, with no wrong scale, sign "
                                    f"or positions behind it (cosine {cos:.6f}, analytic = {k:.6g} x numeric)")
    return Diagnosis.DISAGREE, f"values disagree (cosine {cos:.3f}, norm ratio {metrics['norm_ratio']:.3g})"


ONE_SIDED_SHARE = 0.75    # of the elements that disagree, zero on one side for a one-sided claim


def _batch_misplaced(a, n, noise, max_maa, shape_ne):
    """The text of a batch at another batch's place, or None: where the param has several (i2, i3)
    slices and every slice that disagrees with its own numeric gradient agrees, whole, with the
    numeric gradient of another slice (one that is not the same values: a slice that equals its
    neighbour says nothing)."""
    if shape_ne is None:
        return None
    ne = (list(shape_ne) + [1, 1, 1, 1])[:4]
    rows = ne[0] * ne[1]
    if ne[2] * ne[3] < 2 or rows < 2:
        return None
    sa, sn, sz = (x.reshape(ne[3] * ne[2], rows) for x in (a, n, noise))
    wrong = [s for s in range(len(sa)) if not verdict(sa[s], sn[s], sz[s], max_maa)[1]]
    if not wrong:
        return None
    moved = []
    for s in wrong:
        others = [t for t in range(len(sn)) if t != s and verdict(sa[s], sn[t], sz[t], max_maa)[1]
                  and not verdict(sn[s], sn[t], sz[t], max_maa)[1]]
        if not others:
            return None
        moved.append((s, others[0]))

    def name(s):
        return f"[:, :, {s % ne[2]}, {s // ne[2]}]"
    shown = "; ".join(f"slice {name(s)} holds the numeric gradient of slice {name(t)}" for s, t in moved[:3])
    more = f" (and {len(moved) - 3} more)" if len(moved) > 3 else ""
    return f"a batch at another batch's place: {shown}{more}; the other {len(sa) - len(moved)} slice(s) agree"


def _zero_on_one_side(a, n, noise, max_maa, shape_ne):
    """(kind, text) where most elements that disagree (ONE_SIDED_SHARE) are zero on one side and
    not on the other, and none is zero on the other side only: a claim about where the gradient
    goes, with its counts, before any claim about positions or strides (a backward that sends
    gradient to the elements max-pool masks reads nothing at a wrong place). The rest, elements
    whose step crosses the mask's edge say, are counted and not explained."""
    off = (np.abs(a - n) > NOISE_FACTOR * noise) & (np.abs(a - n) > max_maa * np.abs(a + n))
    if not off.any():
        return None
    zero_a, zero_n = np.abs(a) <= noise, np.abs(n) <= noise
    unmasked, lost = off & zero_n & ~zero_a, off & zero_a & ~zero_n
    total = int(off.sum())

    def at(i):
        return f"{ggml_index(int(i), shape_ne)}" if shape_ne is not None else f"element {int(i)}"

    def count(mask):
        k = int(mask.sum())
        return (f"at all {k} of the {a.size} elements that disagree" if k == total else
                f"at {k} of the {total} elements that disagree (of {a.size})")
    sides = ((Diagnosis.UNMASKED, unmasked, lost, a, "gradient where the numeric one is zero",
              "the numeric gradient is 0 and the analytic is not", "sends gradient to elements it should mask"),
             (Diagnosis.LOST, lost, unmasked, n, "gradient lost", "the analytic gradient is 0 and the numeric is not",
              "drops the gradient of these elements"))
    for kind, mask, other, nonzero, name, what, does in sides:
        if mask.sum() >= ONE_SIDED_SHARE * total and not other.any():
            idx = np.flatnonzero(mask)
            i = idx[np.argmax(np.abs(nonzero[idx]))]
            return kind, (f"{name}: {count(mask)}, {what} (e.g. at {at(i)}: analytic {a[i]:+.3g}, numeric "
                          f"{n[i]:+.3g}); the backward {does}")
    return None


def warm_up_diagnosis():
    """Diagnose a made-up failure once, in the worker before it forks (isolation/worker.py).

    Only a red verdict reaches diagnose, and a red verdict comes from a fresh child, which
    inherits from the worker only what the worker ran: its warm-up cases pass, so each such
    child paid diagnose's first-use costs again, numpy's lazy import of numpy.ma above all
    (np.median needs it: 16 ms a child on a 2-core machine). The made-up failure is a wrong
    scale whose elements all disagree, so that diagnose goes as far as fraction_found."""
    numeric = np.linspace(-1.0, 1.0, 64)
    analytic, noise = 3.0 * numeric, np.full(64, 1e-6)
    return diagnose(analytic, numeric, noise, compare(analytic, numeric, noise, 1e-4), 1e-4)
