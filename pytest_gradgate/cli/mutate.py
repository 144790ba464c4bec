"""Plant standard mutations in the backward code of the tree under test, one at a time, and say
which the gate lets through (gradgate mutate).

    gradgate mutate [--ggml-src TREE] [--cases FILE ...] [-k EXPR] [--ops OPS] [-j N]
                    [--since COMMIT] [--at PATH:LINE] [--timeout S] [--limit N] [--explore-s S]
                    [--list] [--workdir DIR]

Exit 0 when every mutant run was killed (or did not compile), 1 when some survived, 2 on a usage
error. Results go to DIR/gradgate-mutate/report.json after every mutant: the same command run
again resumes where it stopped.
"""

import sys
from pathlib import Path

from pytest_gradgate.cli.verify import own_folder
from pytest_gradgate.errors import UsageError


def add_arguments(p):
    p.add_argument("--ggml-src", metavar="PATH", help="the ggml or llama.cpp tree to mutate (default: the pinned ggml)")
    p.add_argument("--cases", action="append", default=[], metavar="FILE",
                   help="case files to run instead of the built-in suite (repeatable)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="select cases as pytest -k does")
    p.add_argument("--ops", metavar="OPS", help="mutate only the backward code of these ops, comma-separated "
                   "(their case blocks in ggml_compute_backward and their kernels)")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="mutants at once, each in its own copy")
    p.add_argument("--since", metavar="COMMIT", help="mutate only the lines changed since COMMIT (git diff)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="per-mutant limit in seconds (default: 3x the unmutated build and run, at least 120)")
    p.add_argument("--at", action="append", default=[], metavar="PATH:LINE",
                   help="only the mutants at this line (a path relative to the ggml root; repeatable)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="run at most N mutants (in file order)")
    p.add_argument("--explore-s", type=float, default=10.0, metavar="S",
                   help="search each survivor with explore over its ops for S seconds (default 10; 0: off)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--workdir", metavar="DIR", default=None,
                   help="where the copies, builds and report.json go (default: the user cache)")


def run(args):
    from pytest_gradgate.declare.expr import ops_used, parse_graph
    from pytest_gradgate.library.cache import cache_root
    from pytest_gradgate.cli.build import source_from
    from pytest_gradgate.library.source import GGML_BUILD_INPUTS
    from pytest_gradgate.library.tree_digest import tree_digest
    from pytest_gradgate.mutate import sites
    from pytest_gradgate.mutate.report import Report
    from pytest_gradgate.mutate.runner import MutationRun, Selection, explore_survivors

    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: at least 1")
    root = source_from(args).root
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    lines = sites.changed_lines(root, args.since) if args.since else None
    mutants = sites.mutants(root, ops=ops, lines=lines)
    if args.at:
        wanted = {_place(at) for at in args.at}
        mutants = [m for m in mutants if (m.path, m.line) in wanted]
    if args.limit is not None:
        mutants = mutants[:args.limit]
    if args.list:
        for m in mutants:
            print(f"{m.path}:{m.line} {m.function} ({', '.join(m.ops)}) {m.operator}: {m.description}")
        print(f"{len(mutants)} mutants", file=sys.stderr)
        return 0
    if not mutants:
        print("gradgate mutate: no mutant: no backward code " + (f"changed since {args.since}" if args.since else
                                                                 "selected"), file=sys.stderr)
        return 0
    selection = Selection(args.keyword, args.cases, _case_ops(args.cases, ops_used, parse_graph))
    digest = tree_digest(root, GGML_BUILD_INPUTS)[:16]
    workdir = own_folder(Path(args.workdir) if args.workdir else cache_root() / "mutate" / digest, "mutate")
    key = {"tree": digest, "selection": selection.args() or []}
    header = {"ggml_root": str(root), "ops": ops, "jobs": args.jobs}
    report = Report.open(workdir / "report.json", key, header)
    runner = MutationRun(root, workdir, mutants, selection, jobs=args.jobs, report=report,
                         progress=lambda text: print(text, file=sys.stderr, flush=True))
    print("gradgate mutate: running the selected cases on the unmutated tree", file=sys.stderr, flush=True)
    took = runner.check_unmutated()
    runner.timeout_s = args.timeout or max(120.0, 3 * took)
    try:
        runner.run()
        if args.explore_s > 0:
            explore_survivors(runner, args.explore_s)
    except KeyboardInterrupt:
        print(f"\ngradgate mutate: interrupted; {len(report.results)} results kept in {report.path}: run the same "
              "command again to go on", file=sys.stderr)
        return 130
    ids = [m.id for m in mutants]
    print(report.table(ids))
    print(f"report: {report.path}", file=sys.stderr)
    return 1 if report.counts(set(ids)).get("survived") else 0


def _case_ops(case_files, ops_used, parse_graph):
    """case name (before a vary suffix) -> the ops its graph(s) use, over the files that run."""
    from pytest_gradgate.declare.loader import load_file
    from pytest_gradgate.gate.selection import BUILTIN_FILES
    out = {}
    for path in ([Path(f) for f in case_files] or BUILTIN_FILES):
        loaded, _ = load_file(path)
        for entry in loaded:
            for case in entry.cases:
                graphs = list(case.equivalent.values()) if case.equivalent else [case.graph]
                used = set()
                for graph in graphs:
                    used.update(ops_used(parse_graph(graph)))
                out.setdefault(case.name.split(",")[0], set()).update(used)
    return out


def _place(at):
    path, _, line = at.rpartition(":")
    if not path or not line.isdigit():
        raise UsageError(f"--at {at}: give PATH:LINE, e.g. src/ggml.c:6835")
    return path, int(line)
