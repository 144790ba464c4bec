"""The op table: every ggml op a graph expression may call. Adding an op is one entry here.

Each entry says which tensor arguments the op takes, which constant parameters (with
defaults), how its output shape follows from its inputs (checked at collection time, so
a shape mismatch is a file:line error, not a GGML_ASSERT in a child process), and how to
build it with ggml. `ggml_op` is the GGML_OP_* (or unary/glu) name, for messages.
"""

from dataclasses import dataclass
from math import prod

F32, I32 = 0, 26            # enum ggml_type values (stable since 2023)
POOL = {"max": 0, "avg": 1}  # enum ggml_op_pool


class ShapeError(ValueError):
    pass


@dataclass(frozen=True)
class Param:
    name: str
    kind: type              # int, float, bool, str or tuple (a list of ints)
    default: object = None
    required: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    ggml_op: str
    tensors: tuple
    params: tuple
    shape: object           # (shapes: dict name -> ne4, p: dict) -> ne4
    build: object           # (g, t: dict name -> tensor*, p: dict) -> tensor*
    optional_tensors: tuple = ()
    note: str = ""


OPS = {}


def op(name, ggml_op, tensors, shape, build, params=(), optional_tensors=(), note=""):
    OPS[name] = OpSpec(name, ggml_op, tuple(tensors), tuple(params), shape, build, tuple(optional_tensors), note)


def ne4(shape):
    shape = tuple(int(x) for x in shape)
    if not 1 <= len(shape) <= 4 or any(x < 1 for x in shape):
        raise ShapeError(f"shape {list(shape)} must have 1 to 4 positive sizes")
    return shape + (1,) * (4 - len(shape))


def _same(s, p, key="a"):
    return s[key]


def _can_repeat(small, big):
    return all(b % a == 0 for a, b in zip(small, big))


def _broadcast(s, p):
    a, b = s["a"], s["b"]
    if not _can_repeat(b, a):
        raise ShapeError(f"b {list(b)} cannot be broadcast to a {list(a)} (each size of a must be a multiple of b's)")
    return a


def _same_shape(s, p):
    if s["a"] != s["b"]:
        raise ShapeError(f"a {list(s['a'])} and b {list(s['b'])} must have the same shape")
    return s["a"]


def _elementwise(fn_name):
    return lambda g, t, p: getattr(g.lib, fn_name)(g.ctx, t["a"])


def _binary(fn_name):
    return lambda g, t, p: getattr(g.lib, fn_name)(g.ctx, t["a"], t["b"])


# --- unary and elementwise ops (output shape = input shape) ---
for _name, _ggml in [("sqr", "SQR"), ("sqrt", "SQRT"), ("log", "LOG"), ("sin", "SIN"), ("cos", "COS"),
                     ("abs", "UNARY(ABS)"), ("sgn", "UNARY(SGN)"), ("neg", "UNARY(NEG)"),
                     ("step", "UNARY(STEP)"), ("relu", "UNARY(RELU)"), ("silu", "UNARY(SILU)"),
                     ("exp", "UNARY(EXP)"), ("expm1", "UNARY(EXPM1)"), ("softplus", "UNARY(SOFTPLUS)"),
                     ("sigmoid", "UNARY(SIGMOID)"), ("tanh", "UNARY(TANH)"), ("gelu", "UNARY(GELU)"),
                     ("dup", "DUP"), ("cont", "CONT")]:
    op(_name, _ggml, ["a"], _same, _elementwise(f"ggml_{_name}"))

for _name, _ggml in [("add", "ADD"), ("sub", "SUB"), ("mul", "MUL"), ("div", "DIV")]:
    op(_name, _ggml, ["a", "b"], _broadcast, _binary(f"ggml_{_name}"),
       note="b is broadcast (repeated) to a's shape")


def _add1_shape(s, p):
    if prod(s["b"]) != 1:
        raise ShapeError(f"add1: b must be a scalar, got {list(s['b'])}")
    return s["a"]


op("add1", "ADD1", ["a", "b"], _add1_shape, _binary("ggml_add1"))


