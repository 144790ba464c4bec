"""YAML case files -> Cases, with every error pointing at its file and line.

A file holds `cases:`, a list of mappings. Each mapping expands into one Case per
(consumer, loss, backend) with a contiguous input (producer `none`), and one per (producer,
loss, backend) through consumer `none`: one side's layout varies while the other stays
contiguous, so a failure names one layout (without `none` among the consumers, each producer
meets each consumer). A bad case is reported with its file:line and what to do;
the other cases of the file still load.
"""

import dataclasses
import math
import re
from math import prod
from pathlib import Path

import yaml

from pytest_gradgate.declare.case import (DEFAULT_EPS, DEFAULT_MAX_MAA, DEFAULT_STENCIL, DEFAULT_THREADS, Case,
                                          LoadedCase)
from pytest_gradgate.ops.consumers import CONSUMERS, DEFAULT_CONSUMERS, check_consumer
from pytest_gradgate.ops.producers import DEFAULT_PRODUCERS, PRODUCERS, laid_out_params
from pytest_gradgate.errors import CaseError
from pytest_gradgate.declare import vary
from pytest_gradgate.declare.yaml_shape import shape_error
from pytest_gradgate.declare.expr import Ref, clip, nodes, ops_used, parse_graph
from pytest_gradgate.declare.duplicate_keys import DuplicateKey, duplicates_in, first_duplicate
from pytest_gradgate.declare.graph import OpenShape, infer_shapes
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.table import ne4

CASE_KEYS = {
    "name": "the case's name (letters, digits, _ . -), unique in its file",
    "description": "free text",
    "params": "tensors that get gradients: name -> shape (1 to 4 sizes, ggml order ne0..ne3)",
    "inputs": "constants: name -> {type: i32|f32, values: [...]} or {type: f32, shape: [...], init: ...}",
    "init": "param value ranges: name -> [lo, hi] or {abs: [lo, hi]} (random signs)",
    "graph": "an expression, or a list of 'name = expression' lines; the last line is the output",
    "equivalent": "instead of graph: two or more formulations of one computation, name -> graph; their "
                  "gradients must agree (no finite differences; see pytest_gradgate/check/equivalence.py)",
    "consumers": f"consumers to check through (default {list(DEFAULT_CONSUMERS)})",
    "producers": f"what the params go through before the op (default {list(DEFAULT_PRODUCERS)}, or [none] "
                 "when the case names its consumers); each one is checked through consumer none (if the case has "
                 "it), each consumer through producer none",
    "loss": "loss, or a list of losses: sqr (default), wsqr, sum",
    "eps": f"finite-difference step (default {DEFAULT_EPS})",
    "stencil": f"2 or 4 points (default {DEFAULT_STENCIL})",
    "max_maa": f"MAA limit (default {DEFAULT_MAX_MAA})",
    "seed": "seed of the random inputs (default 0)",
    "backends": "backends to run on, among those the session builds (default: all of them)",
    "mode": "full (every element, default) or fast (random directions, for large tensors)",
    "directions": "fast mode: number of random directions (default 6)",
    "timeout": "seconds before the case is killed (default: sized to the case)",
    "threads": f"CPU threads the analytic backward runs on (default {DEFAULT_THREADS}; forwards run on one)",
    "ops": "ops declared by their C prototype (a fork's own): name -> {c: \"struct ggml_tensor * ggml_x(...);\"}; "
           "in a file, a top-level `ops:` declares them for all its cases (see docs/declared-ops.md)",
    "vary": "parameter axes: name -> list of values (one case per combination); $name in the case's other "
            "values is replaced (see pytest_gradgate/declare/vary.py)",
}
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-=,]+$")   # "=" and ",": the names vary.expand gives
# params and inputs are named in graph expressions: identifiers. Nothing else may reach the
# failure text, where a newline would start a line of its own (a GitHub workflow command)
TENSOR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
BACKENDS = ("cpu", "cuda")
# keys about finite differences, which an equivalence case does not compute
FINITE_DIFFERENCE_KEYS = ("eps", "stencil", "max_maa", "mode", "directions")
INPUT_KEYS = {"type", "values", "shape", "init"}


# libyaml's loader where PyYAML was built with it: the built-in files are read by every
# pytest-xdist worker at collection, and the pure-Python parser takes most of that time
_LOADERS = tuple(L for L in (getattr(yaml, "CSafeLoader", None), yaml.SafeLoader) if L is not None)


