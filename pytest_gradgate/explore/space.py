"""The search space: Hypothesis strategies that draw case mappings from the op table.

A draw is a plain mapping, exactly what a case file holds (name, params, inputs, init, graph,
consumers, loss, threads, seed), so a finding is pasted into a case file as it was run. Every
draw is validated by the YAML loader (declare/loader.py build_cases); one it refuses (a shape
the op cannot take) is rejected, not run.

Where the axes come from, so that adding an op, a consumer or a loss adds it to the search:
- ops: ops/table.py OPS, and the ops a case file declares (explore/declared.py). An op gets its
  other tensors and its parameters from ARGUMENTS when it has an entry there (ops whose
  arguments are tied to the input's shape: mul_mat's ne0, concat's other dims, repeat's
  multiples, ...); otherwise the generic drawer gives every other
  tensor the input's shape and every parameter its default (a required one a small value of its
  kind), and the loader rejects what does not fit. A declared op has no shape function: its
  other tensors get the input's shape, a broadcast of it or a shape of their own, its scalars a
  value in the op's `ranges:` (or a few plain ones), ggml refuses what does not fit, and it is a
  chain's last op (its output's shape is known only in the worker).
- consumers: ops/consumers.py CONSUMERS; losses: ops/losses.py LOSSES (without `sum`, which is
  blind by design); threads: 1 to 4 (the default first, so a shrunk case omits it).
- producers: ops/producers.py PRODUCERS, each only where it lays out some param differently.

Every strategy lists its simplest value first: Hypothesis shrinks towards it, so a shrunk case
has one op, consumer `none`, loss `sqr`, small shapes, default parameters, unless the failure
needs more.

Values are drawn where finite differences are evidence: SAFE_INIT keeps the inputs of ops with
a kink, pole or restricted domain away from it (log and sqrt positive, div's divisor away from
0, relu/abs/sgn/step away from 0). Any other op's first param has mixed signs half the time and
one sign (VALUE_RANGES) the other half: a max-pool window whose values are all negative was a
bug no mixed draw met. One draw in four has a first param whose rows are at, one short of or one
past a SIMD step of the tree's CPU kernels (library/kernel_steps.py: 7 to 65 elements on ggml 0.15.3);
the others' sizes are 1 to 5. What is left unreliable the engine's numeric-reliability check vetoes
(status numeric-unreliable), and search.py discards those draws. rope_ext draws YaRN's
parameters half the time.
"""

import itertools

from hypothesis import strategies as st

from pytest_gradgate.declare.case import DEFAULT_THREADS, Case
from pytest_gradgate.ops.consumers import CONSUMERS
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.producers import PRODUCERS, laid_out_params
from pytest_gradgate.ops.table import OPS, ne4

MAX_DIM = 5             # each size 1..5: small cases are fast and shrink well
MAX_CHAIN = 2           # ops per drawn graph (the second consumes the first's output)
ROW_AT_STEP_ONE_IN = 4  # one draw in this many has a first param whose ne0 is at a SIMD step
THREADS = (DEFAULT_THREADS, 1, 2, 4)
SEEDS = 4               # seeds of the inputs' values per case (the case's `seed:`)
BLIND_LOSSES = ("sum",)

# ops whose output is a view of their input (strides other than a contiguous tensor's)
VIEW_OPS = ("transpose", "permute", "view")

# ops whose output cannot reach the loss alone: -inf entries; exp or soft_max makes them 0
FOLLOWED_BY = {"diag_mask_inf": ("exp", "soft_max")}

# value ranges of the op's first input, where an op has a kink, pole or restricted domain
SAFE_INIT = {
    "log": [0.5, 2.0], "sqrt": [0.5, 2.0],
    "abs": {"abs": [0.25, 1.0]}, "sgn": {"abs": [0.25, 1.0]}, "step": {"abs": [0.25, 1.0]},
    "relu": {"abs": [0.25, 1.0]}, "clamp": {"abs": [0.25, 0.75]},
}
SAFE_INIT_OTHER = {"div": {"b": {"abs": [0.5, 1.5]}}}
# the first param's values when not mixed (issue 53: the suite's draws were too kind)
VALUE_RANGES = {"negative": [-2.0, -0.5], "positive": [0.5, 2.0]}


