"""The mutation operators: from one tree-sitter node, the replacements a plausible bug makes.

Each rule looks at a node of the parse tree and gives (replacement text, operator name, what it
does), applied to that node's bytes alone:
- arithmetic and comparison operators swapped (+ -, * /, < <=, > >=, == !=): a sign, a scale
  or a loop bound off by one (`i < n` to `i <= n`);
- an accumulation turned into an assignment and back (+= =, -= +=);
- a constant changed: 0 to 1, 1 to 0, a float to 0, -INFINITY to 0;
- the stride or size of one dimension used for its neighbour's (ne01 to ne02, nb1 to nb2,
  ->ne[1] to ->ne[2]);
- an operand swapped or dropped in a ggml call (ggml_mul(ctx, a, b) to ggml_mul(ctx, b, a),
  and to ggml_mul(ctx, a, a)).
"""

import re

ARITHMETIC = {"+": "-", "-": "+", "*": "/", "/": "*"}
COMPARISON = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
ASSIGNMENT = {"+=": "=", "-=": "+=", "*=": "=", "=": "+="}
DIM_NAME = re.compile(r"^(ne|nb)(\d?)([0-3])$")
FLOAT = re.compile(r"^(\d+\.\d*|\.\d+)(e[+-]?\d+)?f?$", re.IGNORECASE)


def _text(node):
    return node.text.decode("utf-8", "replace")


def _neighbour(digit):
    d = int(digit)
    return str(d + 1 if d < 3 else d - 1)


def mutations(node):
    """[(start byte, end byte, replacement, operator, description)] for one node."""
    kind = node.type
    out = []
    if kind == "binary_expression":
        op = node.child_by_field_name("operator")
        if op is not None:
            sym = _text(op)
            swap = ARITHMETIC.get(sym) or COMPARISON.get(sym)
            if swap:
                name = "arithmetic" if sym in ARITHMETIC else "comparison"
                out.append((op.start_byte, op.end_byte, swap, name, f"'{sym}' -> '{swap}'"))
    elif kind == "assignment_expression":
        op = node.child_by_field_name("operator")
        if op is not None and _text(op) in ASSIGNMENT:
            sym = _text(op)
            # a plain `=` to `+=` only where the target is an element or a dereference: an
            # accumulation that should be a store (dx[i] = ... -> dx[i] += ...)
            left = node.child_by_field_name("left")
            if sym != "=" or (left is not None and left.type in ("subscript_expression", "pointer_expression")):
                out.append((op.start_byte, op.end_byte, ASSIGNMENT[sym], "accumulation",
                            f"'{sym}' -> '{ASSIGNMENT[sym]}'"))
    elif kind == "number_literal":
        text = _text(node)
        if _dimension_index(node):
            return out      # ->ne[1]: the dimension rule's
        if text in ("0", "1"):
            new = "1" if text == "0" else "0"
            out.append((node.start_byte, node.end_byte, new, "constant", f"{text} -> {new}"))
        elif FLOAT.match(text) and float(text.rstrip("fF")) != 0.0:
            out.append((node.start_byte, node.end_byte, "0.0f", "constant", f"{text} -> 0.0f"))
    elif kind == "identifier":
        text = _text(node)
        m = DIM_NAME.match(text)
        if m:
            new = f"{m.group(1)}{m.group(2)}{_neighbour(m.group(3))}"
            out.append((node.start_byte, node.end_byte, new, "dimension", f"{text} -> {new}"))
        elif text == "INFINITY" and node.parent is not None and node.parent.type == "unary_expression":
            parent = node.parent
            out.append((parent.start_byte, parent.end_byte, "0.0f", "constant", f"{_text(parent)} -> 0.0f"))
    elif kind == "subscript_expression":
        # t->ne[1], t->nb[2]: the neighbouring dimension's
        arg = node.child_by_field_name("indices") or node.child_by_field_name("index")
        target = node.child_by_field_name("argument")
        if arg is not None and target is not None and target.type == "field_expression":
            field = target.child_by_field_name("field")
            inner = _text(arg).strip("[] ")
            if field is not None and _text(field) in ("ne", "nb") and inner in ("0", "1", "2", "3"):
                digit = next(c for c in arg.children if c.type == "number_literal") if arg.children else arg
                out.append((digit.start_byte, digit.end_byte, _neighbour(inner), "dimension",
                            f"{_text(node)} -> {_text(target)}[{_neighbour(inner)}]"))
    elif kind == "call_expression":
        fn = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments")
        if fn is not None and args is not None and _text(fn).startswith("ggml_"):
            operands = [c for c in args.named_children if c.type != "comment"]
            # ggml_op(ctx, a, b, ...): the tensors after the context
            if len(operands) >= 3 and _text(operands[0]) == "ctx":
                a, b = operands[1], operands[2]
                ta, tb = _text(a), _text(b)
                # ggml_add_or_set(ctx, cgraph, isrc0, grad): a graph and an index, not tensors
                if ta != tb and not {ta, tb} & {"cgraph"} and not ta.startswith("isrc") and not tb.startswith("isrc"):
                    out.append((a.start_byte, b.end_byte, f"{tb}, {ta}", "operand",
                                f"{_text(fn)}: operands {ta} and {tb} swapped"))
                    out.append((b.start_byte, b.end_byte, ta, "operand",
                                f"{_text(fn)}: {tb} dropped for {ta}"))
    return out


def _dimension_index(node):
    """Whether node is the index of t->ne[i] or t->nb[i]."""
    parent = node.parent
    if parent is not None and parent.type == "subscript_argument_list":
        parent = parent.parent
    if parent is None or parent.type != "subscript_expression":
        return False
    target = parent.child_by_field_name("argument")
    field = target.child_by_field_name("field") if target is not None and target.type == "field_expression" else None
    return field is not None and _text(field) in ("ne", "nb")