# --- acc / set: write b into a at an element offset, with a's strides ---
def _into_shape(s, p):
    a, b = s["a"], s["b"]
    offset = p["offset"]
    # last element of b, addressed with a's strides, must lie inside a
    strides = (1, a[0], a[0] * a[1], a[0] * a[1] * a[2])
    last = offset + sum((bi - 1) * st for bi, st in zip(b, strides))
    if any(bi > ai for ai, bi in zip(a, b)) or offset < 0 or last >= prod(a):
        raise ShapeError(f"b {list(b)} at element offset {offset} does not fit inside a {list(a)}")
    return a


def _into_build(fn_name):
    def build(g, t, p):
        _, nb = g.layout(t["a"])
        return getattr(g.lib, fn_name)(g.ctx, t["a"], t["b"], nb[1], nb[2], nb[3], p["offset"] * 4)
    return build


for _name, _ggml in [("acc", "ACC"), ("set", "SET")]:
    op(_name, _ggml, ["a", "b"], _into_shape, _into_build(f"ggml_{_name}"), [Param("offset", int, 0)],
       note="offset in elements; b is laid out with a's row/plane strides")


# --- reductions ---
op("sum", "SUM", ["a"], lambda s, p: (1, 1, 1, 1), _elementwise("ggml_sum"))
op("sum_rows", "SUM_ROWS", ["a"], lambda s, p: (1,) + s["a"][1:], _elementwise("ggml_sum_rows"))
op("mean", "MEAN", ["a"], lambda s, p: (1,) + s["a"][1:], _elementwise("ggml_mean"))


# --- repeat / repeat_back to an explicit shape ---
def _repeat_shape(s, p):
    target = ne4(p["shape"])
    if not _can_repeat(s["a"], target):
        raise ShapeError(f"repeat: a {list(s['a'])} cannot be repeated to {list(target)}")
    return target


def _repeat_back_shape(s, p):
    target = ne4(p["shape"])
    if not _can_repeat(target, s["a"]):
        raise ShapeError(f"repeat_back: {list(target)} does not divide a {list(s['a'])}")
    return target


op("repeat", "REPEAT", ["a"], _repeat_shape,
   lambda g, t, p: g.lib.ggml_repeat(g.ctx, t["a"], g.shape_tensor(p["shape"])),
   [Param("shape", tuple, required=True)])
op("repeat_back", "REPEAT_BACK", ["a"], _repeat_back_shape,
   lambda g, t, p: g.lib.ggml_repeat_back(g.ctx, t["a"], g.shape_tensor(p["shape"])),
   [Param("shape", tuple, required=True)])


# --- normalisation ---
op("rms_norm", "RMS_NORM", ["a"], _same, lambda g, t, p: g.lib.ggml_rms_norm(g.ctx, t["a"], p["eps"]),
   [Param("eps", float, 1e-6)])
op("norm", "NORM", ["a"], _same, lambda g, t, p: g.lib.ggml_norm(g.ctx, t["a"], p["eps"]),
   [Param("eps", float, 1e-6)])


# --- matrix multiplication (with batch broadcasting of a over b) ---
def _mul_mat_shape(s, p):
    a, b = s["a"], s["b"]
    if a[0] != b[0]:
        raise ShapeError(f"mul_mat: a {list(a)} and b {list(b)} must share ne0 (the reduced dimension)")
    if b[2] % a[2] or b[3] % a[3]:
        raise ShapeError(f"mul_mat: batch dims of b {list(b)} must be multiples of a's {list(a)}")
    return (a[1], b[1], b[2], b[3])


op("mul_mat", "MUL_MAT", ["a", "b"], _mul_mat_shape, _binary("ggml_mul_mat"))


def _out_prod_shape(s, p):
    a, b = s["a"], s["b"]
    if a[1] != b[1]:
        raise ShapeError(f"out_prod: a {list(a)} and b {list(b)} must share ne1")
    return (a[0], b[0], b[2], b[3])


op("out_prod", "OUT_PROD", ["a", "b"], _out_prod_shape, _binary("ggml_out_prod"))

