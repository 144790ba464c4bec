"""`pytest --gradgate-explore=60s`: the search as a pytest run, for a CI job with the usual reports.

The search runs when the items are collected (its findings are the items): one item per
finding, named like the shrunk case it carries (`explore_scale_wrong-sign[none-sqr-cpu]`,
so -k, JUnit, --lf and the reports name it as the case file would), failing with the
finding's text and YAML, or xfail when the baseline records the same failure (with
--gradgate-update-baseline, the new findings are recorded in the baseline's `explore` section,
written at the end of the run, and xfail too); plus one item,
`explore::explore[search]`, that passes with the throughput, or fails when the search could not run.
`--collect-only` runs nothing and lists `explore[search]` alone. The built-in suite and case
files are not collected; the ops that case files (--gradgate-cases) and the pytest_gradgate_ops
hook declare are drawn with the table's. Under pytest-xdist each worker would run its own search: refused,
--gradgate-explore-jobs N runs N jobs instead.
"""

import pytest

from pytest_gradgate.errors import GradgateError
from pytest_gradgate.gate.state import state_of

SEARCH_ITEM = "explore[search]"
NODE_PREFIX = "explore::"      # node ids: explore::explore[search], explore::<case id>


def configure(config, state):
    """Checks at configure time; the search itself runs in collect()."""
    if (config.getoption("numprocesses", None) or 0) and not hasattr(config, "workerinput"):
        raise pytest.UsageError("--gradgate-explore runs its own parallel jobs: use --gradgate-explore-jobs N "
                                "instead of -n")
    from pytest_gradgate.cli.explore import parse_duration
    from pytest_gradgate.errors import UsageError
    from pytest_gradgate.explore import require_hypothesis
    try:
        require_hypothesis("--gradgate-explore")
    except UsageError as exc:
        raise pytest.UsageError(f"gradgate: {exc}") from None
    from pytest_gradgate.explore import declared as declared_ops, space
    from pytest_gradgate.gate.declared_ops import WHERE, hook_ops
    try:
        state.explore_budget = parse_duration(state.settings["explore"], "--gradgate-explore")
        # a fork's own ops: from the pytest_gradgate_ops hook and the case files' `ops:`
        declared = declared_ops.merge(dict(hook_ops(config)), declared_ops.from_files(
            _case_files(config, state), "--gradgate-cases"), WHERE)
        state.explore_ops = space.explorable_ops(_ops(state.settings["explore_ops"]), declared)
        state.explore_declared = {name: spec for name, spec in declared.items() if name in state.explore_ops}
    except (UsageError, ValueError) as exc:
        raise pytest.UsageError(f"gradgate: {exc}") from None
    if state.settings["explore_jobs"] < 1:
        raise pytest.UsageError("--gradgate-explore-jobs: give 1 or more")
    state.explore_stats = None
    state.explore_findings = []


def _case_files(config, state):
    """The case files given with --gradgate-cases (GRADGATE_CASES, ini gradgate_cases), as paths."""
    from pathlib import Path
    base = Path(config.invocation_params.dir)
    return [base / p for p in state.settings["cases"] or ()]


def _ops(text):
    return [op for op in (text or "").replace(",", " ").split() if op]


def collect(session, items):
    """Run the search and append its items (pytest_collection_modifyitems)."""
    state = state_of(session.config)
    search = ExploreSearchItem.from_parent(session, name=SEARCH_ITEM, nodeid=NODE_PREFIX + SEARCH_ITEM)
    if session.config.option.collectonly:
        items.append(search)
        return
    try:
        found, stats = _search(session.config, state)
    except GradgateError as exc:
        search.error = str(exc)
        items.append(search)
        return
    state.explore_stats, state.explore_findings = stats, found
    items.append(search)
    for f in found:
        from pytest_gradgate.explore.findings import node_name
        name = node_name(f.mapping)
        items.append(ExploreFindingItem.from_parent(session, name=name, nodeid=NODE_PREFIX + name, finding=f))


