"""Is the error of a failed comparison in a few elements? Then say so, and name them.

A kernel that computes one element from the wrong input, or a reduction that drops one
column, leaves every other element right. "An error spread over the elements" would send
a reader to look for a precision or scale problem; "1 of 24 elements wrong: the last element
[3, 1, 0, 0]" sends them to the kernel's bounds. The claim is made only when it is verified:
the few elements hold most of the squared error, and with them left out the rest passes the
comparison's own limit (the caller's `passes_without`).
"""

import numpy as np

SHARE = 0.9         # the few elements hold at least this share of the squared error
MAX_NAMED = 5       # indices written out; more are counted


def few_at_most(n):
    """How many elements of n are still "a few": an eighth, at least 1, at most 16."""
    return max(1, min(16, n // 8))


def concentrated(diff, index, passes_without):
    """A sentence naming the few elements that hold the error, or None.

    diff: the element-wise difference of the two gradients (logical order); index(i): the ggml
    index of flat element i (metrics.ggml_index, given by the caller: metrics imports this
    module); passes_without(keep): does the comparison pass on the elements where the boolean
    mask `keep` is true?"""
    err = np.asarray(diff, dtype=np.float64).ravel() ** 2
    n = err.size
    total = float(err.sum())
    if n < 2 or not np.isfinite(total) or total <= 0:
        return None
    order = np.argsort(-err, kind="stable")
    k = int(np.searchsorted(np.cumsum(err[order]), SHARE * total)) + 1
    if k > few_at_most(n):
        return None
    keep = np.ones(n, dtype=bool)
    keep[order[:k]] = False
    if not passes_without(keep):
        return None
    share = float(err[order[:k]].sum()) / total
    worst = sorted(int(i) for i in order[:k])
    return f"{k} of {n} elements wrong: {_name(worst, n, index)} ({share:.0%} of the error); the others agree"


def _name(flat, n, index):
    def at(i):
        return str(index(i))
    if len(flat) == 1:
        i = flat[0]
        where = "the last element " if i == n - 1 else "the first element " if i == 0 else ""
        return where + at(i)
    shown = ", ".join(at(i) for i in flat[:MAX_NAMED])
    return shown + (f" and {len(flat) - MAX_NAMED} more" if len(flat) > MAX_NAMED else "")
