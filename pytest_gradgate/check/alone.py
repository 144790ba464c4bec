"""The texts that say a case's harness, not its op, failed: its consumer or producer fails
on its own in the ggml under test, or the op's forward refuses the producer's layout.

The engine writes them when the self-check (check/selfcheck.py) finds a wrong gradient;
the parent (isolation/parent.py) writes them when a child dies in one of those
phases. The parent imports this at start, so they live apart from the self-check and its
numpy, which the pytest process never loads."""


def failure_text(consumer, why):
    """The diagnosis of a case whose consumer fails on its own."""
    return (f"consumer '{consumer}' fails on its own in this ggml, with no op before it ({why}): "
            "the op is not tested through this consumer; its result says nothing about the op")


def producer_failure_text(producer, why):
    """The diagnosis of a case whose producer fails on its own."""
    return (f"producer '{producer}' fails on its own in this ggml, with no op after it ({why}): "
            "the op is not tested through this producer; its result says nothing about the op")


def forward_rejects_text(producer, why):
    """The skip reason of a case whose op's forward does not take the producer's layout."""
    return (f"producer '{producer}': the op's forward does not take its input laid out so in this ggml ({why}); "
            "nothing about the backward was checked")
