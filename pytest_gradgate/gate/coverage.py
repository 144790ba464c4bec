"""Which axes where backward bugs live the built-in suite covers, op by op: one table, computed.

Issue 53 planted bugs that the suite missed because no case reached them: a window of all-negative
values, a 4-D batch, an op parameter left at its default. This table says, for each op the suite
is about (a case's main op, the outermost call of its graph's last line), what its cases reach,
read from the cases themselves (never typed by hand, so it cannot drift from them):

- laid-out gradient: the consumers other than `none` its cases run through;
- laid-out input: the producers other than `none`;
- 4-D batch: a param with ne2 > 1 and ne3 > 1 (a backward that confuses dim 2's stride with dim 3's
  is right whenever either is 1);
- negative inputs: a param whose init range lies below 0 (all values negative: a max-pool window,
  a relu mask);
- used twice: a tensor (a param, or a named intermediate) that two calls of the graph read, so
  that two gradients meet in it;
- largest ne0: the largest first dimension of a param (an unrolled or SIMD loop leaves a tail
  only past its step);
- params never set: the op's constant parameters that no case gives a value (the op's default
  is all the suite checks of them).

`gradgate coverage` prints it as Markdown; docs/coverage.md shows it, and tests/test_coverage.py
keeps that copy equal to what the suite computes.
"""

from pytest_gradgate.declare.expr import Call, Ref, main_op, parse_graph

COLUMNS = ("op", "cases", "laid-out gradient", "laid-out input", "4-D batch", "negative inputs", "used twice",
           "largest ne0", "params never set")


def _calls(expr):
    """Every Call inside an expression, outermost first."""
    if isinstance(expr, Call):
        yield expr
        for arg in expr.args:
            yield from _calls(arg)
        for _, value in expr.kwargs:
            yield from _calls(value)


def _negative(init):
    return isinstance(init, (list, tuple)) and len(init) == 2 and all(isinstance(v, (int, float)) for v in init) \
        and max(init) < 0


def case_axes(case):
    """(main op, {axis: value}) of one Case."""
    lines = parse_graph(case.graph)
    op = main_op(lines)
    reads, set_params = {}, set()
    for line in lines:
        for call in _calls(line.expr):
            for arg in call.args:
                if isinstance(arg, Ref):
                    reads[arg.name] = reads.get(arg.name, 0) + 1
            if call.op == op:
                set_params |= {k for k, _ in call.kwargs}
    tensors = set(case.params) | {line.target for line in lines}
    shapes = [list(s) + [1] * (4 - len(s)) for s in case.params.values()]
    return op, {
        "consumer": case.consumer, "producer": case.producer,
        "batch4d": any(s[2] > 1 and s[3] > 1 for s in shapes),
        "negative": any(_negative(case.init.get(name)) for name in case.params),
        "twice": any(n >= 2 for name, n in reads.items() if name in tensors),
        "ne0": max((s[0] for s in shapes), default=0),
        "set": set_params,
    }


def table(cases):
    """{op: row dict} over Cases (each item a Case; a YAML entry's variants are several)."""
    from pytest_gradgate.ops.table import OPS
    rows = {}
    for case in cases:
        if getattr(case, "equivalent", None):
            continue            # an equivalence case compares formulations, not a backward with numbers
        op, axes = case_axes(case)
        row = rows.setdefault(op, {"names": set(), "consumers": set(), "producers": set(), "batch4d": False,
                                   "negative": False, "twice": False, "ne0": 0, "set": set()})
        row["names"].add(case.name)
        row["consumers"].add(axes["consumer"])
        row["producers"].add(axes["producer"])
        for flag in ("batch4d", "negative", "twice"):
            row[flag] = row[flag] or axes[flag]
        row["ne0"] = max(row["ne0"], axes["ne0"])
        row["set"] |= axes["set"]
    for op, row in rows.items():
        spec = OPS.get(op)
        row["never_set"] = sorted(p.name for p in spec.params if p.name not in row["set"]) if spec else []
    return rows


def markdown(rows):
    def laid_out(names):
        shown = sorted(n for n in names if n != "none")
        return str(len(shown)) if shown else "-"
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for op in sorted(rows):
        r = rows[op]
        cells = (op, str(len(r["names"])), laid_out(r["consumers"]), laid_out(r["producers"]),
                 "yes" if r["batch4d"] else "-", "yes" if r["negative"] else "-", "yes" if r["twice"] else "-",
                 str(r["ne0"]), ", ".join(r["never_set"]) or "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def builtin_cases():
    """Every Case of the built-in suite's files, as `pytest --gradgate` collects them on CPU."""
    from pytest_gradgate.declare.loader import load_file
    from pytest_gradgate.gate.selection import BUILTIN_FILES
    cases = []
    for path in BUILTIN_FILES:
        loaded, _errors = load_file(path, ("cpu",), builtin=True)
        cases += [c for entry in loaded for c in entry.cases]
    return cases


def builtin_markdown():
    return markdown(table(builtin_cases()))
