"""Ops a case file declares by their C prototype: a fork's own ops, checked without editing
the op table.

    ops:
      my_double:
        c: "struct ggml_tensor * ggml_my_double(struct ggml_context * ctx, struct ggml_tensor * a);"

The prototype is parsed with pycparser (what cffi parses with). Its `struct ggml_tensor *`
arguments become the graph expression's positional arguments, in order; its int, float and bool
arguments keyword (or further positional) arguments, all required: C has no defaults. The
output's shape is not known before ggml builds the op: collection leaves it open (declare/graph.py)
and the worker gets it from ggml, so a shape ggml rejects is ggml's own assert, in the case's item.

In the worker the function is called through declarations of our own making (`void *` for the
context and the tensors, the scalars as declared), so its pointers are the ones the op table's
binding holds, whatever cffi makes of struct types declared twice.
"""

import functools
import re
from dataclasses import dataclass

from pytest_gradgate.errors import CaseError
from pytest_gradgate.ops.table import OPS, OpSpec, Param

# C scalar type -> (what a graph expression passes, what cffi is told)
SCALARS = {"int": (int, "int"), "int32_t": (int, "int32_t"), "int64_t": (int, "int64_t"),
           "uint32_t": (int, "uint32_t"), "size_t": (int, "size_t"), "float": (float, "float"),
           "double": (float, "double"), "bool": (bool, "bool"), "_Bool": (bool, "bool")}
# pycparser knows no headers: the names a prototype may use, declared for the parse alone
_PRELUDE = "".join(f"typedef int {t};\n" for t in ("int32_t", "int64_t", "uint32_t", "size_t", "bool"))
_PRELUDE += "struct ggml_context; struct ggml_tensor;\n"
_PRELUDE_DECLS = 7      # what pycparser makes of _PRELUDE: 5 typedefs, 2 structs
PROTOTYPE_HELP = ("a C prototype returning struct ggml_tensor *, with struct ggml_context * ctx first, then "
                  "named struct ggml_tensor * and int/float/bool arguments")


@dataclass(frozen=True)
class Declared:
    name: str               # the name graph expressions call it by
    symbol: str             # the C function
    tensors: tuple          # tensor argument names, in order
    scalars: tuple          # ((name, C type), ...) in order
    c: str                  # the prototype as written

    def cdef(self):
        """The declaration cffi gets: pointers as void *, scalars as declared."""
        args = ["void *"] + ["void *"] * len(self.tensors) + [ctype for _, ctype in self.scalars]
        return f"void * {self.symbol}({', '.join(args)});"


def _is_struct_pointer(decl_type, struct):
    from pycparser import c_ast
    return (isinstance(decl_type, c_ast.PtrDecl) and isinstance(decl_type.type, c_ast.TypeDecl)
            and isinstance(decl_type.type.type, c_ast.Struct) and decl_type.type.type.name == struct)


def parse_prototype(name, text):
    """A prototype's text -> Declared, or CaseError saying what is wrong with it."""
    from pycparser import c_ast, c_parser
    if not isinstance(text, str) or not text.strip():
        raise CaseError(f"op '{name}': 'c' must be {PROTOTYPE_HELP}")
    source = text.strip()
    if not source.endswith(";"):
        source += ";"
    try:
        tree = c_parser.CParser().parse(_PRELUDE + source, filename="<ops>")
    except c_parser.ParseError as exc:
        where = re.sub(r"^<ops>:\d+:(\d+): ", r"column \1: ", str(exc))
        raise CaseError(f"op '{name}': the prototype does not parse ({where}); "
                        f"write {PROTOTYPE_HELP}") from None
    decls = tree.ext[_PRELUDE_DECLS:]
    if len(decls) != 1 or not isinstance(decls[0], c_ast.Decl) or not isinstance(decls[0].type, c_ast.FuncDecl):
        raise CaseError(f"op '{name}': 'c' must be one function prototype, {PROTOTYPE_HELP}")
    func = decls[0].type
    if not _is_struct_pointer(func.type, "ggml_tensor"):
        raise CaseError(f"op '{name}': {decls[0].name} must return struct ggml_tensor *")
    args = list(func.args.params) if func.args else []
    if not args or not _is_struct_pointer(args[0].type, "ggml_context"):
        raise CaseError(f"op '{name}': the first argument of {decls[0].name} must be struct ggml_context * ctx "
                        "(a graph-building function)")
    tensors, scalars = [], []
    for arg in args[1:]:
        if not isinstance(arg, c_ast.Decl) or not arg.name:
            raise CaseError(f"op '{name}': every argument of {decls[0].name} needs a name (graph expressions "
                            "pass them by name)")
        if _is_struct_pointer(arg.type, "ggml_tensor"):
            if scalars:
                raise CaseError(f"op '{name}': tensor argument '{arg.name}' after a scalar one; graph expressions "
                                "pass the tensors first")
            tensors.append(arg.name)
            continue
        ctype = None
        if isinstance(arg.type, c_ast.TypeDecl) and isinstance(arg.type.type, c_ast.IdentifierType):
            ctype = " ".join(arg.type.type.names)
        if ctype not in SCALARS:
            raise CaseError(f"op '{name}': argument '{arg.name}' of {decls[0].name} is neither struct ggml_tensor * "
                            f"nor one of {', '.join(SCALARS)}; such an op needs an entry in the op table")
        scalars.append((arg.name, ctype))
    if not tensors:
        raise CaseError(f"op '{name}': {decls[0].name} takes no struct ggml_tensor *: nothing to differentiate")
    return Declared(name, decls[0].name, tuple(tensors), tuple(scalars), text.strip())


