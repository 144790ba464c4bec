"""Safe parsing of graph expressions: `concat(a, b, dim=1)`, `y = mul_mat(w, x)`.

A whitelist over Python's ast: calls of plain names, names, numbers, strings, booleans,
None, lists/tuples of those and unary minus on numbers. Nothing is ever evaluated.
The parsed form is plain data (tuples) so it can be checked at collection time and
built by the engine from the same text.
"""

import ast
from dataclasses import dataclass

from pytest_gradgate.errors import CaseError

# a graph line longer than this is not a hand-written case: refused before Python's parser
# sees it (a 100,000-term line exhausts its recursion limit or the memory)
MAX_LINE_CHARS = 4000
MAX_OPS = 500               # op calls in a whole graph (each makes up to 64 tensors: engine.graph_tensors)
SHOWN_CHARS = 80            # how much of an expression an error message echoes


def clip(text, limit=SHOWN_CHARS):
    """`text`, or its start and how long it was: messages and JUnit stay readable."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple = ()
    kwargs: tuple = ()          # ((name, value), ...), order kept
    col: int = 0



@dataclass
class Line:
    target: str                 # the name the result is bound to ("out" for a bare expression)
    expr: object                # Call, Ref or a constant
    text: str
    index: int = 0              # position in the graph list (for error lines)


def _const(node, text):
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _const(node.operand, text)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(_const(e, text) for e in node.elts)
    raise CaseError(f"'{clip(ast.get_source_segment(text, node) or type(node).__name__)}' is not allowed in a graph "
                    "expression (only op calls, names, numbers, strings, booleans and lists)")


_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _convert(node, text):
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise CaseError(f"'{clip(ast.get_source_segment(text, node.func))}' is not an op name; call ops by their "
                            "lowercase ggml name, e.g. mul_mat(a, b)")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise CaseError("*args and **kwargs are not allowed in graph expressions")
        return Call(node.func.id, tuple(_convert(a, text) for a in node.args),
                    tuple((k.arg, _convert(k.value, text)) for k in node.keywords), node.col_offset)
    if isinstance(node, ast.Name):
        # YAML's spellings too: a case file writes is_2d=false as it writes everything else
        if node.id in _WORDS:
            return _WORDS[node.id]
        return Ref(node.id)
    return _const(node, text)


def parse_expression(text):
    text = text.strip()
    if len(text) > MAX_LINE_CHARS:
        raise CaseError(f"graph expression '{clip(text)}' is too long (more than {MAX_LINE_CHARS} characters); "
                        "split it into 'name = expression' lines")
    try:
        tree = ast.parse(text, mode="eval")
        return _convert(tree.body, text)
    except SyntaxError as exc:
        raise CaseError(f"graph expression '{clip(text)}' is not valid: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise CaseError(f"graph expression '{clip(text)}' is nested too deeply; "
                        "split it into 'name = expression' lines") from None


def parse_graph(graph):
    """A string (one expression, or several "name = expr" lines) or a list of lines -> [Line]."""
    if isinstance(graph, str):
        raw = [line for line in graph.splitlines() if line.strip() and not line.strip().startswith("#")]
    elif isinstance(graph, (list, tuple)) and all(isinstance(x, str) for x in graph):
        raw = list(graph)
    else:
        raise CaseError("'graph' must be an expression or a list of 'name = expression' lines")
    if not raw:
        raise CaseError("'graph' is empty")
    lines = []
    for i, text in enumerate(raw):
        target, expr_text = "out", text
        head, sep, tail = text.partition("=")
        if sep and head.strip().isidentifier() and not tail.startswith("="):
            target, expr_text = head.strip(), tail
        elif i < len(raw) - 1:
            raise CaseError(f"graph line {i + 1} '{clip(text.strip())}' must be 'name = expression' "
                            "(only the last line may be a bare expression)", graph_line=i + 1)
        lines.append(Line(target, parse_expression(expr_text), text.strip(), i))
    n_ops = len(ops_used(lines))
    if n_ops > MAX_OPS:
        raise CaseError(f"the graph has {n_ops} op calls; a case may have at most {MAX_OPS} "
                        "(check the ops one by one, in smaller cases)")
    return lines


def nodes(lines):
    """Every Call and Ref of the graph lines, outer before inner."""
    stack = [line.expr for line in reversed(lines) if isinstance(line.expr, (Call, Ref))]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Call):
            inner = [*node.args, *(v for _, v in node.kwargs)]
            stack.extend(reversed([n for n in inner if isinstance(n, (Call, Ref))]))


def ops_used(lines):
    return [node.op for node in nodes(lines) if isinstance(node, Call)]


def main_op(lines):
    """The op a case is about: the outermost call of its last line."""
    expr = lines[-1].expr
    return expr.op if isinstance(expr, Call) else "ref"
