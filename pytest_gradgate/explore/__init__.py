"""Explore: search for backward bugs beyond the fixed suite, and shrink each to a case.

space.py draws case mappings (exactly what a YAML case file holds) from the op table, the
consumers, the losses, the parameter axes and the thread counts, with Hypothesis; search.py
runs each drawn case in the isolated worker and lets Hypothesis shrink what fails; findings.py
keys, deduplicates and marks the failures (known ones from the baseline) and writes them out
as a case file plus JSON. The `gradgate explore` command (cli/explore.py) and
`pytest --gradgate-explore=60s` (gate/explore.py) are its two front ends.

Hypothesis is imported only here, so a gate run without explore never loads it.
"""
