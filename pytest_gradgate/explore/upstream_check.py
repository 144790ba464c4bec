"""On a fork, a finding known from upstream's failures is run on upstream itself before it counts as known.

A baseline matches a finding by its key (op, class, site; findings.py). On the tree the baseline
was recorded on, one key is one failure. On a fork it is not: a new bug of an op that upstream
already fails on has the same key as upstream's failure, and a key match would call the fork's
bug upstream's. Issue 52 saw it: a max-pool backward that loses the gradient of windows whose
values are all negative, found by explore and marked known because upstream's max-pool finding
(finite differences across the max's kink: values disagree) has the key `pool_2d misread
contiguous` too.

So on a fork whose upstream is a pinned source, each finding's case is run again on the pinned
upstream tree and on the tree under test (but for a finding known from the fork's own entry that
the user accepted). A finding known by its key stays known only if upstream fails that very case
the same way: the same status, the same params failing, and the same analytic gradients element
by element (a wrong gradient), or the same ggml message without its line numbers (a death).
Otherwise it is the fork's own, and what differs is said ("upstream ggml-0.15.3 gives other
gradients on this case (1 of 64 elements of a): a[2, 1, 0, 0] = -0.6555 there (numeric -0.6555),
0 here"). And a finding that no entry knows but that upstream fails the same way is upstream's,
known by that run: the shipped baselines hold what the suite and a few searches met, not every
upstream bug, and a fork's nightly search must not be red on upstream's.
"""

import numpy as np

from pytest_gradgate.check.outcome import Status

# analytic gradients of one case on two builds of one backward: the same arithmetic, up to the
# order of a multi-threaded sum; a different backward differs by far more
RTOL, ATOL_SHARE = 1e-4, 1e-6


def applies(entry):
    """Whether a known finding's entry is to be checked on upstream: every entry but a fork's own
    that the user accepted (that one is known by the user's word, not upstream's)."""
    return entry is not None and not entry.get("accepted")


def confirm(found, library, upstream_library, upstream_name, timeout=10.0, progress=None):
    """Run each finding's case on both builds and compare (differs()):
    - a finding that upstream does not fail the same way gets `not_upstream`, the difference in
      words, and loses its `known` if an entry that applies() gave it one;
    - a finding no entry knows that upstream fails the same way is upstream's: known, by the run
      (the shipped baselines record what the suite and ten searches met, not every upstream bug).
    -> how many were run."""
    from pytest_gradgate.explore import space
    from pytest_gradgate.isolation.parent import Runner
    checked = [f for f in found if f.known is None or applies(f.known)]
    if not checked:
        return 0
    if progress:
        progress(f"running the case of each of {len(checked)} finding(s) on upstream {upstream_name} too")
    ours = Runner(library, isolate="case", timeout=timeout)
    theirs = Runner(upstream_library, isolate="case", timeout=timeout)
    try:
        for f in checked:
            (case,) = space.to_cases(f.mapping)
            here = ours.run(case)
            if here.status == Status.PASSED:
                # the finding did not fail this time (a flaky one, reproduce.py): there is nothing
                # here to compare upstream's run with, so nothing is verified and nothing changes
                continue
            difference = differs(here, theirs.run(case), upstream_name)
            if difference:
                f.not_upstream, f.known = difference, None
            elif f.known is None:
                f.known = {"node": f"upstream {upstream_name} (its case fails there the same way)",
                           "status": f.result["status"], "reason": f.result.get("message"), "upstream": upstream_name}
    finally:
        ours.close()
        theirs.close()
    return len(checked)


def differs(here, upstream, upstream_name):
    """None when upstream's Result of a case is this tree's failure; else the difference, in words."""
    from pytest_gradgate.gate.baseline import without_drift
    up = f"upstream {upstream_name}"
    if upstream.status != here.status:
        if upstream.status == Status.PASSED:
            return f"{up} passes this case; here it is {here.status}"
        return f"{up} is {upstream.status} on this case ({_said(upstream)}); here it is {here.status}"
    if here.status == Status.FAILED:
        mine = {p["name"]: p for p in here.params if not p.get("passed", True)}
        its = {p["name"]: p for p in upstream.params if not p.get("passed", True)}
        if set(mine) != set(its):
            return (f"{up} fails param(s) {', '.join(sorted(its)) or 'none'} of this case; here "
                    f"{', '.join(sorted(mine)) or 'none'}")
        for name in sorted(mine):
            text = _values_differ(mine[name], its[name], up)
            if text:
                return text
        if here.kind != upstream.kind:
            return f"{up} fails this case as {upstream.kind}; here as {here.kind}"
        return None
    if without_drift(_said(here)) != without_drift(_said(upstream)):
        return f"{up} is {upstream.status} too, but says: {_said(upstream)}"
    return None


def _said(result):
    return " ".join((result.message or result.diagnosis or "").split())[:200]


def _values_differ(mine, its, up):
    a, b = mine.get("analytic_values"), its.get("analytic_values")
    if a is None or b is None:        # no per-element values (fast mode): compare what was measured
        same = np.isclose(mine.get("maa", 0.0), its.get("maa", 0.0), rtol=1e-3)
        return None if same else (f"{up} measures MAA {its.get('maa'):.3g} for param {mine['name']} of this case; "
                                  f"here {mine.get('maa'):.3g}")
    a, b = np.asarray(a), np.asarray(b)
    numeric = np.asarray(its.get("numeric_values") or b)
    close = np.isclose(a, b, rtol=RTOL, atol=ATOL_SHARE * max(float(np.abs(b).max(initial=0.0)), 1e-30))
    if close.all():
        return None
    flat = int(np.argmax(np.abs(a - b) * ~close))
    index, rest = [], flat
    for size in (list(mine.get("shape") or [a.size]) + [1, 1, 1, 1])[:4]:
        index.append(rest % size)
        rest //= size
    return (f"{up} gives other gradients on this case ({int((~close).sum())} of {a.size} elements of "
            f"{mine['name']}): {mine['name']}{index} = {b[flat]:.4g} there (numeric {numeric[flat]:.4g}), "
            f"{a[flat]:.4g} here")


def upstream_pin(source):
    """The pinned source a fork says it is (its version's), or None: no fork of a pinned version,
    or the tree is a pinned source itself (then a key match is the recorded failure)."""
    from pytest_gradgate.gate.baseline import upstream_of
    return upstream_of(source.version) if source.pinned is None else None


def confirm_on_upstream(found, library, source, build_options, progress=None, recheck=True):
    """confirm() against the pinned upstream of a fork (fetched and built, both cached, on first
    use); nothing to do on a tree that is no fork of a pinned version. -> how many were checked."""
    pin = upstream_pin(source)
    if pin is None or not any(f.known is None or applies(f.known) for f in found):
        return 0
    from pytest_gradgate.library.cmake import ensure_build
    from pytest_gradgate.library.source import pinned_ggml_root
    build = ensure_build(pinned_ggml_root(pin, progress=progress), build_options, progress=progress)
    checked = confirm(found, library, build.library, pin.name, progress=progress)
    # new now: its case is run again as every new finding's is, before it is printed as one to paste
    if recheck:
        from pytest_gradgate.explore import reproduce
        reproduce.recheck(library, [f for f in found if f.not_upstream and f.reproduced is None])
    return checked


def to_record(found):
    """(the findings a recording writes, the keys of those that are upstream's): the new ones, and
    those known only because their cases failed the same way on upstream (confirm()), which a
    fork's baseline records as upstream's."""
    by_run = [f for f in found if f.known is not None and f.known.get("upstream")]
    return [f for f in found if f.known is None] + by_run, {f.key for f in by_run}
