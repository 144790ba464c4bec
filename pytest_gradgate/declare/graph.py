"""From a Case's graph lines to shapes (collection time) or ggml tensors (in the worker).

One walker serves both: `infer_shapes` runs it over shapes so that bad declarations are
reported with their line before anything runs; the engine runs it over tensors.
"""

from pytest_gradgate.errors import CaseError
from pytest_gradgate.declare.expr import Call, Ref, clip, parse_graph
from pytest_gradgate.ops.table import OPS, ShapeError, ne4


def _check_kind(op, param, value):
    kind = param.kind
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok:
        want = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(kind, "a list of integers")
        raise CaseError(f"{op}: {param.name} must be {want}, got {value!r}")
    return float(value) if kind is float else value


def bind(call, resolve, ops=OPS):
    """Match a Call's arguments to its op's signature -> (spec, tensors, params). `ops` is the
    op table, with a case file's declared ops where it has some (ops/declared.py)."""
    spec = ops.get(call.op)
    if spec is None:
        close = [n for n in ops if n.startswith(call.op[:3])]
        hint = f" (did you mean {', '.join(sorted(close)[:4])}?)" if close else ""
        raise CaseError(f"unknown op '{call.op}'{hint}; ops are the lowercase ggml names, see `gradgate ops`")
    args = list(call.args)
    tensors, params = {}, {}
    signature = ", ".join(list(spec.tensors) + [f"{t}=None" for t in spec.optional_tensors] +
                          [p.name + ("" if p.required else f"={p.default!r}") for p in spec.params])
    for name in spec.tensors:
        if not args or not isinstance(args[0], (Ref, Call)):
            got = len([a for a in call.args if isinstance(a, (Ref, Call))])
            if any(k == name for k, _ in call.kwargs):
                continue
            raise CaseError(f"{call.op} takes {len(spec.tensors)} tensor argument(s) "
                            f"({', '.join(spec.tensors)}), got {got}: {call.op}({signature})")
        tensors[name] = resolve(args.pop(0))
    for name in spec.optional_tensors:
        if args and (isinstance(args[0], (Ref, Call)) or args[0] is None):
            value = args.pop(0)
            tensors[name] = None if value is None else resolve(value)
    for p in spec.params:
        if not args:
            break
        if p.kind is tuple and not isinstance(args[0], tuple):
            params[p.name], args = tuple(args), []
        else:
            params[p.name] = args.pop(0)
    if args:
        raise CaseError(f"{call.op}: too many arguments; signature is {call.op}({signature})")
    for key, value in call.kwargs:
        if key in spec.tensors or key in spec.optional_tensors:
            if key in tensors:
                raise CaseError(f"{call.op}: argument '{key}' given twice")
            tensors[key] = None if value is None else resolve(value)
        elif any(p.name == key for p in spec.params):
            if key in params:
                raise CaseError(f"{call.op}: argument '{key}' given twice")
            params[key] = value
        else:
            raise CaseError(f"{call.op}: unknown keyword '{key}'; signature is {call.op}({signature})")
    for name in spec.tensors:
        if tensors.get(name) is None:
            raise CaseError(f"{call.op}: tensor argument '{name}' is missing: {call.op}({signature})")
    for p in spec.params:
        if p.name not in params:
            if p.required:
                raise CaseError(f"{call.op}: '{p.name}' is required: {call.op}({signature})")
            params[p.name] = p.default
        else:
            params[p.name] = _check_kind(call.op, p, params[p.name])
    return spec, tensors, params


def walk(lines, leaves, apply, ops=OPS):
    """Evaluate graph lines over `leaves` (name -> value); apply(spec, tensors, params) -> value."""
    env = dict(leaves)

    def evaluate(node):
        if isinstance(node, Ref):
            if node.name not in env:
                raise CaseError(f"unknown name '{node.name}' (declare it under params or inputs, "
                                "or bind it on an earlier graph line)")
            return env[node.name]
        if isinstance(node, Call):
            spec, tensors, params = bind(node, evaluate, ops)
            return apply(spec, tensors, params)
        raise CaseError(f"{node!r} is not a tensor")

    out = None
    for line in lines:
        try:
            out = evaluate(line.expr)
        except CaseError as exc:
            raise CaseError(f"graph line {line.index + 1} '{clip(line.text)}': {exc}", graph_line=line.index + 1) from None
        if line.target in leaves:
            raise CaseError(f"graph line {line.index + 1} rebinds '{line.target}', which is a param or input",
                            graph_line=line.index + 1)
        env[line.target] = out
    return out


def input_shape(spec):
    if "shape" in spec:
        return ne4(spec["shape"])
    values = spec.get("values")
    if values is None:
        raise CaseError("an input needs 'values' or 'shape'")
    return ne4([len(values)])


class KnownShape(tuple):
    """A leaf's shape that also carries its values (an i32 input's), so that collection can
    check the indices an op reads: ggml aborts or reads out of bounds on a bad one."""
    values = None


def _check_rows(tensors):
    """get_rows reads row `rows[i]` of a: each must be one of a's ne1 rows."""
    a, rows = tensors["a"], tensors["rows"]
    for value in getattr(rows, "values", None) or ():
        if not 0 <= value < a[1]:
            raise CaseError(f"get_rows: row {value} is not a row of a, which has {a[1]} (ne1 of {list(a)}); "
                            f"rows must be 0 to {a[1] - 1}")


INDEX_CHECKS = {"get_rows": _check_rows}


class OpenShape(tuple):
    """The output of a declared op before ggml has built it (its shape is ggml's to say), and of
    every op that reads one: collection checks what it can and leaves the rest to the worker."""


OPEN = OpenShape((0, 0, 0, 0))


def infer_shapes(case):
    """Output shape of a case's graph, or CaseError saying which line is wrong and why."""
    lines = parse_graph(case.graph)
    leaves = {}
    for name, shape in case.params.items():
        try:
            leaves[name] = ne4(shape)
        except ShapeError as exc:
            raise CaseError(f"param '{name}': {exc}") from None
    for name, spec in case.inputs.items():
        try:
            leaves[name] = KnownShape(input_shape(spec))
        except ShapeError as exc:
            raise CaseError(f"input '{name}': {exc}") from None
        if spec.get("type") == "i32" and "values" in spec:
            leaves[name].values = list(spec["values"])

    def apply(spec, tensors, params):
        if spec.shape is None or any(isinstance(t, OpenShape) for t in tensors.values()):
            return OPEN
        if spec.name in INDEX_CHECKS:
            INDEX_CHECKS[spec.name](tensors)
        try:
            return tuple(spec.shape(tensors, params))
        except ShapeError as exc:
            raise CaseError(f"shape mismatch: {exc}") from None
    from pytest_gradgate.ops.declared import table_for
    return walk(lines, leaves, apply, table_for(case.ops))
