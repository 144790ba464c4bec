"""Parity: one case's analytic gradients from two sides, compared; the verdict of a parity item.

The sides are the tree under test and a reference tree (--gradgate-reference-src), or one
build's CUDA backend and its CPU backend. Each side ran in its own worker (check/analytic.py)
and left its GradientSets; here they are compared formulation by formulation with the
equivalence comparator (check/gradsets.py), under a limit from both sides' precision
(check/precision.py). The second side is the reference: what differs is said to have
changed on the first side, and only what the comparison verified is claimed.
"""

from pytest_gradgate.check import gradsets
from pytest_gradgate.check.outcome import Diagnosis, Phase, Status
from pytest_gradgate.check.result import Result


def side_label(side, formulation, n_formulations):
    return side if n_formulations == 1 else f"{side} {formulation}"


def judge(case, sides, outcomes):
    """sides: (tested label, reference label); outcomes: per side (its Result, its GradientSets
    or None). -> the parity item's Result."""
    tested, reference = sides
    (t_result, t_sets), (r_result, r_sets) = outcomes
    result = Result.for_case(case)
    result.mode = "parity"
    result.duration = t_result.duration + r_result.duration
    t_ok, r_ok = t_result.status == Status.PASSED, r_result.status == Status.PASSED
    if not r_ok and not t_ok:
        # the same on both sides or not, no gradients were compared: no parity claim either way
        result.kind = t_result.kind
        text = (f"neither side computes this case's gradients, so nothing is compared (the {tested} side: "
                f"{t_result.status} in phase {t_result.phase}: {_what(t_result)}; the {reference} side: "
                f"{r_result.status} in phase {r_result.phase}: {_what(r_result)})")
        return result.finish(Status.SKIPPED, t_result.phase, message=text)
    if not r_ok:
        # nothing to compare against; that the tested side computes something is no parity claim
        result.diagnosis = (f"the {reference} side could not compute this case's gradients ({r_result.status} in "
                            f"phase {r_result.phase}: {_what(r_result)}), so there is nothing to compare with")
        result.kind = Diagnosis.INCONCLUSIVE
        return result.finish(Status.INCONCLUSIVE, r_result.phase, message=result.diagnosis)
    if not t_ok:
        if t_result.status == Status.SKIPPED:     # the tested backend lacks an op: not a verdict
            return result.finish(Status.SKIPPED, t_result.phase, message=f"the {tested} side: {t_result.message}")
        # verified: the reference computes the gradients, the tested side does not
        result.kind, result.signal, result.stderr_tail = t_result.kind, t_result.signal, t_result.stderr_tail
        result.diagnosis = (f"the {tested} side fails where the {reference} side computes the gradients: "
                            f"{t_result.status} in phase {t_result.phase}: {_what(t_result)}")
        return result.finish(t_result.status, t_result.phase, message=f"{case.id}: {t_result.message}")
    by_label = {s.label: s for s in r_sets}
    n = len(t_sets)
    comparisons = []
    for t in t_sets:
        r = by_label[t.label]
        a = _relabelled(t, side_label(tested, t.label, n))
        b = _relabelled(r, side_label(reference, r.label, n))
        comparisons.append(gradsets.compare_sets(a, b))
    result.formulations = [s.label for s in t_sets] if n > 1 else []
    _verdict(result, case, comparisons, tested, reference)
    return result.finish(result.status, Phase.DONE)


def _what(r):
    return r.diagnosis or r.message or "no message"


def _relabelled(s, label):
    return gradsets.GradientSet(label, s.output, s.output_shape, s.grads, s.shapes, s.forward_steps, s.steps,
                                matmuls=s.matmuls, forward_matmuls=s.forward_matmuls,
                                precision=s.precision)


def _verdict(result, case, comparisons, tested, reference):
    result.power = None         # a finite-difference notion; parity takes none
    result.forward = [dict(c["forward"], pair=c["pair"]) for c in comparisons]
    differing = [c for c in comparisons if c["forward_differs"]]
    if differing:
        f = differing[0]["forward"]
        what = (f"output shapes {f['shape_mismatch'][0]} and {f['shape_mismatch'][1]}" if "shape_mismatch" in f
                else f"NMSE {f['nmse']:.3g} > limit {f['limit']:.3g}, cosine {f.get('cosine', float('nan')):.4f}")
        result.kind = Diagnosis.FORWARD_DIFFERS
        result.diagnosis = (f"the forward changed: the {tested} side computes another output than the {reference} "
                            f"side ({differing[0]['pair']}: {what}); the gradients of another function are not "
                            "compared, so no claim about the backward is made")
        result.message = f"{case.id}: the forward differs between {tested} and {reference}"
        result.nmse, result.limit = f["nmse"], f["limit"]
        result.status = Status.FAILED
        return
    params = [m for c in comparisons for m in c["params"]]
    for m in params:
        m["changed"] = None if m["passed"] else tested
    failed = gradsets.settle(result, params)
    if not failed:
        return
    changed = "; ".join(f"{m['name']}: {m['diagnosis']}" for m in failed)
    same = sorted({m["name"] for m in result.params} - {m["name"] for m in failed})
    result.diagnosis = (f"the {tested} side changed the gradient of {', '.join(dict.fromkeys(m['name'] for m in failed))} "
                        f"(against the {reference} side): {changed}"
                        + (f"; {', '.join(same)} agree{'s' if len(same) == 1 else ''}" if same else ""))
    first = failed[0]
    result.message = (f"{case.id}: {first['pair']}: NMSE {first['nmse']:.3g} > limit {first['limit']:.3g} "
                      f"for param {first['name']}")