def producers():
    """The producer axis: the names of ops/producers.py."""
    return tuple(PRODUCERS)


def explorable_ops(names=None, declared=None):
    """Ops to search: of the table and `declared` (explore/declared.py), all by default; unknown
    names are a ValueError."""
    known = tuple(OPS) + tuple(declared or ())
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown op(s) {', '.join(unknown)}; see `gradgate ops`, or declare the op (a case file "
                             "given with --cases or --gradgate-cases, or the pytest_gradgate_ops hook)")
        return tuple(names)
    return known


# --- arguments of ops whose other tensors and parameters are tied to the input's shape ---
# each: (draw, a: the input's ne4, names) -> (tensors {name: tensor spec}, kwargs {name: value})
# a tensor spec is ("param", shape) or ("input", {type, shape/values, init}[, the input's name])
ARGUMENTS = {}


def arguments(*names):
    def register(fn):
        for name in names:
            ARGUMENTS[name] = fn
        return fn
    return register


def _dims(a):
    """a's shape as the case writes it: trailing 1s dropped (at least one size)."""
    a = list(a)
    while len(a) > 1 and a[-1] == 1:
        a.pop()
    return a


@arguments("add", "sub", "mul", "div")
def _broadcast(draw, a):
    # b is a's shape, or broadcast (1) along some dims
    keep = draw(st.lists(st.booleans(), min_size=4, max_size=4).map(lambda bs: [not b for b in bs]))
    return {"b": ("param", _dims([n if k else 1 for n, k in zip(a, keep)]))}, {}


@arguments("add1")
def _add1(draw, a):
    return {"b": ("param", [1])}, {}


@arguments("acc", "set")
def _into(draw, a):
    b = [draw(st.integers(1, n)) for n in a]
    return {"b": ("param", _dims(b))}, {"offset": draw(st.integers(0, 3))}


@arguments("repeat")
def _repeat(draw, a):
    # a repeat along each dim two draws in three: the suite repeats along ne0 and ne2 only,
    # and a backward that mishandles one dim shows only when that dim repeats
    return {}, {"shape": [n * draw(st.sampled_from([1, 2, 2])) for n in a]}


@arguments("repeat_back")
def _repeat_back(draw, a):
    return {}, {"shape": [n if draw(st.booleans()) is False else 1 for n in a]}


@arguments("rms_norm", "norm")
def _eps(draw, a):
    # the default first (what a case shrinks to), then eps values the suite never uses
    return {}, {"eps": draw(st.sampled_from([1e-6, 1e-3, 1e-2, 1e-1, 1.0]))}


@arguments("scale")
def _scale(draw, a):
    # negative factors two draws in three: the suite's scale case uses s = 0.7 only
    return {}, {"s": draw(st.sampled_from([0.7, -0.7, 2.0, -2.0, -1.0, 0.5, -1.5, -0.5, 1.5]))}


@arguments("mul_mat")
def _mul_mat(draw, a):
    # b shares ne0; b's batch dims are multiples of a's
    b = [a[0], draw(st.integers(1, MAX_DIM)), a[2] * draw(st.integers(1, 2)), a[3] * draw(st.integers(1, 2))]
    return {"b": ("param", _dims(b))}, {}


@arguments("out_prod")
def _out_prod(draw, a):
    return {"b": ("param", _dims([draw(st.integers(1, MAX_DIM)), a[1], a[2], a[3]]))}, {}


@arguments("cpy")
def _cpy(draw, a):
    order = draw(st.permutations(range(4)))
    return {"b": ("param", _dims([a[i] for i in order]))}, {}


