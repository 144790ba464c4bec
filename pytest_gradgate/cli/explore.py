"""Search for backward bugs beyond the fixed suite: random cases, each failure shrunk to a case.

Draws graphs of one or two ops over the op table's ops (and the ops that --cases files declare),
parameters and shapes, the consumers, the losses and thread counts (pytest_gradgate/explore/space.py),
runs each in the isolated worker, and shrinks every distinct failure (op, class, crash site) with
Hypothesis to a small case. A new finding's case is run again (explore/reproduce.py): printed as
YAML ready to paste into a case file if it fails the same way every time, else as flaky. Failures
the baseline records are marked known. Exit status 1 when there is a finding that is not known,
else 0.
"""

import re
import sys
from pathlib import Path

from pytest_gradgate.errors import UsageError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*$")
DEFAULT_DATABASE = ".hypothesis/gradgate-explore"
DEFAULT_BASELINE_FILE = "gradgate-baseline.json"


def parse_duration(text, option="--budget"):
    """'60s', '10m', '1h' or a number of seconds -> seconds."""
    m = _DURATION.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{option}: {text!r} is not a duration; write e.g. 60s, 10m or 90")
    return float(m.group(1)) * {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


def add_arguments(p):
    p.add_argument("--ggml-src", metavar="PATH",
                   help="a ggml or llama.cpp checkout, or a pinned source (default: $GRADGATE_GGML_SRC, else the "
                        "pinned ggml 0.15.3)")
    p.add_argument("--budget", default="60s", help="how long to draw new cases, e.g. 60s or 10m (default 60s); "
                                                   "a shrink under way may take up to 20 s more")
    p.add_argument("--seed", type=int, default=0, help="seed of the search (job i uses seed + i; default 0)")
    p.add_argument("--ops", nargs="+", metavar="OP",
                   help="ops to search (default: every op of `gradgate ops` and every op --cases declares)")
    p.add_argument("--cases", nargs="+", metavar="FILE",
                   help="case files whose declared ops (`ops:`, a fork's own, see docs/declared-ops.md) are searched "
                        "too; an op's `ranges:` bound its int and float arguments")
    p.add_argument("--consumers", nargs="+", metavar="NAME", help="consumers to draw from (default: all)")
    p.add_argument("-n", "--jobs", type=int, default=1, metavar="N",
                   help="parallel jobs, each with its own worker (default 1)")
    p.add_argument("--out", metavar="FILE",
                   help="write the findings as a case file FILE (.yaml) plus FILE's .json beside it")
    p.add_argument("--baseline", metavar="FILE",
                   help="known failures (default: the shipped baseline of a pinned source)")
    p.add_argument("--update-baseline", action="store_true",
                   help="record this run's new findings as known in the --baseline FILE (created if missing; "
                        "its entries are kept), keyed by op, class and site, and exit 0")
    p.add_argument("--database", default=DEFAULT_DATABASE, metavar="DIR",
                   help=f"Hypothesis example database: earlier failures are replayed first (default {DEFAULT_DATABASE})")
    p.add_argument("--no-database", action="store_true", help="neither replay nor save earlier failures")


def _progress(text):
    print(f"gradgate explore: {text}", file=sys.stderr, flush=True)


def resolve(args):
    """(source, library, baseline or None) for the arguments; usage errors for bad values."""
    from pytest_gradgate.library.cmake import ensure_build
    from pytest_gradgate.library.options import BuildOptions
    from pytest_gradgate.cli.build import source_from
    from pytest_gradgate.gate import baseline as baseline_file
    source = source_from(args)
    path = args.baseline or (baseline_file.shipped_baseline(source.pinned) if source.pinned else None)
    if args.update_baseline and not Path(path).exists():
        baseline = baseline_file.Baseline(path)
    elif path:
        baseline = baseline_file.Baseline.load(path)
    else:
        # a fork of a pinned version starts from upstream's known failures, as the suite does; each
        # finding known from them is run on upstream too (explore/upstream_check.py)
        baseline = baseline_file.upstream_baseline(source)
        if baseline is not None:
            _progress(f"baseline: upstream {baseline.upstream}'s known failures (this tree says it is ggml "
                      f"{source.version}); a finding counts as one of them only if upstream fails its case the same way")
    build = ensure_build(source.root, BuildOptions(), progress=_progress)
    return source, build.library, baseline


def run(args):
    from pytest_gradgate.explore import require_hypothesis
    require_hypothesis("gradgate explore")
    from pytest_gradgate.explore import findings as findings_mod, search, space
    budget = parse_duration(args.budget)
    if args.jobs < 1:
        raise UsageError(f"-n: {args.jobs} jobs; give 1 or more")
    from pytest_gradgate.explore import declared as declared_ops
    declared = declared_ops.from_files(args.cases) if args.cases else {}
    try:
        ops = space.explorable_ops(args.ops, declared)
    except ValueError as exc:
        raise UsageError(f"--ops: {exc}") from None
    from pytest_gradgate.ops.consumers import CONSUMERS
    unknown = [c for c in args.consumers or () if c not in CONSUMERS]
    if unknown:
        raise UsageError(f"--consumers: unknown consumer(s) {', '.join(unknown)}; known: {', '.join(CONSUMERS)}")
    if args.update_baseline and not args.baseline:
        # the shipped baseline of a pinned source lives in the installed package: not a file to write
        raise UsageError("--update-baseline: name the file to record the findings in with --baseline FILE "
                         f"(e.g. --baseline {DEFAULT_BASELINE_FILE})")
    source, library, baseline = resolve(args)
    check_declared_in_headers(declared, source)
    _progress(f"ggml {source.version} from {source.label}; {budget:g} s, seed {args.seed}, {args.jobs} job(s), "
              f"{len(ops)} ops")
    found, stats = search.explore(library, budget, seed=args.seed, ops=list(ops), consumers=args.consumers,
                                  jobs=args.jobs, database=None if args.no_database else args.database,
                                  progress=_progress, baseline=baseline, declared=declared)
    findings_mod.mark_known(found, baseline)
    from pytest_gradgate.explore.upstream_check import confirm_on_upstream
    from pytest_gradgate.library.options import BuildOptions
    # on a fork, a key match is no proof: upstream must fail the very case the same way
    stats["upstream_checked"] = confirm_on_upstream(found, library, source, BuildOptions(), progress=_progress)
    stats["case_files"] = list(args.cases or ())
    stats["consumers"] = list(args.consumers or ())
    print(summary_text(found, stats, args))
    if args.out:
        write_out(args.out, found, stats, header_text(source, stats))
        _progress(f"wrote {args.out} and {json_path(args.out)}")
    new = [f for f in found if f.known is None]
    if args.update_baseline:
        from pytest_gradgate.gate.baseline import upstream_baseline
        from pytest_gradgate.explore.upstream_check import to_record
        # on a fork, what upstream does not fail the same way is recorded as the fork's own: red
        # on later searches until its entry is given an "accepted" reason (docs/fork.md)
        entries = findings_mod.baseline_entries(*to_record(found), upstream_baseline(source))
        counted = []

        def change(current):      # the file as other runs left it, plus this run's findings
            counted.append(current.record_explore(entries, source.version))
            return current
        from pytest_gradgate.gate.baseline import record
        baseline = record(baseline.path, change)
        recorded = counted[0]
        own = [key for key, entry in entries.items() if entry.get("own")]
        _progress(f"recorded {recorded} new finding(s) in {baseline.path} ({len(baseline.explore)} explore "
                  f"finding(s) and {len(baseline)} suite failure(s) in it)"
                  + (f"; {len(own)} of them the fork's own, not in upstream {entries[own[0]]['own']}'s known failures: "
                     "each stays a new finding until its entry is given an \"accepted\": \"<why>\" reason: "
                     + ", ".join(own) if own else ""))
        return 0
    if new and baseline is None and not source.pinned:
        print("\n" + first_run_text(source, stats, bool(args.ops)))
    return 1 if new else 0


def check_declared_in_headers(declared, source, option="--cases"):
    """A declared op whose function the tree's headers lack is a UsageError before the search,
    not a harness error in every draw of it."""
    from pytest_gradgate.explore.declared import prototypes
    from pytest_gradgate.ops.declared import header_text, missing_from_headers
    if not declared:
        return
    missing = missing_from_headers(prototypes(declared), header_text(source.root))
    if missing:
        raise UsageError(f"{option}: " + "; ".join(f"op '{name}': {symbol} is not declared in the headers of the ggml "
                                                    f"tree under test ({source.root}/include)"
                                                    for name, symbol in missing.items()))


def first_run_text(source, stats, ops_given):
    """The note of a run on an unpinned tree with no --baseline (gate/baseline.py)."""
    from pytest_gradgate.gate.baseline import first_run_text as text
    record = (f"gradgate explore --ggml-src {source.label} --budget {stats['budget_s']:g}s --seed {stats['seed']} "
              f"-n {stats['jobs']}" + (" --cases " + " ".join(stats["case_files"]) if stats.get("case_files") else "")
              + (" --consumers " + " ".join(stats["consumers"]) if stats.get("consumers") else "")
              + (" --ops " + " ".join(stats["ops"]) if ops_given else "")
              + f" --baseline {DEFAULT_BASELINE_FILE} --update-baseline")
    return text(source.label, record, what="finding")


def _tree_options(ggml_src, option):
    """The tree under test as an option of a printed command (none for the default): without it
    the command would run the default ggml, silently."""
    import shlex
    return f" {option} {shlex.quote(str(ggml_src))}" if ggml_src else ""


def replay_command(stats, ops_given, ggml_src=None):
    cmd = (f"gradgate explore{_tree_options(ggml_src, '--ggml-src')} --seed {stats['seed']} -n {stats['jobs']} "
           f"--budget {stats['budget_s']:g}s")
    if stats.get("case_files"):
        cmd += " --cases " + " ".join(stats["case_files"])
    if stats.get("consumers"):
        cmd += " --consumers " + " ".join(stats["consumers"])
    return cmd + (" --ops " + " ".join(stats["ops"]) if ops_given else "")


def header_text(source, stats):
    # a pinned source by its name, a tree by its path (a copy of a pinned tree included: as given)
    named = (None if source.origin == "default" else source.pinned.name if source.pinned is not None
             and not source.by_content else source.label)
    tree = _tree_options(named, "--gradgate-ggml-src")
    return (f"Findings of gradgate explore on ggml {source.version} from {source.label}\n"
            f"(seed {stats['seed']}, {stats['jobs']} job(s), budget {stats['budget_s']:g} s). Run them with:\n"
            f"  pytest --gradgate{tree} --gradgate-no-builtin --gradgate-cases THIS_FILE")


def summary_text(found, stats, args=None):
    from pytest_gradgate.explore.findings import flaky_text, key_text, node_name
    import yaml
    c = stats["counts"]
    why = ", ".join(f"{k} {v}" for k, v in sorted(stats["discarded"].items()))
    lines = [f"{c.get('cases', 0)} cases in {stats['search_s']:g} s: {stats['cases_per_s']:g} cases/s "
             f"({c.get('passed', 0)} passed, {c.get('findings', 0)} failing, {c.get('discarded', 0)} discarded"
             + (f": {why}" if why else "") + f", {c.get('errors', 0)} harness errors)"]
    for e in stats.get("errors") or ():
        lines.append(f"  harness error (not a finding): {e['message']}")
    if stats.get("no_backward"):
        lines.append(f"not searched (no backward in this ggml, so nothing to check): {', '.join(stats['no_backward'])}")
    known = sum(1 for f in found if f.known)
    lines.append(f"{len(found)} finding(s), {known} known from the baseline" + (":" if found else ""))
    ggml_src = getattr(args, "ggml_src", None) if args else None
    replay = replay_command(stats, bool(args and args.ops), ggml_src)
    tree = _tree_options(ggml_src, "--gradgate-ggml-src")
    for i, f in enumerate(found, 1):
        lines.append("")
        mark = f"  [known: {f.known['node']}]" if f.known else "  [NEW]"
        lines.append(f"{i}. {key_text(f.key)}{mark}")
        if f.not_upstream:
            lines.append(f"   the fork's own: {f.not_upstream}")
        message = " ".join((f.result.get("message") or "").split())
        if message:
            lines.append(f"   {message}")
        if f.result.get("diagnosis"):
            lines.append(f"   diagnosis: {' '.join(f.result['diagnosis'].split())}")
        lines.append(f"   found after {f.found_after_s:.1f} s by job seed {f.seed}; replay the search: {replay}")
        if f.flaky:
            lines.append(f"   FLAKY: its case {flaky_text(f)} ({', '.join(f.reproduced['verdicts'])}), so it is no "
                         "case to paste: a verdict that changes from run to run is nondeterminism in ggml (threads, "
                         "uninitialised memory) or state the case does not set; the case it failed with:")
        elif f.known:
            lines.append(f"   case (recorded in the baseline), item {node_name(f.mapping)}:")
        else:
            reproduced = f" (failed the same way in {f.reproduced['runs']} of {f.reproduced['runs']} more runs)" \
                if f.reproduced else ""
            lines.append(f"   case{reproduced}, item {node_name(f.mapping)} (paste under `cases:`; run it with "
                         f"pytest --gradgate{tree} \"FILE::{node_name(f.mapping)}\"):")
        body = yaml.safe_dump([f.mapping], sort_keys=False, default_flow_style=None, width=110)
        lines.extend("     " + line for line in body.splitlines())
    return "\n".join(lines)


def json_path(out):
    return Path(out).with_suffix(".json")


def write_out(out, found, stats, header):
    import json
    from pytest_gradgate.explore import findings as findings_mod
    from pytest_gradgate.atomic_file import write_atomically
    write_atomically(Path(out), findings_mod.case_file_text(found, header))
    write_atomically(json_path(out), json.dumps(findings_mod.json_report(found, stats), indent=1) + "\n")