op("scale", "SCALE", ["a"], _same, lambda g, t, p: g.lib.ggml_scale(g.ctx, t["a"], p["s"]),
   [Param("s", float, required=True)])


# --- copies, reshapes and views ---
def _cpy_shape(s, p):
    if prod(s["a"]) != prod(s["b"]):
        raise ShapeError(f"cpy: a {list(s['a'])} and b {list(s['b'])} must have as many elements")
    return s["b"]


op("cpy", "CPY", ["a", "b"], _cpy_shape, _binary("ggml_cpy"), note="copies a into b's shape")


def _reshape_shape(s, p):
    target = ne4(p["shape"])
    if prod(target) != prod(s["a"]):
        raise ShapeError(f"reshape: {list(target)} has {prod(target)} elements, a {list(s['a'])} has {prod(s['a'])}")
    return target


op("reshape", "RESHAPE", ["a"], _reshape_shape,
   lambda g, t, p: g.lib.ggml_reshape_4d(g.ctx, g.contiguous(t["a"]), *ne4(p["shape"])),
   [Param("shape", tuple, required=True)])


def _view_shape(s, p):
    ne = ne4(p["ne"])
    a = s["a"]
    nb = p["nb"] or (ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2])
    if len(nb) != 3:
        raise ShapeError("view: nb must list 3 strides (rows, planes, blocks) in elements")
    last = p["offset"] + (ne[0] - 1) + sum((n - 1) * st for n, st in zip(ne[1:], nb))
    if p["offset"] < 0 or last >= prod(a):
        raise ShapeError(f"view: ne {list(ne)} with strides {list(nb)} and offset {p['offset']} reaches element "
                         f"{last}, past the {prod(a)} elements of a {list(a)}")
    return ne


def _view_build(g, t, p):
    ne = ne4(p["ne"])
    nb = p["nb"] or (ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2])
    src = g.contiguous(t["a"])
    return g.lib.ggml_view_4d(g.ctx, src, *ne, nb[0] * 4, nb[1] * 4, nb[2] * 4, p["offset"] * 4)


op("view", "VIEW", ["a"], _view_shape, _view_build,
   [Param("ne", tuple, required=True), Param("nb", tuple, ()), Param("offset", int, 0)],
   note="strides and offset in elements of a (made contiguous first)")


def _permute_shape(s, p):
    axes = tuple(p["axes"])
    if sorted(axes) != [0, 1, 2, 3]:
        raise ShapeError(f"permute: axes {list(axes)} must be a permutation of 0, 1, 2, 3")
    out = [0] * 4
    for i, ax in enumerate(axes):
        out[ax] = s["a"][i]
    return tuple(out)


op("permute", "PERMUTE", ["a"], _permute_shape,
   lambda g, t, p: g.lib.ggml_permute(g.ctx, t["a"], *p["axes"]),
   [Param("axes", tuple, required=True)])
op("transpose", "TRANSPOSE", ["a"], lambda s, p: (s["a"][1], s["a"][0]) + s["a"][2:],
   _elementwise("ggml_transpose"))


def _get_rows_shape(s, p):
    a, rows = s["a"], s["rows"]
    if rows[1:] != (1, 1, 1) and rows[1] != a[2]:
        raise ShapeError(f"get_rows: rows {list(rows)} must be a vector (or match a's ne2)")
    return (a[0], rows[0], rows[1] if rows[1] > 1 else a[2], a[3])


op("get_rows", "GET_ROWS", ["a", "rows"], _get_rows_shape,
   lambda g, t, p: g.lib.ggml_get_rows(g.ctx, t["a"], t["rows"]), note="rows is an i32 input")

op("diag_mask_inf", "DIAG_MASK_INF", ["a"], _same,
   lambda g, t, p: g.lib.ggml_diag_mask_inf(g.ctx, t["a"], p["n_past"]), [Param("n_past", int, 0)])
op("diag_mask_zero", "DIAG_MASK_ZERO", ["a"], _same,
   lambda g, t, p: g.lib.ggml_diag_mask_zero(g.ctx, t["a"], p["n_past"]), [Param("n_past", int, 0)])