def _search(config, state):
    from pytest_gradgate.explore import findings as findings_mod, search
    settings = state.settings
    build = state.ensure_build()
    tr = config.pluginmanager.get_plugin("terminalreporter")

    def progress(text):
        if tr is not None:
            tr.write_line(f"gradgate explore: {text}")
    progress(f"searching for {state.explore_budget:g} s (seed {settings['explore_seed']}, "
             f"{settings['explore_jobs']} job(s), {len(state.explore_ops)} ops) on ggml from {state.source.label}")
    if state.explore_declared:
        from pytest_gradgate.cli.explore import check_declared_in_headers
        check_declared_in_headers(state.explore_declared, state.source, "--gradgate-cases / pytest_gradgate_ops")
    found, stats = search.explore(build.library, state.explore_budget, seed=settings["explore_seed"],
                                  ops=list(state.explore_ops), jobs=settings["explore_jobs"],
                                  database=settings["explore_database"] or None, progress=progress,
                                  baseline=state.baseline, declared=state.explore_declared)
    findings_mod.mark_known(found, state.baseline)
    from pytest_gradgate.explore.upstream_check import confirm_on_upstream
    # on a fork, a key match is no proof: upstream must fail the very case the same way
    stats["upstream_checked"] = confirm_on_upstream(found, build.library, state.source, state.build_options(),
                                                    progress=progress)
    if state.update_baseline and state.baseline is not None:
        # recorded now, written with the suite's entries at the end of the run (report/outputs.py)
        from pytest_gradgate.explore.upstream_check import to_record
        recorded, theirs = to_record(found)
        state.baseline.record_explore(findings_mod.baseline_entries(recorded, theirs, getattr(state, "upstream", None)),
                                      state.source.version)
        for f in recorded:
            f.known = {"node": f"explore: {findings_mod.key_text(f.key)}", "status": f.result["status"],
                       "reason": "recorded in the new baseline"}
    if settings["explore_out"]:
        from pathlib import Path
        from pytest_gradgate.cli.explore import header_text, write_out
        write_out(Path(config.invocation_params.dir) / settings["explore_out"], found, stats,
                  header_text(state.source, stats))
    return found, stats


class ExploreSearchItem(pytest.Item):
    error = None

    def runtest(self):
        if self.error:
            pytest.fail(f"gradgate explore: the search could not run: {self.error}", pytrace=False)

    def reportinfo(self):
        return "explore", None, SEARCH_ITEM


class ExploreFindingItem(pytest.Item):
    def __init__(self, *, finding, **kwargs):
        super().__init__(**kwargs)
        self.finding = finding
        self.add_marker("gradgate")

    def runtest(self):
        f = self.finding
        if f.known:
            pytest.xfail(f"known failure (baseline {f.known['node']}): {f.known['status']}: {f.known.get('reason')}")
        pytest.fail(finding_text(f), pytrace=False)

    def reportinfo(self):
        return "explore", None, self.name


def finding_text(f):
    import yaml
    from pytest_gradgate.explore.findings import describe
    body = yaml.safe_dump([f.mapping], sort_keys=False, default_flow_style=None, width=110)
    d = f.to_dict()
    lines = [describe(f)]
    if f.not_upstream:
        lines.append(f"the fork's own: {f.not_upstream}")
    if d["diagnosis"]:
        lines.append(f"diagnosis: {' '.join(d['diagnosis'].split())}")
    lines.append(f"found after {f.found_after_s:.1f} s by the job with seed {f.seed}")
    if f.flaky:
        from pytest_gradgate.explore.findings import flaky_text
        lines.append(f"FLAKY: its case {flaky_text(f)}, so it is no case to paste (nondeterminism in ggml, or "
                     "state the case does not set); the case it failed with:")
    else:
        lines.append("shrunk case (paste under `cases:` of a case file):")
    lines.extend("  " + line for line in body.splitlines())
    return "\n".join(lines)


def summary(terminalreporter, state):
    stats = getattr(state, "explore_stats", None)
    if not stats:
        return
    from pytest_gradgate.cli.explore import summary_text
    terminalreporter.write_sep("-", "gradgate explore")
    first = summary_text([], stats).splitlines()[0]
    terminalreporter.write_line(f"gradgate explore: {first}")
    if stats.get("no_backward"):
        terminalreporter.write_line(f"gradgate explore: not searched (no backward in this ggml): "
                                    f"{', '.join(stats['no_backward'])}")
    new = [f for f in state.explore_findings if not f.known]
    terminalreporter.write_line(f"gradgate explore: {len(state.explore_findings)} finding(s), {len(new)} new")
    if new and state.baseline is None and not state.source.pinned:
        from pytest_gradgate.gate.baseline import DEFAULT_FILE, first_run_text
        record = (f"pytest --gradgate-explore={state.settings['explore']} --gradgate-ggml-src={state.source.label} "
                  f"--gradgate-update-baseline --gradgate-baseline={DEFAULT_FILE}")
        terminalreporter.write_line(f"gradgate: {first_run_text(state.source.label, record, what='finding')}",
                                    yellow=True)
