"""How much work a case is, guessed from the case alone (no timing): what the gate's order
(gate/order.py) and the isolation's choice of child (isolation/parent.py) go by."""

# Work, in "element-evaluations", from which a case counts as long. In the built-in suite
# the five cases above it took 0.2-1.9 s each and the rest at most 0.1 s (under -n 2 on 2
# cores): all its full-mode and equivalence cases are below it, and its smaller fast-mode ones
LONG_WORK = 4_000_000


def estimated_work(case):
    """A rough guess of a case's work: the forward evaluations its check takes, times its
    param elements (each evaluation runs the whole graph, which reads every one of them)."""
    n = case.n_param_elements()
    if case.equivalent or case.gradients_out:     # each formulation once: no finite differences
        return n * max(len(case.equivalent), 1)
    if case.mode == "fast":
        return n * case.directions * case.stencil
    return n * n * case.stencil             # full mode: `stencil` evaluations per element
