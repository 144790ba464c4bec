"""Every op of the op table through every consumer, on one ggml: a Markdown triage table.

    python bench/op_table.py [--ggml-src DIR] [--ops sqr,div] [--consumers none,transpose]
                             [--isolate case] [--json out.json]

For each op of pytest_gradgate/ops.py the first case of the built-in suite whose graph is
about that op gives the shape, inputs, init and loss (FALLBACK covers ops the suite lacks);
that case is then run through every consumer that can read its output, each case in its
own forked child (a crash is one cell). Cells: `ok MAA`, `FAIL MAA`, `crash`, `no bw`,
`skip`, `n/a` (the consumer cannot read this output shape). A `*` marks a passed case
that is blind (power False). Failures and crashes are listed under the table with their
diagnosis, phase and ggml's message.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import pytest_gradgate
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.declare.case import Case
from pytest_gradgate.ops.consumers import CONSUMERS, check_consumer
from pytest_gradgate.declare.expr import Call, main_op, parse_graph
from pytest_gradgate.declare.graph import infer_shapes
from pytest_gradgate.isolation.parent import Runner
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.ops.table import OPS
from pytest_gradgate.isolation.crash import ggml_message
from pytest_gradgate.library.source import default_ggml_root

SUITE = Path(pytest_gradgate.__file__).resolve().parent / "cases.yaml"

# ops the built-in suite may not cover
FALLBACK = {
    "cont": dict(params={"a": [4, 3, 2]}, graph="cont(a)"),
    "permute": dict(params={"a": [4, 3, 2]}, graph="permute(a, axes=[1, 2, 0, 3])"),
    "view": dict(params={"a": [5, 3, 2]}, graph="view(a, ne=[2, 3, 2], nb=[5, 15, 30], offset=1)"),
    "soft_max_ext": dict(params={"a": [6, 4, 2]}, graph="soft_max_ext(a, scale=0.5)", loss="wsqr"),
    "rope_ext": dict(params={"a": [4, 2, 3]}, inputs={"pos": {"type": "i32", "values": [0, 5, 9]}},
                     graph="rope_ext(a, pos, n_dims=4)"),
    "concat": dict(params={"a": [4, 3, 5, 1], "b": [4, 2, 5, 1]}, graph="concat(a, b, dim=1)"),
    "pool_2d": dict(params={"a": [4, 4, 2]}, graph="pool_2d(a, op='avg')"),
}
# Where the suite's case is blind through the sqr loss, the table uses a loss with power:
# sum(sqrt(a)^2) = sum(a) has an all-ones gradient.
LOSS_OVERRIDE = {"sqrt": "wsqr"}
# the suite's case to use where its name is not the op's
PREFERRED = {"concat": "concat_dim1"}


def _ops_called(node, out):
    if isinstance(node, Call):
        out.append(node.op)
        for arg in list(node.args) + [v for _, v in node.kwargs]:
            _ops_called(arg, out)
    return out


def representative_cases():
    """op name -> Case (consumer none) for every op of the op table.

    The suite's case named after the op wins (`sgn` is mul(sgn(a), b), so that sgn's zero
    derivative does not leave the case blind), then one named op_*, then any case whose
    last line is that op."""
    loaded, errors = load_file(SUITE, builtin=True) if SUITE.exists() else ([], [])
    for err in errors:
        print(f"note: {err}", file=sys.stderr)
    candidates = {}
    for lc in loaded:
        case = lc.cases[0]
        lines = parse_graph(case.graph)
        called = set()
        for line in lines:
            called.update(_ops_called(line.expr, []))
        for op in called & set(OPS):
            rank = 0 if case.name in (op, PREFERRED.get(op)) else 1 if case.name.startswith(op + "_") else \
                2 if main_op(lines) == op else 3
            if op not in candidates or rank < candidates[op][0]:
                candidates[op] = (rank, case)
    chosen = {op: Case(**{**case.to_dict(), "consumer": "none"}) for op, (rank, case) in candidates.items()
              if rank < 3}
    for op, spec in FALLBACK.items():
        chosen.setdefault(op, Case(name=op, **spec))
    for op in OPS:
        if op not in chosen and OPS[op].tensors == ("a",):
            chosen[op] = Case(name=op, params={"a": [4, 3, 2]}, graph=f"{op}(a)")
    for op, loss in LOSS_OVERRIDE.items():
        if op in chosen:
            chosen[op] = Case(**{**chosen[op].to_dict(), "loss": loss})
    return chosen


def cell(r):
    if r is None:
        return "n/a"
    if r.status == "passed":
        return f"ok {r.maa:.1e}" + ("" if r.power else "*")
    if r.status == "failed":
        return f"**FAIL {r.maa:.2g}**"
    if r.status == "crashed":
        return "no bw" if r.no_backward else "**crash**"
    return r.status


def short(r):
    text = r.diagnosis or r.message
    return text.replace("\n", " ")[:220]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-src", help="ggml tree (default: the pinned default ggml)")
    ap.add_argument("--ops", help="comma-separated op names (default: all)")
    ap.add_argument("--consumers", help="comma-separated consumers (default: all)")
    ap.add_argument("--isolate", default="case", choices=("case", "worker", "none"))
    ap.add_argument("--json", help="also write every Result here")
    args = ap.parse_args(argv)

    root = Path(args.ggml_src) if args.ggml_src else default_ggml_root()
    build = ensure_build(root, BuildOptions())
    cases = representative_cases()
    ops = args.ops.split(",") if args.ops else sorted(cases)
    consumers = args.consumers.split(",") if args.consumers else list(CONSUMERS)
    runner = Runner(build.library, isolate=args.isolate)
    table, results, started = {}, [], time.perf_counter()
    try:
        for op in ops:
            base = cases[op]
            out_shape = infer_shapes(base)
            for c in consumers:
                if check_consumer(c, out_shape):
                    table[op, c] = None
                    continue
                r = runner.run(Case(**{**base.to_dict(), "consumer": c}))
                table[op, c] = r
                results.append(r)
    finally:
        runner.close()
    elapsed = time.perf_counter() - started

    print(f"ggml {root} ({len(results)} cases in {elapsed:.1f} s)\n")
    print("| op | case | loss | " + " | ".join(consumers) + " |")
    print("|---|---|---|" + "---|" * len(consumers))
    for op in ops:
        base = cases[op]
        print(f"| {op} | {base.name} | {base.loss} | " + " | ".join(cell(table[op, c]) for c in consumers) + " |")
    failed = [r for r in results if r.status == "failed"]
    if failed:
        print("\nFailed (wrong gradient values):\n")
        for r in failed:
            print(f"- {r.case_id} [{r.op}]: MAA {r.maa:.3g} > {r.limit:.3g}: {short(r)}")
    other = [r for r in results if r.status not in ("passed", "failed")]
    if other:
        # one line per distinct reason (ggml's abort line or 'no backward'), with the cells it explains
        print("\nCrashed / skipped / errors, by reason:\n")
        groups = {}
        for r in other:
            reason = r.diagnosis if r.no_backward else (ggml_message(r.stderr_tail) or short(r))
            reason = reason.split("/src/")[-1]
            groups.setdefault((r.status, r.phase, reason), []).append(f"{r.op}[{r.consumer}]")
        for (status, phase, reason), cells in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"- {status} in {phase}: {reason}: {len(cells)} cells: {', '.join(cells)}")
    blind = [r for r in results if r.status == "passed" and not r.power]
    if blind:
        print("\nPassed but blind (*): " + ", ".join(r.case_id for r in blind))
    counts = {}
    for r in results:
        counts[str(r.status)] = counts.get(str(r.status), 0) + 1
    print(f"\ntotals: {counts}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