def _parse(text, prepare):
    """(root node, data, what prepare(root) gave) of one YAML document from one parse: the
    nodes give the lines, the data is what yaml.safe_load gives of the nodes as prepare left
    them. A document libyaml rejects is read again by the pure-Python loader, so that a syntax
    error is always worded and placed the same way."""
    for loader_class in _LOADERS:
        loader = loader_class(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None, None, prepare(None)
            prepared = prepare(root)
            return root, loader.construct_document(root), prepared
        except yaml.YAMLError:
            if loader_class is _LOADERS[-1]:
                raise
        finally:
            loader.dispose()


@dataclasses.dataclass
class RepeatedKey:
    """A key written twice at the top level or in `defaults:` (see _join_repeated_top_keys)."""
    duplicate: DuplicateKey
    advice: str = "remove one of them, or rename it"
    disputed: tuple = ()    # defaults keys whose value it leaves in doubt


def _join_repeated_top_keys(root):
    """The top level's repeated keys, as RepeatedKey entries; `root` is edited so that
    nothing is lost silently. `cases:` twice: the lists are joined, since each case is what
    its own text says. `defaults:` twice: the mappings are joined; a key set twice (in one
    block or in both) is in doubt, and so are the cases that take it from the defaults,
    which load_file leaves out, naming them."""
    if not isinstance(root, yaml.MappingNode):
        return []
    repeated = []   # (another key twice is an unknown top-level key, reported as that)
    blocks = {}
    for k, v in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value in ("cases", "defaults"):
            blocks.setdefault(k.value, []).append((k, v))
    cases = blocks.get("cases", [])
    if len(cases) > 1:
        repeated.append(RepeatedKey(DuplicateKey("cases", cases[0][0].start_mark.line + 1,
                                                 cases[1][0].start_mark.line + 1),
                                    advice="put the cases under one 'cases:' (the cases of every list are loaded)"))
        if all(isinstance(v, yaml.SequenceNode) for _, v in cases):
            _join(root, cases, yaml.SequenceNode, [item for _, v in cases for item in v.value])
    defaults = blocks.get("defaults", [])
    for _, block in defaults:
        if not isinstance(block, yaml.MappingNode):
            continue
        for dup in duplicates_in(block.value):
            repeated.append(RepeatedKey(DuplicateKey(dup.key, dup.first_line, dup.line, ("defaults",)),
                                        disputed=(dup.key,)))
        for k, v in block.value:
            inner = first_duplicate(v)
            if inner is not None and isinstance(k, yaml.ScalarNode):
                trail = ("defaults", str(k.value)) + inner.trail
                repeated.append(RepeatedKey(DuplicateKey(inner.key, inner.first_line, inner.line, trail),
                                            disputed=(str(k.value),)))
    if len(defaults) > 1 and all(isinstance(v, yaml.MappingNode) for _, v in defaults):
        set_before, both = set(), []
        for _, block in defaults:
            keys = {k.value for k, _ in block.value if isinstance(k, yaml.ScalarNode)}
            both += sorted(keys & set_before)
            set_before |= keys
        advice = "put the defaults under one 'defaults:'" + (f" (both set {', '.join(both)})" if both else
                                                             " (their keys are joined)")
        repeated.append(RepeatedKey(DuplicateKey("defaults", defaults[0][0].start_mark.line + 1,
                                                 defaults[1][0].start_mark.line + 1),
                                    advice=advice, disputed=tuple(both)))
        _join(root, defaults, yaml.MappingNode, [pair for _, v in defaults for pair in v.value])
    elif len(defaults) > 1:
        repeated.append(RepeatedKey(DuplicateKey("defaults", defaults[0][0].start_mark.line + 1,
                                                 defaults[1][0].start_mark.line + 1),
                                    advice="put the defaults under one 'defaults:' mapping", disputed=("*",)))
    return repeated


def _join(root, pairs, node_class, value):
    """Replace the repeated top-level `pairs` by the first key holding all their values."""
    (key, first), last = pairs[0], pairs[-1][1]
    joined = node_class(first.tag, value, first.start_mark, last.end_mark, flow_style=first.flow_style)
    dropped = {id(k) for k, _ in pairs[1:]}
    root.value = [(k, joined if k is key else v) for k, v in root.value if id(k) not in dropped]


def _key_lines(node):
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _graph_item_lines(node):
    """YAML line of each item of a case's `graph:` list, so an error names its own line."""
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "graph" and isinstance(v, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in v.value]
    return []


def _equivalent_lines(node):
    """formulation name -> (line of its key, [line of each item of its list]) of `equivalent:`."""
    out = {}
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "equivalent" and isinstance(v, yaml.MappingNode):
            for fk, fv in v.value:
                if isinstance(fk, yaml.ScalarNode):
                    items = [item.start_mark.line + 1 for item in fv.value] if isinstance(fv, yaml.SequenceNode) else []
                    out[fk.value] = (fk.start_mark.line + 1, items)
    return out


def load_file(path, session_backends=("cpu",), builtin=False, text=None, declared_ops=None):
    """-> (list of LoadedCase, list of CaseError). Never raises for bad content. declared_ops:
    {name: prototype} declared from Python (the pytest_gradgate_ops hook), as if the file's
    top-level `ops:` held them too (its own entry of a name wins)."""
    path = Path(path)
    try:
        raw_bytes = path.read_bytes() if text is None else None
    except OSError as exc:
        return [], [CaseError(f"cannot read case file: {exc.strerror}", path)]
    if raw_bytes is not None:
        try:
            text = raw_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw_bytes[:exc.start].count(b"\n") + 1
            column = exc.start - raw_bytes.rfind(b"\n", 0, exc.start)
            return [], [CaseError(f"not UTF-8 text: byte 0x{raw_bytes[exc.start]:02x} at column {column}; "
                                  "save the file as UTF-8", path, line)]
    too_big = shape_error(text, path)    # before libyaml builds it: see yaml_shape.py
    if too_big is not None:
        return [], [too_big]
    try:
        root, data, repeated = _parse(text, _join_repeated_top_keys)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [CaseError(f"YAML syntax error: {problem}", path, mark.line + 1 if mark else None)]
    except (RecursionError, MemoryError) as exc:
        return [], [CaseError(f"the YAML is nested too deeply or too large to read ({type(exc).__name__})", path, 1)]
    if not isinstance(data, dict) or "cases" not in data:
        return [], [CaseError("a case file must be a mapping with a 'cases:' list", path, 1)]
    unknown_top = set(data) - {"cases", "defaults", "ops"}
    if unknown_top:
        return [], [CaseError(f"unknown top-level key(s) {sorted(unknown_top)}; expected 'cases' (and 'defaults', "
                              "'ops')",
                              path, 1)]
    top_lines = _key_lines(root)
    if not isinstance(data["cases"], list):
        return [], [CaseError("'cases' must be a list of case mappings", path, top_lines.get("cases"))]
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        return [], [CaseError("'defaults' must be a mapping of case keys (e.g. eps: 0.1)", path,
                              top_lines.get("defaults"))]
    case_nodes = next(v for k, v in root.value if k.value == "cases").value
    loaded, errors, seen = [], [], {}
    file_ops, op_errors, op_lines = _declared_ops(data.get("ops"), root, path, top_lines.get("ops"))
    if declared_ops:
        file_ops = {**{k: v for k, v in declared_ops.items() if k not in op_errors}, **file_ops}
    in_doubt = {key: [] for r in repeated for key in r.disputed}   # key -> cases left out for it
    for raw, node in zip(data["cases"], case_nodes):
        line = node.start_mark.line + 1
        try:
            if not isinstance(raw, dict):
                raise CaseError("each case must be a mapping (name:, params:, graph:, ...)", path, line)
            duplicate = first_duplicate(node)
            if duplicate is not None:
                raise CaseError(duplicate.describe(), path, duplicate.line)
            doubtful = [k for k in in_doubt if k == "*" or (k in defaults and k not in raw)]
            if doubtful:    # its value of a key the defaults set twice: one error says so, below
                for k in doubtful:
                    in_doubt[k].append(str(raw.get("name", f"the case at line {line}")))
                continue
            merged = {**defaults, **raw}
            if file_ops and isinstance(raw, dict) and "ops" not in raw:
                merged["ops"] = dict(file_ops)
            key_lines = _key_lines(node) if isinstance(node, yaml.MappingNode) else {}
            key_lines["graph lines"] = _graph_item_lines(node) if isinstance(node, yaml.MappingNode) else []
            key_lines["equivalent lines"] = _equivalent_lines(node) if isinstance(node, yaml.MappingNode) else {}
            name = merged.get("name")
            if not isinstance(name, str):
                raise CaseError(f"'name' must be a string, got {name!r}", path, key_lines.get("name", line))
            if name in seen:
                raise CaseError(f"duplicate case name '{name}' (first declared on line {seen[name]})", path,
                                key_lines.get("name", line))
            if file_ops and "ops" not in raw:   # where each op is declared, for errors found later
                key_lines["op lines"] = {name: op_lines.get(name, line) for name in file_ops}
            variants = vary.expand(merged, (path, key_lines.get("vary", line)))
            if variants == [merged]:
                loaded.append(LoadedCase(name, path, line,
                                         build_cases(merged, path, line, key_lines, session_backends, builtin)))
                seen[name] = line
                continue
            seen[name] = line
            for variant in variants:    # each combination of a `vary` entry loads (or fails) on its own
                try:
                    cases = build_cases(variant, path, line, key_lines, session_backends, builtin)
                except CaseError as exc:
                    errors.append(CaseError(f"{variant['name']}: {exc.args[0]}", exc.path or path, exc.line or line))
                    continue
                loaded.append(LoadedCase(variant["name"], path, line, cases))
        except CaseError as exc:
            if exc.path is None:
                exc.path, exc.line = path, line
            broken = _broken_op_used(raw, op_errors)
            if broken is not None:   # said once, at the op's line
                op_errors[broken][1].append(raw.get("name") if isinstance(raw.get("name"), str) else f"line {line}")
            else:
                errors.append(exc)
        except (RecursionError, MemoryError) as exc:
            errors.append(CaseError(f"the case is too large or nested too deeply to check ({type(exc).__name__}); "
                                    "split its graph into smaller cases", path, line))
        except (TypeError, ValueError, ArithmeticError) as exc:
            # a value of a shape no check above foresaw: still one error at this case's line,
            # never a traceback that loses the file's other cases
            errors.append(CaseError(f"invalid case ({type(exc).__name__}: {exc}); see `gradgate ops` "
                                    "and pytest_gradgate/declare/cases.schema.json for the format", path, line))
    for error, users in op_errors.values():
        if users:
            error.args = (f"{error.args[0]} (not loaded because of it: {', '.join(users)})",)
        errors.append(error)
    return loaded, [_repeated_key_error(r, in_doubt, path) for r in repeated] + errors


def _repeated_key_error(repeated, in_doubt, path):
    left_out = sorted({name for key in repeated.disputed for name in in_doubt.get(key, ())})
    text = repeated.duplicate.describe(repeated.advice)
    if left_out:
        text += f"; the cases that take it from the defaults are not loaded until it is fixed: {', '.join(left_out)}"
    return CaseError(text, path, repeated.duplicate.line)


OP_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")


def _declared_ops(ops, root, path, line):
    """A file's `ops:` -> ({name: prototype} of those that parse, {name: (CaseError, [cases it
    keeps from loading])} of those that do not, each error at its own line, {name: line}).
    An op's `ranges:` are for explore alone (explore/declared.py); checked here, so that a bad
    one is an error at its line in either."""
    from pytest_gradgate.ops.declared import check_ranges, parse_prototype
    from pytest_gradgate.ops.table import OPS
    if ops is None:
        return {}, {}, {}
    if not isinstance(ops, dict):
        return {}, {"": (CaseError("'ops' must map op names to {c: \"<C prototype>\"}", path, line), [])}, {}
    node = next(v for k, v in root.value if k.value == "ops")
    lines = _key_lines(node) if isinstance(node, yaml.MappingNode) else {}
    good, bad = {}, {}
    for name, spec in ops.items():
        where = (path, lines.get(name, line))
        try:
            if not isinstance(name, str) or not OP_NAME_RE.match(name):
                raise CaseError(f"op name {clip(repr(name))} must be lowercase letters, digits and _", *where)
            if name in OPS:
                raise CaseError(f"op '{name}' is an op of the built-in table (see `gradgate ops`); give the "
                                "declared op a name of its own", *where)
            if not isinstance(spec, dict) or "c" not in spec or set(spec) - {"c", "ranges"}:
                raise CaseError(f"op '{name}' must be {{c: \"<C prototype>\"}}, and optionally ranges: {{arg: [lo, hi]}}",
                                *where)
            check_ranges(parse_prototype(name, spec["c"]), spec.get("ranges"))
            good[name] = spec["c"].strip()
        except CaseError as exc:
            if exc.path is None:
                exc.path, exc.line = where
            bad[name] = (exc, [])
    return good, bad, lines


def _broken_op_used(raw, op_errors):
    """The broken declared op a case's graph calls, if any."""
    if not op_errors or not isinstance(raw, dict):
        return None
    text = str(raw.get("graph", "")) + str(raw.get("equivalent", ""))
    return next((name for name in op_errors if name and re.search(rf"\b{name}\s*\(", text)), None)


def _looks_like_a_number(value):
    try:
        float(value)
        return isinstance(value, str)
    except (TypeError, ValueError):
        return False


# The largest values the keys take: beyond them a case is a typo, and a number no check stops
# ends as a worker's traceback (a timeout the clock cannot add, a seed the exported C++ test's
# std::mt19937 cannot take, more threads than ggml's GGML_MAX_N_THREADS)
MAX_TIMEOUT_S = 86400.0
MAX_SEED = 2**32 - 1
MAX_THREADS = 512
MAX_DIRECTIONS = 10_000
MAX_INIT_MAGNITUDE = 1e30       # beyond it the SQR loss of float32 values overflows


def _number(value, key, where, positive=True, maximum=None):
    if _looks_like_a_number(value):
        # YAML 1.1 (PyYAML) reads 1e-4, without a dot, as a string
        raise CaseError(f"'{key}' is the string {value!r} to YAML, not a number; write it with a dot and a "
                        f"signed exponent, e.g. {float(value):.1e}".replace("e-0", "e-").replace("e+0", "e+"), *where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise CaseError(f"'{key}' must be a positive number, got {value!r}", *where)
    if not math.isfinite(value):
        raise CaseError(f"'{key}' must be a finite number, got {value!r}", *where)
    if maximum is not None and value > maximum:
        raise CaseError(f"'{key}' must be a positive number up to {maximum:g}, got {value!r}", *where)
    return float(value)


def _integer(value, key, where, minimum=0, maximum=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        valid = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise CaseError(f"'{key}' must be an integer {valid}, got {value!r}", *where)
    return value


def _is_range(value):
    return (isinstance(value, list) and len(value) == 2 and
            all(isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= MAX_INIT_MAGNITUDE
                for x in value) and value[0] < value[1])


INIT_HELP = (f"[lo, hi] (uniform) or {{abs: [lo, hi]}} (uniform magnitude, random sign), lo < hi, both finite "
             f"numbers within +-{MAX_INIT_MAGNITUDE:g}")
INPUT_INITS = ("causal_mask", "probs")


def _check_init(init, what, where, named=()):
    ok = _is_range(init) or (isinstance(init, dict) and set(init) == {"abs"} and _is_range(init["abs"])
                             and init["abs"][0] >= 0) or init in named
    if not ok:
        extra = f", or one of {', '.join(named)}" if named else ""
        raise CaseError(f"{what}: init must be {INIT_HELP}{extra}; got {init!r}", *where)


def _names(value, key, known, where, what):
    """A name or a non-empty list of names, each among `known`."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise CaseError(f"'{key}' must be a name or a non-empty list of names among: {', '.join(known)}", *where)
    for n in names:
        if n not in known:
            raise CaseError(f"unknown {what} '{n}'; known: {', '.join(known)}", *where)
    return names


def _names_read(lines):
    return {node.name for node in nodes(lines) if isinstance(node, Ref)}


def _check_params_used(lines, params, where, what=""):
    """Every param must reach the graph: ggml refuses a graph with no trainable parameters
    (an abort), and an unused one would be reported as checked when nothing checked it."""
    unused = [p for p in params if p not in _names_read(lines)]
    if len(unused) == len(params):
        raise CaseError(f"{what}the graph uses none of the params ({', '.join(params)}): ggml has no gradient "
                        "to compute; use them in the graph, or declare constants under inputs", *where)
    if unused:
        raise CaseError(f"{what}param(s) {', '.join(unused)} not used by the graph: remove them, or use them", *where)


def build_cases(raw, path, line, key_lines=None, session_backends=("cpu",), builtin=False):
    """Validate one case mapping and expand it over consumers x losses x backends."""
    key_lines = key_lines or {}

    def at(key):
        return (path, key_lines.get(key, line))

    unknown = [k for k in raw if k not in CASE_KEYS]
    if unknown:
        raise CaseError(f"unknown key '{unknown[0]}'; a case may have: {', '.join(CASE_KEYS)}", *at(unknown[0]))
    for required in ("name", "params"):
        if required not in raw:
            raise CaseError(f"missing key '{required}' ({CASE_KEYS[required]})", path, line)
    if "graph" not in raw and "equivalent" not in raw:
        raise CaseError(f"missing key 'graph' ({CASE_KEYS['graph']}), or 'equivalent' ({CASE_KEYS['equivalent']})",
                        path, line)
    if "graph" in raw and "equivalent" in raw:
        raise CaseError("a case has either 'graph' (checked against finite differences) or 'equivalent' "
                        "(formulations checked against each other), not both", *at("equivalent"))
    if "equivalent" in raw:
        for key in FINITE_DIFFERENCE_KEYS:
            if key in raw:
                raise CaseError(f"'{key}' has no meaning in an equivalence case: it computes no finite differences "
                                "(its limit comes from the f32 roundoff of the formulations); remove it", *at(key))
    name = raw["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CaseError(f"name {name!r} must be letters, digits, _ . or -", *at("name"))
    params = raw["params"]
    if not isinstance(params, dict) or not params:
        raise CaseError("'params' must map at least one name to a shape, e.g. a: [4, 3]", *at("params"))
    for kind, names in (("param", params), ("input", raw.get("inputs") or {})):
        for tname in names if isinstance(names, dict) else ():
            if not isinstance(tname, str) or not TENSOR_NAME_RE.match(tname):
                raise CaseError(f"{kind} name {clip(repr(tname))} must be an identifier (letters, digits and _, "
                                "not starting with a digit, at most 64): graph expressions refer to it by name",
                                *at("params" if kind == "param" else "inputs"))
    for pname, shape in params.items():
        if (not isinstance(shape, list) or not 1 <= len(shape) <= 4 or
                not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
            raise CaseError(f"param '{pname}': shape must be a list of 1 to 4 positive integers (ne0 first), "
                            f"got {shape!r}", *at("params"))
    inputs = raw.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise CaseError("'inputs' must map names to {type:, values:} or {type:, shape:, init:}", *at("inputs"))
    for iname, spec in inputs.items():
        if not isinstance(spec, dict) or set(spec) - INPUT_KEYS or ("values" not in spec and "shape" not in spec):
            raise CaseError(f"input '{iname}' must be {{type: i32|f32, values: [...]}} or "
                            "{type: f32, shape: [...], init: ...}", *at("inputs"))
        kind = spec.get("type", "f32")
        if kind not in ("i32", "f32"):
            raise CaseError(f"input '{iname}': type must be i32 or f32, got {kind!r}", *at("inputs"))
        shape = spec.get("shape")
        if shape is not None and (not isinstance(shape, list) or not 1 <= len(shape) <= 4 or
                                  not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
            raise CaseError(f"input '{iname}': shape must be a list of 1 to 4 positive integers, got {shape!r}",
                            *at("inputs"))
        if "values" in spec:
            values = spec["values"]
            number = int if kind == "i32" else (int, float)
            if not isinstance(values, list) or not values or not all(
                    isinstance(v, number) and not isinstance(v, bool) for v in values):
                raise CaseError(f"input '{iname}': values must be a non-empty list of "
                                f"{'integers' if kind == 'i32' else 'numbers'}", *at("inputs"))
            if kind == "i32" and not all(-2**31 <= v < 2**31 for v in values):
                raise CaseError(f"input '{iname}': i32 values must be from {-2**31} to {2**31 - 1}, got "
                                f"{next(v for v in values if not -2**31 <= v < 2**31)}", *at("inputs"))
            if shape is not None and len(values) != prod(shape):
                raise CaseError(f"input '{iname}': {len(values)} values do not fill shape {shape} "
                                f"({prod(shape)} elements)", *at("inputs"))
        elif kind == "i32":
            raise CaseError(f"input '{iname}': an i32 input needs its values (row indices, positions)",
                            *at("inputs"))
        if "init" in spec:
            _check_init(spec["init"], f"input '{iname}'", at("inputs"), INPUT_INITS)
    clash = set(params) & set(inputs)
    if clash:
        raise CaseError(f"{sorted(clash)} declared both as params and inputs", *at("inputs"))

    consumers = _names(raw.get("consumers", list(DEFAULT_CONSUMERS)), "consumers", list(CONSUMERS), at("consumers"), "consumer")
    # a case that picks its consumers has picked its layouts: producers then default to none
    # and an equivalence case compares its formulations over the params as declared: the
    # producer self-check and forward check belong to the finite-difference engine
    default_producers = list(DEFAULT_PRODUCERS) if "consumers" not in raw and "equivalent" not in raw else ["none"]
    producers = _names(raw.get("producers", default_producers), "producers", list(PRODUCERS), at("producers"),
                       "producer")
    if "equivalent" in raw and producers != ["none"]:
        raise CaseError(f"producers {producers} on an equivalence case: its formulations are compared over the "
                        "params as declared; drop 'producers' (or check the op through producers in a case "
                        "with 'graph')", *at("producers"))
    losses = _names(raw.get("loss", "sqr"), "loss", list(LOSSES), at("loss"), "loss")
    eps = _number(raw.get("eps", DEFAULT_EPS), "eps", at("eps"))
    max_maa = _number(raw.get("max_maa", DEFAULT_MAX_MAA), "max_maa", at("max_maa"))
    if max_maa >= 1:
        raise CaseError(f"'max_maa' {max_maa} would pass anything (MAA of unrelated gradients is about 1); "
                        "use a value below 1, e.g. 1e-4", *at("max_maa"))
    stencil = raw.get("stencil", DEFAULT_STENCIL)
    if stencil not in (2, 4):
        raise CaseError(f"'stencil' must be 2 or 4, got {stencil!r}", *at("stencil"))
    mode = raw.get("mode", "full")
    if mode not in ("full", "fast"):
        raise CaseError(f"'mode' must be full or fast, got {mode!r}", *at("mode"))
    wanted = raw.get("backends")
    if wanted is not None:
        wanted = _names(wanted, "backends", list(BACKENDS), at("backends"), "backend")
    backends = [b for b in session_backends if wanted is None or b in wanted]
    seed = _integer(raw.get("seed", 0), "seed", at("seed"), maximum=MAX_SEED)
    directions = _integer(raw.get("directions", 6), "directions", at("directions"), minimum=1,
                          maximum=MAX_DIRECTIONS)
    timeout = (_number(raw["timeout"], "timeout", at("timeout"), maximum=MAX_TIMEOUT_S) if "timeout" in raw
               else 0.0)
    threads = _integer(raw.get("threads", DEFAULT_THREADS), "threads", at("threads"), minimum=1,
                       maximum=MAX_THREADS)
    init = raw.get("init") or {}
    if not isinstance(init, dict):
        raise CaseError(f"'init' must map param names to {INIT_HELP}", *at("init"))
    for pname, spec in init.items():
        if pname not in params:
            raise CaseError(f"init names '{pname}', which is not a param (params: {', '.join(params)})", *at("init"))
        _check_init(spec, f"param '{pname}'", at("init"))

    declared = _case_ops(raw.get("ops"), at("ops"))
    if declared and "equivalent" in raw:
        raise CaseError("declared ops in an equivalence case are not supported: check the op with 'graph'",
                        *at("ops"))
    template = Case(name=name, graph=raw.get("graph", ""), params=params, inputs=inputs, init=init, ops=declared,
                    eps=eps, stencil=stencil, max_maa=max_maa, seed=seed, mode=mode,
                    directions=directions, timeout=timeout, threads=threads,
                    builtin=builtin, origin={"path": str(path), "line": line,
                                             **({"op_lines": key_lines["op lines"]} if key_lines.get("op lines") else {})})
    if "equivalent" in raw:
        template, out_shape = _equivalent_template(raw["equivalent"], template, at, key_lines, path)
    else:
        out_shape = _check_graph(raw["graph"], template, at("graph"), key_lines.get("graph lines") or [], at)
    if declared:   # only the ops the graph calls travel with its cases
        called = set(ops_used(parse_graph(template.graph)))
        template = dataclasses.replace(template, ops={k: v for k, v in declared.items() if k in called})
    for c in consumers if not isinstance(out_shape, OpenShape) else ():   # else: the worker checks
        why = check_consumer(c, out_shape)
        if why:
            raise CaseError(f"consumer '{c}' cannot read this output: {why}", *at("consumers"))
    shapes = {p: ne4(shape) for p, shape in params.items()}
    if "producers" in raw:
        for pr in producers:
            if pr != "none" and not laid_out_params(pr, shapes):
                raise CaseError(f"producer '{pr}' lays out none of the params differently (shapes "
                                f"{', '.join(f'{p} {list(s)}' for p, s in params.items())}): "
                                f"{PRODUCERS[pr].doc}; drop it or change the shapes", *at("producers"))
    else:   # the default set: only the producers that change some param's layout
        producers = [pr for pr in producers if pr == "none" or laid_out_params(pr, shapes)]
    layouts = []
    for pr in producers:
        if pr == "none":
            layouts += [("none", c) for c in consumers]
        elif "none" in consumers:   # one layout at a time: the gradient arrives contiguous
            layouts.append((pr, "none"))
        else:                       # the case asks for non-contiguous consumers only
            layouts += [(pr, c) for c in consumers]
    cases = []
    for pr, c in layouts:
        for lo in losses:
            for b in backends:
                case = Case(**{**template.to_dict(), "producer": pr, "consumer": c, "loss": lo, "backend": b})
                cases.append(case)
    return cases


def _case_ops(ops, where):
    """A case's `ops` (name -> prototype, or name -> {c: prototype[, ranges]}) -> {name: prototype}."""
    from pytest_gradgate.ops.declared import check_ranges, parse_prototype
    from pytest_gradgate.ops.table import OPS
    if not ops:
        return {}
    if not isinstance(ops, dict):
        raise CaseError("'ops' must map op names to C prototypes", *where)
    out = {}
    for name, spec in ops.items():
        text = spec.get("c") if isinstance(spec, dict) else spec
        if name in OPS:
            raise CaseError(f"op '{name}' is an op of the built-in table; give the declared op a name of its own",
                            *where)
        try:
            check_ranges(parse_prototype(name, text), spec.get("ranges") if isinstance(spec, dict) else None)
        except CaseError as exc:
            raise CaseError(str(exc), *where) from None
        out[name] = text.strip()
    return out


def _check_graph(graph, template, where, item_lines, at, what=""):
    """Parse one graph and infer its output shape, every error at its own YAML line."""
    try:
        lines = parse_graph(graph)
    except CaseError as exc:
        raise CaseError(what + str(exc), *where) from None
    _check_params_used(lines, template.params, at("params") if not what else where, what)
    try:
        return infer_shapes(dataclasses.replace(template, graph=graph))
    except CaseError as exc:
        # point at the offending line of a multi-line graph, else at the graph's key
        if exc.graph_line and isinstance(graph, list) and exc.graph_line <= len(item_lines):
            where = (where[0], item_lines[exc.graph_line - 1])
        raise CaseError(what + str(exc), *where) from None


def _equivalent_template(formulations, template, at, key_lines, path):
    """An equivalence case: every formulation parses, uses every param and gives one output
    shape (a mismatch would be found only in the worker, as a comparison of unlike things)."""
    if (not isinstance(formulations, dict) or len(formulations) < 2 or
            not all(isinstance(v, (str, list)) for v in formulations.values())):
        raise CaseError("'equivalent' must map two or more formulation names to graphs, e.g. "
                        "{chunked: [...lines...], whole: [...lines...]}", *at("equivalent"))
    lines_of = key_lines.get("equivalent lines") or {}
    shapes, graphs = {}, {}
    for fname, graph in formulations.items():
        key_line, item_lines = lines_of.get(fname, (at("equivalent")[1], []))
        if not isinstance(fname, str) or not TENSOR_NAME_RE.match(fname):
            raise CaseError(f"formulation name {clip(repr(fname))} must be an identifier (letters, digits and _)",
                            path, key_line)
        shapes[fname] = _check_graph(graph, template, (path, key_line), item_lines, at,
                                     what=f"formulation '{fname}': ")
        graphs[fname] = graph
    first = next(iter(shapes))
    for fname, shape in shapes.items():
        if shape != shapes[first]:
            raise CaseError(f"formulation '{fname}' gives an output of shape {list(shape)}, '{first}' gives "
                            f"{list(shapes[first])}: equivalent formulations must produce the same output",
                            path, lines_of.get(fname, (at("equivalent")[1],))[0])
    case = dataclasses.replace(template, graph=graphs[first], equivalent=graphs, mode="equivalence")
    return case, shapes[first]