def _soft_max_shape(s, p):
    a, mask = s["a"], s.get("mask")
    if mask is not None and (mask[0] != a[0] or mask[1] < a[1]):
        raise ShapeError(f"soft_max_ext: mask {list(mask)} must have ne0 = {a[0]} and ne1 >= {a[1]}")
    return a


op("soft_max_ext", "SOFT_MAX", ["a"], _soft_max_shape,
   lambda g, t, p: g.lib.ggml_soft_max_ext(g.ctx, t["a"], t.get("mask") or g.ffi.NULL, p["scale"], p["max_bias"]),
   [Param("scale", float, 1.0), Param("max_bias", float, 0.0)], optional_tensors=("mask",))
op("soft_max", "SOFT_MAX", ["a"], _same,
   lambda g, t, p: g.lib.ggml_soft_max_ext(g.ctx, t["a"], g.ffi.NULL, 1.0, 0.0))


ROPE_MODES = {"normal": 0, "neox": 2, "multi": 8, "vision": 24, "imrope": 40}     # GGML_ROPE_TYPE_*
_ROPE_TAIL = [Param("n_ctx_orig", int, 0), Param("freq_base", float, 10000.0), Param("freq_scale", float, 1.0),
              Param("ext_factor", float, 0.0), Param("attn_factor", float, 1.0), Param("beta_fast", float, 32.0),
              Param("beta_slow", float, 1.0)]


