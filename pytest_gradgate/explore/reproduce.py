"""A finding's shrunk case is run again, several times, before it is printed as a case to paste.

A case that failed once in the search (and once more to confirm a wrong gradient, search.py)
may still not fail every time: a kernel whose result depends on thread timing, or on state the
case does not set. Issue 47 saw a pasted finding pass in 1 of 8 identical runs, and a case that
passes when pasted is worse than no case: the user concludes the bug is gone. So each finding's
case runs RUNS more times, each in a fresh child of the worker (a reused child could carry state
from the case before it), and its verdict must be the finding's own (the same key,
findings.classify) every time; otherwise the finding is flaky, and is printed as such, with how
many runs failed, not as a case to paste.
"""

from pytest_gradgate.check.outcome import Status
from pytest_gradgate.explore import findings, space

RUNS = 5            # identical runs of each finding's case
HUNG_RUNS = 2       # ... of a hang's: each run waits out the case's timeout
CASE_TIMEOUT_S = 10.0


def recheck(library, found, runs=RUNS, case_timeout=CASE_TIMEOUT_S):
    """Set each finding's `reproduced` to {runs, failed, verdicts} (see verdicts()); -> seconds taken."""
    import time
    from pytest_gradgate.isolation.parent import Runner
    if not found:
        return 0.0
    began = time.monotonic()
    runner = Runner(library, isolate="case", timeout=case_timeout)
    try:
        for f in found:
            f.reproduced = verdicts(runner, f, HUNG_RUNS if f.result.get("status") == str(Status.TIMEOUT) else runs)
    finally:
        runner.close()
    return time.monotonic() - began


def verdicts(runner, finding, runs):
    """Run the finding's case `runs` times, each in a fresh child: {runs, failed: how many of them
    failed as the finding did, verdicts: what each run gave (a key's text, or passed, discard, ...)}."""
    (case,) = space.to_cases(finding.mapping)
    ops = findings.ops_of(finding.mapping)
    failed, seen = 0, []
    for _ in range(runs):
        outcome, detail = findings.classify(runner.run(case, fresh=True), ops)
        if outcome == findings.FINDING and tuple(detail) == tuple(finding.key):
            failed += 1
        seen.append(findings.key_text(detail) if outcome == findings.FINDING else outcome)
    return {"runs": runs, "failed": failed, "verdicts": seen}