def check_ranges(declared, ranges):
    """An op's `ranges:` (scalar argument -> [lo, hi], where explore draws its values) -> the
    ranges as {name: (lo, hi)}, or CaseError saying what is wrong."""
    if ranges is None:
        return {}
    kinds = {n: SCALARS[t][0] for n, t in declared.scalars}
    if not isinstance(ranges, dict):
        raise CaseError(f"op '{declared.name}': 'ranges' must map scalar arguments to [lo, hi]")
    out = {}
    for arg, bounds in ranges.items():
        if arg not in kinds or kinds[arg] is bool:
            raise CaseError(f"op '{declared.name}': 'ranges' names {arg!r}, which is no int or float argument of "
                            f"{declared.symbol} (those are: {', '.join(n for n, k in kinds.items() if k is not bool)})")
        if (not isinstance(bounds, list) or len(bounds) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
                or bounds[0] > bounds[1]):
            raise CaseError(f"op '{declared.name}': range of {arg!r} must be [lo, hi] with lo <= hi, got {bounds!r}")
        if kinds[arg] is int and not all(isinstance(b, int) for b in bounds):
            raise CaseError(f"op '{declared.name}': {arg!r} is an int argument; its range must be two integers")
        out[arg] = tuple(bounds)
    return out


def spec_of(declared, functions):
    """The OpSpec a graph expression binds: shape None (ggml's to say); `functions(g)` gives the
    cffi library that holds the declared functions for g's library."""
    params = tuple(Param(n, SCALARS[t][0], required=True) for n, t in declared.scalars)

    def build(g, t, p):
        fn = getattr(functions(g), declared.symbol)
        out = fn(g.ctx, *[t[n] for n in declared.tensors], *[p[n] for n, _ in declared.scalars])
        return g.ffi.cast("struct ggml_tensor *", out)
    return OpSpec(declared.name, f"declared {declared.symbol}", declared.tensors, params, None, build,
                  note=f"declared: {declared.c}")


@functools.lru_cache(maxsize=64)
def _table(items):
    declared = [parse_prototype(name, text) for name, text in items]
    cdef = "\n".join(d.cdef() for d in declared)

    def functions(g):
        from pytest_gradgate.library import binding
        return binding.declared_functions(g.lib, cdef)
    return {**OPS, **{d.name: spec_of(d, functions) for d in declared}}


def table_for(ops):
    """The op table a case's graph binds against: the built-in ops, and the ones it declares
    (name -> prototype). The built-in table itself where it declares none."""
    return _table(tuple(sorted(ops.items()))) if ops else OPS


def header_text(root):
    """The text of a ggml tree's public headers (include/*.h), where a fork declares its ops."""
    from pathlib import Path
    return "\n".join(p.read_text(errors="replace") for p in sorted((Path(root) / "include").glob("*.h")))


def missing_from_headers(ops, headers):
    """{name: symbol} of the declared ops (name -> prototype) whose function the headers lack."""
    missing = {}
    for name, text in ops.items():
        symbol = parse_prototype(name, text).symbol
        if not re.search(rf"\b{re.escape(symbol)}\s*\(", headers):
            missing[name] = symbol
    return missing