@arguments("reshape")
def _reshape(draw, a):
    order = draw(st.permutations(range(4)))
    return {}, {"shape": [a[i] for i in order]}


@arguments("view")
def _view(draw, a):
    ne = [draw(st.integers(1, n)) for n in a]
    return {}, {"ne": ne, "offset": draw(st.integers(0, 2))}


@arguments("permute")
def _permute(draw, a):
    return {}, {"axes": list(draw(st.permutations(range(4))))}


@arguments("get_rows")
def _get_rows(draw, a):
    rows = draw(st.lists(st.integers(0, a[1] - 1), min_size=1, max_size=6))
    return {"rows": ("input", {"type": "i32", "values": rows})}, {}


@arguments("diag_mask_inf", "diag_mask_zero")
def _diag_mask(draw, a):
    return {}, {"n_past": draw(st.integers(0, 2))}


@arguments("soft_max_ext")
def _soft_max_ext(draw, a):
    return {}, {"scale": draw(st.sampled_from([1.0, 0.5, 2.0, -1.0])),
                "max_bias": draw(st.sampled_from([0.0, 0.0, 8.0]))}


@arguments("rope_ext")
def _rope(draw, a):
    pos = draw(st.lists(st.integers(0, 9), min_size=a[2], max_size=a[2]))
    n_dims = 2 * draw(st.integers(1, max(1, a[0] // 2)))
    kwargs = {"n_dims": n_dims, "mode": draw(st.sampled_from([0, 2]))}
    if draw(st.booleans()):
        kwargs["freq_scale"] = draw(st.sampled_from([0.5, 0.25]))
    if draw(st.booleans()):
        # YaRN context extension, as long-context fine-tunes train with it: the ramp between
        # beta_fast and beta_slow and the magnitude correction only act when ext_factor != 0
        kwargs.update(n_ctx_orig=draw(st.sampled_from([8, 16])), ext_factor=draw(st.sampled_from([0.5, 1.0])),
                      attn_factor=draw(st.sampled_from([1.0, 1.3])), beta_fast=draw(st.sampled_from([32.0, 4.0])),
                      beta_slow=draw(st.sampled_from([1.0, 2.0])))
    return {"pos": ("input", {"type": "i32", "values": pos})}, kwargs


@arguments("rope_multi")
def _rope_multi(draw, a):
    # 4 positions per token; sections split the rotated pairs between them (their sum may not
    # pass ne0); vision mode rotates pairs across halves, so n_dims is ne0/2 there
    pos = draw(st.lists(st.integers(0, 9), min_size=4 * a[2], max_size=4 * a[2]))
    mode = draw(st.sampled_from([8, 40, 24]))
    n_dims = a[0] // 2 if mode == 24 else 2 * draw(st.integers(1, max(1, a[0] // 2)))
    sections = [draw(st.integers(1, max(1, n_dims // 2)))] + [draw(st.integers(0, 2)) for _ in range(3)]
    tensors = {"pos": ("input", {"type": "i32", "values": pos})}
    if draw(st.booleans()):
        tensors["freq"] = ("input", {"type": "f32", "shape": [max(1, n_dims // 2)], "init": [1.0, 4.0]})
    return tensors, {"n_dims": n_dims, "sections": sections, "mode": mode}


@arguments("im2col")
def _im2col(draw, a):
    k0, k1 = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kwargs = {"s0": draw(st.integers(1, 2)), "s1": draw(st.integers(1, 2)), "p0": draw(st.integers(0, 1)),
              "p1": draw(st.integers(0, 1)), "d0": draw(st.integers(1, 2)), "d1": draw(st.integers(1, 2))}
    return {"kernel": ("input", {"type": "f32", "shape": _dims([k0, k1, a[2]])})}, kwargs


@arguments("pool_2d")
def _pool(draw, a):
    k0, k1 = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return {}, {"op": draw(st.sampled_from(["avg", "max"])), "k0": k0, "k1": k1,
                "s0": draw(st.integers(1, 3)), "s1": draw(st.integers(1, 3)),
                "p0": float(draw(st.integers(0, 1))), "p1": float(draw(st.integers(0, 1)))}


@arguments("cross_entropy_loss")
def _cross_entropy(draw, a):
    return {"b": ("input", {"type": "f32", "shape": _dims(a), "init": "probs"}, "labels")}, {}


@arguments("concat")
def _concat(draw, a):
    dim = draw(st.integers(0, 3))
    b = list(a)
    b[dim] = draw(st.integers(1, 3))
    return {"b": ("param", _dims(b))}, {"dim": dim}


@arguments("pad")
def _pad(draw, a):
    return {}, {f"p{i}": draw(st.integers(0, 2)) for i in range(4)}


@arguments("win_part")
def _win_part(draw, a):
    return {}, {"w": draw(st.integers(1, 3))}


@arguments("win_unpart")
def _win_unpart(draw, a):
    # a must be [ne0, w, w, windows]: take w = ne1 and an image of w x (w * windows)
    return {}, {"w": a[1], "w0": a[1], "h0": a[1] * a[3]}


@arguments("clamp")
def _clamp(draw, a):
    lo = draw(st.sampled_from([-1.0, -0.5]))
    return {}, {"min": lo, "max": -lo}


def main_tensor(spec):
    """The tensor argument the drawn input (or the previous op's output) goes to: `a` where
    the op has one (im2col's first is the kernel, which only gives a shape), else the first."""
    return "a" if "a" in spec.tensors else spec.tensors[0]


def _generic(spec):
    """Another tensor of the input's shape each; parameters at their defaults, required ones
    a small value of their kind."""
    def draw_args(draw, a):
        tensors = {name: ("param", _dims(a)) for name in spec.tensors if name != main_tensor(spec)}
        kwargs = {}
        for p in spec.params:
            if not p.required:
                continue
            kwargs[p.name] = draw({int: st.integers(1, 3), float: st.sampled_from([0.5, -1.5]), bool: st.booleans(),
                                   str: st.just(""), tuple: st.just(list(a))}[p.kind])
        return tensors, kwargs
    return draw_args


# --- declared ops (explore/declared.py): a fork's own, with no shape function here ---
# A scalar argument without a declared range is drawn from these, the simplest first
DECLARED_FLOATS = (1.0, 0.5, -1.5, 2.0, -0.5)
DECLARED_INTS = (0, 3)


def _scalar(kind, bounds):
    if kind is bool:
        return st.booleans()
    if kind is int:
        lo, hi = bounds or DECLARED_INTS
        return st.integers(int(lo), int(hi))
    if bounds is None:
        return st.sampled_from(DECLARED_FLOATS)
    lo, hi = float(bounds[0]), float(bounds[1])
    # a few plain values of the range first (what a case shrinks to), then any in it
    plain = [v for v in (1.0, 0.5, -1.0, 2.0, lo, hi) if lo <= v <= hi]
    return st.one_of(st.sampled_from(list(dict.fromkeys(plain))),
                     st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=32))


def _other_shape(a):
    """A declared op's other tensor: the input's shape (what most ops take), the input's with some
    sizes 1 (a broadcast), or a shape of its own; ggml's asserts refuse what the op cannot take
    (findings.classify: forward-refused, discarded)."""
    broadcast = st.lists(st.booleans(), min_size=4, max_size=4).map(
        lambda ones: _dims([1 if one else n for n, one in zip(a, ones)]))
    own = st.lists(st.integers(1, MAX_DIM), min_size=1, max_size=4)
    return st.one_of(st.just(_dims(a)), broadcast, own)


def _declared_args(op):
    """The drawer of a declared op: its other tensors' shapes, its scalars in their ranges."""
    from pytest_gradgate.ops.declared import SCALARS, parse_prototype
    parsed = parse_prototype(op["name"], op["c"])
    main = "a" if "a" in parsed.tensors else parsed.tensors[0]

    def draw_args(draw, a):
        tensors = {name: ("param", draw(_other_shape(a))) for name in parsed.tensors if name != main}
        kwargs = {name: draw(_scalar(SCALARS[ctype][0], op["ranges"].get(name))) for name, ctype in parsed.scalars}
        return tensors, kwargs
    return draw_args


def _literal(value):
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


class _Names:
    """Param names a, b, c, ... in the order they appear; inputs keep the op's own name."""

    def __init__(self):
        self.params, self.inputs = {}, {}
        self._letters = iter("abcdefghjkmnpqrstuvw")

    def param(self, shape):
        name = next(self._letters)
        self.params[name] = list(shape)
        return name

    def input(self, base, spec):
        name = base
        for i in itertools.count(2):
            if name not in self.inputs and name not in self.params:
                break
            name = f"{base}{i}"
        self.inputs[name] = spec
        return name


def _call(draw, op_name, first, first_shape, names, init, declared):
    """One op call on `first` (a name or an expression) whose shape is first_shape."""
    if op_name in declared:
        from pytest_gradgate.ops.declared import table_for
        spec = table_for({op_name: declared[op_name]["c"]})[op_name]
        draw_args = _declared_args(dict(declared[op_name], name=op_name))
    else:
        spec = OPS[op_name]
        draw_args = ARGUMENTS.get(op_name) or _generic(spec)
    a = tuple(first_shape) + (1,) * (4 - len(first_shape))
    tensors, kwargs = draw_args(draw, a)
    main = main_tensor(spec)
    args = []
    # optional tensors (rope's freq factors) come after the required ones, when drawn
    for tname in tuple(spec.tensors) + tuple(t for t in spec.optional_tensors if t in tensors):
        if tname == main:
            args.append(first)
            continue
        kind, value, *alias = tensors[tname]
        if kind == "param":
            pname = names.param(value)
            extra = SAFE_INIT_OTHER.get(op_name, {}).get(tname)
            if extra:
                init[pname] = extra
            args.append(pname)
        else:
            args.append(names.input(alias[0] if alias else tname, value))
    args += [f"{k}={_literal(v)}" for k, v in kwargs.items()]
    return f"{op_name}({', '.join(args)})"


@st.composite
def cases(draw, ops, consumers=None, losses=None, threads=THREADS, declared=None, row_lengths=()):
    """Case mappings, as a case file writes them (see the module's docstring). `declared`: the
    declared ops among `ops` (explore/declared.py); a case that calls one declares it (`ops:`), so
    that it loads as it is pasted. `row_lengths`: ne0 values at the CPU kernels' SIMD steps
    (library/kernel_steps.py), drawn for the first param one draw in four."""
    declared = declared or {}
    consumers = tuple(consumers or CONSUMERS)
    losses = tuple(losses or [name for name in LOSSES if name not in BLIND_LOSSES])
    if "none" in consumers:     # the simplest first: what the case shrinks to
        consumers = ("none",) + tuple(c for c in consumers if c != "none")
    # an op with parameters or tied shapes (ARGUMENTS) twice as often as one without: its
    # space is wider than the suite's few points, where a parameter-free op's is its shapes
    first_op = draw(st.sampled_from(tuple(ops) + tuple(op for op in ops if op in ARGUMENTS or op in declared)))
    shape = draw(st.lists(st.integers(1, MAX_DIM), min_size=1, max_size=4))
    long_rows = tuple(n for n in row_lengths if n > MAX_DIM)
    if long_rows and draw(st.integers(0, ROW_AT_STEP_ONE_IN - 1)) == ROW_AT_STEP_ONE_IN - 1:
        # a row at, one short of or one past a SIMD step: an unrolled loop's bug shows only past
        # its step, a tail's only off it; the other dims stay small, since each element of the
        # param costs its own finite differences
        shape = [draw(st.sampled_from(long_rows))] + [min(n, 2) for n in shape[1:]]
    names = _Names()
    init = {}
    a = names.param(shape)
    if first_op in SAFE_INIT:
        init[a] = SAFE_INIT[first_op]
    else:
        # mixed signs (the default, what a case shrinks to) half the draws, else all one sign: a
        # max-pool window of negative values, a mask with nothing to pass (VALUE_RANGES)
        values = draw(st.sampled_from(("mixed", "mixed") + tuple(VALUE_RANGES)))
        if values != "mixed":
            init[a] = VALUE_RANGES[values]
    chain = [first_op]
    follow = FOLLOWED_BY.get(first_op)
    # a declared op's output shape is ggml's to say, in the worker: nothing can be drawn for an
    # op that reads it, so it is a chain's last op
    n_ops = 2 if follow else 1 if first_op in declared else draw(st.integers(1, MAX_CHAIN))
    expr = _call(draw, first_op, a, shape, names, init, declared)
    if n_ops > 1:
        # the second op reads the first's output: its shape comes from the loader's inference
        out = _output_shape(expr, names, init)
        if out is None:
            from hypothesis import reject
            reject()
        second = draw(st.sampled_from(follow or ops))
        chain.append(second)
        if first_op in VIEW_OPS:
            # most forward kernels refuse a non-contiguous input: what a view reaches an op
            # through in a real graph is a cont (an input that arrives as a view is the
            # producer axis's job)
            expr = f"cont({expr})"
        expr = _call(draw, second, expr, _dims(out), names, init, declared)
    case = {"name": "explore_" + "_".join(reversed(chain)), "params": names.params, "graph": expr}
    if any(op in declared for op in chain):
        case["ops"] = {op: declared[op]["c"] for op in dict.fromkeys(chain) if op in declared}
    if names.inputs:
        case["inputs"] = names.inputs
    if init:
        case["init"] = init
    # `none` a third of the draws, a producer other than `none` half: a layout is one axis of
    # several, and a draw whose consumer or producer fails on its own says nothing of the op
    case["consumers"] = [draw(st.sampled_from(_weighted_none(consumers, 2)))]
    loss = draw(st.sampled_from(losses))
    if loss != "sqr":
        case["loss"] = loss
    n_threads = draw(st.sampled_from(threads))
    if n_threads != DEFAULT_THREADS:
        case["threads"] = n_threads
    seed = draw(st.integers(0, SEEDS - 1))
    if seed:
        case["seed"] = seed
    # only producers that lay out some param differently: the loader refuses the others
    kinds = [name for name in producers() if name != "none" and laid_out_params(name, {
        p: ne4(shape) for p, shape in names.params.items()})]
    if kinds:
        producer = draw(st.sampled_from(_weighted_none(["none"] + kinds, 1)))     # none first: what a case shrinks to
        if producer != "none":
            case["producers"] = [producer]
    return case


def _weighted_none(names, others_per_none):
    """names (`none` first, if there) with `none` repeated so that it is one draw in
    1 + others_per_none; the first stays `none`, what Hypothesis shrinks to."""
    names = tuple(names)
    if not names or names[0] != "none":
        return names
    others = names[1:]
    return ("none",) * max(1, -(-len(others) // others_per_none)) + others


def _output_shape(expr, names, init):
    """The output shape of `expr` as the loader infers it, or None if it does not fit."""
    from pytest_gradgate.declare.graph import infer_shapes
    from pytest_gradgate.errors import CaseError
    try:
        return list(infer_shapes(Case(name="shape", graph=expr, params=dict(names.params),
                                      inputs=dict(names.inputs), init=dict(init))))
    except (CaseError, ValueError, TypeError, ArithmeticError):
        return None


def to_cases(mapping, path="<explore>"):
    """The Case(s) a drawn mapping loads as, exactly as from a case file; CaseError if refused."""
    from pytest_gradgate.declare.loader import build_cases
    return build_cases(dict(mapping), path, 0)
