"""A survivor, searched: explore, restricted to the ops whose backward runs the mutated code,
tries to find a case that the mutant fails and the unmutated tree passes.

Explore's findings on the mutant's build are checked one by one on the unmutated build (the
same case, isolated as the gate runs it): a finding whose case passes there is a killing case,
printed shrunk as a case file holds it; one that fails there too is the tree's own failure, not
the mutant's. A survivor no finding kills is "possibly equivalent": the mutation may change
nothing a gradient shows (a rounding of a thread split, an f16 path no f32 case runs), or the
search did not reach it; the report says how many cases of which ops were drawn, for how long.
"""


def search(library, unmutated_library, mutant, budget_s, seed=0):
    """-> {"verdict": "killed-by-explore" | "possibly-equivalent" | "not-explored", "detail",
    "case" (the killing case file text, when one was found), "cases_drawn"}."""
    try:
        from pytest_gradgate.explore import findings, search as explore_search, space
    except ImportError:
        return {"verdict": "not-explored", "detail": "explore needs Hypothesis (pip install 'pytest-gradgate[explore]')"}
    from pytest_gradgate.isolation.parent import Runner
    from pytest_gradgate.ops.table import OPS
    ops = None if "*" in mutant["ops"] else [op for op in mutant["ops"] if op in OPS]
    if ops == []:
        return {"verdict": "not-explored", "detail": f"explore has none of {', '.join(mutant['ops'])} in its table"}
    found, stats = explore_search.explore(library, budget_s, seed=seed, ops=ops)
    tried = (f"explore drew {stats['counts'].get('cases', 0)} cases of {', '.join(ops) if ops else 'every op'} "
             f"for {budget_s:g} s (seed {seed})")
    runner = Runner(unmutated_library, isolate="case")
    try:
        for f in found:
            if f.result.get("status") not in ("failed", "crashed", "timeout", "alias"):
                continue
            try:
                (case,) = space.to_cases(f.mapping)
            except Exception:
                continue
            if runner.run(case).status == "passed":
                text = findings.case_file_text([f], header=f"kills {mutant['path']}:{mutant['line']} "
                                                          f"({mutant['description']})")
                return {"verdict": "killed-by-explore", "detail": f"{tried}: {findings.key_text(f.key)}",
                        "case": text, "cases_drawn": stats["counts"].get("cases", 0)}
    finally:
        runner.close()
    return {"verdict": "possibly-equivalent", "detail": f"{tried}: none fails on the mutant and passes unmutated",
            "cases_drawn": stats["counts"].get("cases", 0)}
