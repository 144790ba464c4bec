"""The order the gate's items run in: the long cases first, every other one as collected.

Cases run side by side: several at once in one pytest process (--gradgate-jobs), or spread
over pytest-xdist's workers. A long case that comes last runs alone while the other cores
idle. The built-in suite's longest cases (fast-mode ones, at 0.2-2 s each against at most
0.1 s for the rest) sit at its end, in cases_fast.yaml. Under `-n 2`, xdist's load
scheduling hands out the last items in small contiguous chunks, so two of them could land
on one worker: the other core then idled for seconds, in some runs and not in others. Run
first, they are over while xdist still has short cases to hand to whichever worker is free.
xdist's own first chunk would then hold them all, so under xdist the gate deals its items to
the workers in turn (gate/xdist_schedule.py).

The order must be the same in every xdist worker (xdist refuses workers that collected
different orders), so it is computed from the cases alone, not from timings of earlier runs.
It is stable: only the long cases move (longest first, equal ones in file order), and the
other items keep their order.
"""

from pytest_gradgate.declare.work import LONG_WORK, estimated_work

__all__ = ["LONG_WORK", "estimated_work", "long_first"]


def long_first(entries, case_of=lambda entry: entry):
    """`entries` reordered: those whose case counts as long first, the longest first; the
    rest as they were. case_of(entry): its Case, or None for an entry that is not a case's
    (it keeps its place)."""
    entries = list(entries)
    slots = [i for i, e in enumerate(entries) if case_of(e) is not None]
    work = [estimated_work(case_of(entries[i])) for i in slots]
    long = sorted((k for k, w in enumerate(work) if w >= LONG_WORK), key=lambda k: -work[k])   # stable
    if not long:
        return entries
    rest = [k for k, w in enumerate(work) if w < LONG_WORK]
    moved = [entries[slots[k]] for k in long + rest]
    for i, e in zip(slots, moved):
        entries[i] = e
    return entries
