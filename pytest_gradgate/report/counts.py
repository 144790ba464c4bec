"""The counts a report shows: pytest's own outcomes of the gradgate items, with the cases'
statuses as a breakdown. The plugin records the outcome of each report of a gradgate item as
pytest's terminal summary counts it (plugin.py ResultCollector); the HTML report and the GitHub
step summary both count those, so neither can disagree with pytest's own line. Stdlib only:
the step summary is written without numpy."""


def returned_to_test(result):
    """A result the fixture's run() returned for its test to assert on, which did not pass:
    what the test got back, not a failure of the test."""
    return bool(result.get("returned_to_test")) and result.get("status") != "passed"


# the order of pytest's summary line (_pytest/terminal.py KNOWN_TYPES); others follow
PYTEST_ORDER = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "error")


def tests_of(results):
    """Without pytest's reports (a report made from Results alone): one test per Result."""
    return [{"nodeid": r.get("nodeid") or r.get("case_id"), "outcome": r.get("outcome") or r.get("status", "error"),
             "message": ""} for r in results]


def item_outcomes(tests):
    """nodeid -> the outcome its row shows: the first that is not a pass (a setup error, a failed
    call, a teardown error), else passed."""
    out = {}
    for t in tests:
        if out.get(t["nodeid"], "passed") == "passed":
            out[t["nodeid"]] = t["outcome"]
    return out


def count_text(tests, results):
    """pytest's counts, each with what its cases' statuses add: "5 failed (1 crashed), 4 passed
    (1 with a failed gradgate.run() result), 1 error"; "no tests ran" for none."""
    result_of = {r.get("nodeid") or r.get("case_id"): r for r in results}
    nodeids = {}
    for t in tests:
        nodeids.setdefault(t["outcome"], []).append(t["nodeid"])
    order = sorted(nodeids, key=lambda o: (PYTEST_ORDER.index(o) if o in PYTEST_ORDER else len(PYTEST_ORDER)))
    parts = []
    for outcome in order:
        finer = {}
        for nodeid in nodeids[outcome]:
            r = result_of.get(nodeid)
            status = r.get("status", "error") if r is not None else None
            if r is None or (status in (outcome, "passed") and not returned_to_test(r)):
                continue
            label = f"with a {status} gradgate.run() result" if returned_to_test(r) else status
            finer[label] = finer.get(label, 0) + 1
        n = len(nodeids[outcome])
        word = "errors" if outcome == "error" and n != 1 else outcome
        parts.append(f"{n} {word}" + (" (" + ", ".join(f"{k} {s}" for s, k in finer.items()) + ")" if finer else ""))
    return ", ".join(parts) or "no tests ran"