def _rope_common(op_name, s, p, positions_per_token):
    a, pos, freq = s["a"], s["pos"], s.get("freq")
    if pos[1:] != (1, 1, 1) or pos[0] != positions_per_token * a[2]:
        raise ShapeError(f"{op_name}: pos {list(pos)} must be a vector of {positions_per_token} position(s) per "
                         f"token ({positions_per_token * a[2]} for a's ne2 = {a[2]} tokens)")
    if p["n_dims"] % 2 or not 0 < p["n_dims"] <= a[0]:
        raise ShapeError(f"{op_name}: n_dims {p['n_dims']} must be even, positive and at most a's ne0 = {a[0]}")
    if freq is not None and (freq[1:] != (1, 1, 1) or freq[0] < p["n_dims"] // 2):
        raise ShapeError(f"{op_name}: freq (freq_factors) {list(freq)} must be a vector of at least n_dims/2 = "
                         f"{p['n_dims'] // 2} factors")
    return a


def _rope_shape(s, p):
    if p["mode"] not in (ROPE_MODES["normal"], ROPE_MODES["neox"]):
        raise ShapeError(f"rope_ext: mode {p['mode']} must be 0 (normal) or 2 (neox); the multi, vision and "
                         "imrope modes are rope_multi's")
    return _rope_common("rope_ext", s, p, 1)


def _rope_multi_shape(s, p):
    sections, mode = tuple(p["sections"]), p["mode"]
    if mode not in (ROPE_MODES["multi"], ROPE_MODES["vision"], ROPE_MODES["imrope"]):
        raise ShapeError(f"rope_multi: mode {mode} must be 8 (multi), 24 (vision) or 40 (imrope)")
    if len(sections) != 4 or min(sections) < 0 or not any(sections[:3]):
        raise ShapeError(f"rope_multi: sections {list(sections)} must be 4 sizes >= 0, one of the first 3 positive")
    a = _rope_common("rope_multi", s, p, 4)
    if sum(sections) > a[0]:
        raise ShapeError(f"rope_multi: sections {list(sections)} add up to more than a's ne0 = {a[0]}")
    if mode == ROPE_MODES["vision"] and p["n_dims"] * 2 != a[0]:
        raise ShapeError(f"rope_multi: vision mode rotates pairs across halves: n_dims must be ne0/2 = {a[0] // 2}")
    return a


op("rope_ext", "ROPE", ["a", "pos"], _rope_shape,
   lambda g, t, p: g.lib.ggml_rope_ext(g.ctx, t["a"], t["pos"], t.get("freq") or g.ffi.NULL, p["n_dims"], p["mode"],
                                       p["n_ctx_orig"], p["freq_base"], p["freq_scale"], p["ext_factor"],
                                       p["attn_factor"], p["beta_fast"], p["beta_slow"]),
   [Param("n_dims", int, required=True), Param("mode", int, 0)] + _ROPE_TAIL, optional_tensors=("freq",),
   note="a is [head_dim, n_head, n_tokens]; pos an i32 input with n_tokens positions; mode 0 normal, 2 neox; "
        "freq: optional f32 freq_factors (>= n_dims/2), which get no gradient")
op("rope_multi", "ROPE", ["a", "pos"], _rope_multi_shape,
   lambda g, t, p: g.lib.ggml_rope_multi(g.ctx, t["a"], t["pos"], t.get("freq") or g.ffi.NULL, p["n_dims"],
                                         g.ffi.new("int[4]", list(p["sections"])), p["mode"], p["n_ctx_orig"],
                                         p["freq_base"], p["freq_scale"], p["ext_factor"], p["attn_factor"],
                                         p["beta_fast"], p["beta_slow"]),
   [Param("n_dims", int, required=True), Param("sections", tuple, required=True), Param("mode", int, 8)] + _ROPE_TAIL,
   optional_tensors=("freq",),
   note="mode 8 multi (M-RoPE), 24 vision (n_dims = ne0/2), 40 imrope; pos holds 4 positions per token "
        "(4 x n_tokens, one block of n_tokens per section); its backward is rope_multi_back")


def _conv_out(size, k, s, pad, d):
    return (size + 2 * pad - d * (k - 1) - 1) // s + 1


def _positive(op, p, names):
    bad = [n for n in names if p[n] <= 0]
    if bad:
        raise ShapeError(f"{op}: {', '.join(f'{n}={p[n]}' for n in bad)} must be positive")


def _im2col_shape(s, p):
    _positive("im2col", p, ("s0", "s1", "d0", "d1"))
    k, x = s["kernel"], s["a"]
    if p["is_2d"]:
        if k[2] != x[2]:
            raise ShapeError(f"im2col: kernel {list(k)} and data {list(x)} must share ne2 (channels)")
        ow = _conv_out(x[0], k[0], p["s0"], p["p0"], p["d0"])
        oh = _conv_out(x[1], k[1], p["s1"], p["p1"], p["d1"])
        if ow < 1 or oh < 1:
            raise ShapeError(f"im2col: kernel {list(k)} does not fit data {list(x)}")
        return (k[0] * k[1] * k[2], ow, oh, x[3])
    ow = _conv_out(x[0], k[0], p["s0"], p["p0"], p["d0"])
    return (k[0] * k[1], ow, x[2], 1)


op("im2col", "IM2COL", ["kernel", "a"], _im2col_shape,
   lambda g, t, p: g.lib.ggml_im2col(g.ctx, t["kernel"], t["a"], p["s0"], p["s1"], p["p0"], p["p1"],
                                     p["d0"], p["d1"], p["is_2d"], F32),
   [Param("s0", int, 1), Param("s1", int, 1), Param("p0", int, 0), Param("p1", int, 0),
    Param("d0", int, 1), Param("d1", int, 1), Param("is_2d", bool, True)],
   note="kernel only gives the shape (an input); the gradient flows to a")


def _pool_shape(s, p):
    _positive("pool_2d", p, ("k0", "k1", "s0", "s1"))
    a = s["a"]
    if p["op"] not in POOL:
        raise ShapeError(f"pool_2d: op '{p['op']}' must be one of {sorted(POOL)}")
    ow = int((a[0] + 2 * p["p0"] - p["k0"]) / p["s0"]) + 1
    oh = int((a[1] + 2 * p["p1"] - p["k1"]) / p["s1"]) + 1
    if ow < 1 or oh < 1:
        raise ShapeError(f"pool_2d: kernel {p['k0']}x{p['k1']} does not fit a {list(a)}")
    return (ow, oh, a[2], a[3])


op("pool_2d", "POOL_2D", ["a"], _pool_shape,
   lambda g, t, p: g.lib.ggml_pool_2d(g.ctx, t["a"], POOL[p["op"]], p["k0"], p["k1"], p["s0"], p["s1"],
                                      p["p0"], p["p1"]),
   [Param("op", str, "avg"), Param("k0", int, 2), Param("k1", int, 2), Param("s0", int, 2), Param("s1", int, 2),
    Param("p0", float, 0.0), Param("p1", float, 0.0)])

op("cross_entropy_loss", "CROSS_ENTROPY_LOSS", ["a", "b"], lambda s, p: (_same_shape(s, p), (1, 1, 1, 1))[1],
   _binary("ggml_cross_entropy_loss"), note="a are logits, b the label probabilities (an input)")

op("swiglu_split", "GLU(SWIGLU)", ["a", "b"], _same_shape, _binary("ggml_swiglu_split"))
op("geglu_split", "GLU(GEGLU)", ["a", "b"], _same_shape, _binary("ggml_geglu_split"))


def _reglu_shape(s, p):
    a = s["a"]
    if a[0] % 2:
        raise ShapeError(f"reglu: ne0 of a {list(a)} must be even (it is split in halves)")
    return (a[0] // 2,) + a[1:]


op("reglu", "GLU(REGLU)", ["a"], _reglu_shape, _elementwise("ggml_reglu"))
op("swiglu", "GLU(SWIGLU)", ["a"], _reglu_shape, _elementwise("ggml_swiglu"),
   note="fused: a's two halves are the gate and the value (ggml has a backward for swiglu_split only)")


def _concat_shape(s, p):
    a, b, dim = s["a"], s["b"], p["dim"]
    if not 0 <= dim <= 3:
        raise ShapeError(f"concat: dim {dim} must be 0..3")
    if any(a[i] != b[i] for i in range(4) if i != dim):
        raise ShapeError(f"concat: a {list(a)} and b {list(b)} may differ only in dim {dim}")
    return tuple(a[i] + b[i] if i == dim else a[i] for i in range(4))


op("concat", "CONCAT", ["a", "b"], _concat_shape,
   lambda g, t, p: g.lib.ggml_concat(g.ctx, t["a"], t["b"], p["dim"]), [Param("dim", int, 0)])


def _pad_shape(s, p):
    return tuple(n + p[f"p{i}"] for i, n in enumerate(s["a"]))


op("pad", "PAD", ["a"], _pad_shape,
   lambda g, t, p: g.lib.ggml_pad(g.ctx, t["a"], p["p0"], p["p1"], p["p2"], p["p3"]),
   [Param("p0", int, 0), Param("p1", int, 0), Param("p2", int, 0), Param("p3", int, 0)])


def _win_part_shape(s, p):
    a, w = s["a"], p["w"]
    if a[3] != 1 or w < 1:
        raise ShapeError(f"win_part: a's ne3 must be 1 and w >= 1, got a {list(a)}, w {w}")
    npx, npy = -(-a[1] // w), -(-a[2] // w)     # windows per row and column, the last padded
    return (a[0], w, w, npx * npy)


def _win_unpart_shape(s, p):
    a, w, w0, h0 = s["a"], p["w"], p["w0"], p["h0"]
    if a[1] != w or a[2] != w or a[3] != -(-w0 // w) * -(-h0 // w):
        raise ShapeError(f"win_unpart: a must be [ne0, w, w, windows of a {w0}x{h0} image], got {list(a)}")
    return (a[0], w0, h0, 1)


# SAM's window partition; ggml's backward of both falls into the UNARY case (no backward of its own)
op("win_part", "WIN_PART", ["a"], _win_part_shape, lambda g, t, p: g.lib.ggml_win_part(g.ctx, t["a"], p["w"]),
   [Param("w", int, required=True)])
op("win_unpart", "WIN_UNPART", ["a"], _win_unpart_shape,
   lambda g, t, p: g.lib.ggml_win_unpart(g.ctx, t["a"], p["w0"], p["h0"], p["w"]),
   [Param("w0", int, required=True), Param("h0", int, required=True), Param("w", int, required=True)])
op("clamp", "CLAMP", ["a"], _same, lambda g, t, p: g.lib.ggml_clamp(g.ctx, t["a"], p["min"], p["max"]),
   [Param("min", float, -1.0), Param("max", float, 1.0)])
