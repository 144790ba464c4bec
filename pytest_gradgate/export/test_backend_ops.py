"""A Case as a `test_case` of ggml's tests/test-backend-ops.cpp, so that a fix's regression test
can live in ggml's own harness.

test-backend-ops' grad mode sums the graph's output (SUM) and compares the analytic gradients of
the params with its finite differences. A SUM loss alone sends an all-ones gradient into the op,
which survives any scramble; so the exported graph ends in the case's consumer chain (permute,
transpose, cont: the layout the gradient arrives in) and then SQR, and the harness's SUM makes the
case's sqr loss. `op_desc` names the op under test (not the last node, SQR), so that
`test-backend-ops grad -o CONCAT` selects the case.

Only what can be rebuilt exactly is exported; anything else (inputs, producers, ops without a
plain C counterpart here) is refused with the reason, never approximated.
"""

import re

from pytest_gradgate.declare.expr import Call, Ref, parse_graph
from pytest_gradgate.declare.graph import bind
from pytest_gradgate.errors import UsageError
from pytest_gradgate.ops.table import ne4

# ops whose ggml call is ggml_<name>(ctx, tensors..., params...) in the table's order
_PLAIN = {"sqr", "sqrt", "log", "sin", "cos", "abs", "sgn", "neg", "step", "relu", "silu", "exp", "expm1",
          "softplus", "sigmoid", "tanh", "gelu", "dup", "cont", "add", "sub", "mul", "div", "add1", "sum",
          "sum_rows", "mean", "rms_norm", "norm", "mul_mat", "out_prod", "scale", "cpy", "transpose",
          "diag_mask_inf", "diag_mask_zero", "concat", "pad", "clamp", "swiglu_split", "geglu_split", "reglu",
          "swiglu", "cross_entropy_loss", "win_part", "win_unpart"}

# consumer -> the C calls it makes around y (ops/consumers.py builds the same with cffi)
CONSUMER_CHAINS = {
    "none": "{y}",
    "transpose": "ggml_cont(ctx, ggml_transpose(ctx, {y}))",
    "permute_0213_transpose": "ggml_cont(ctx, ggml_transpose(ctx, ggml_permute(ctx, {y}, 0, 2, 1, 3)))",
    "permute_1203": "ggml_cont(ctx, ggml_permute(ctx, {y}, 1, 2, 0, 3))",
    "permute_2013": "ggml_cont(ctx, ggml_permute(ctx, {y}, 2, 0, 1, 3))",
}
VIEW_OUTPUTS = ("transpose", "permute")
# the harness adds SUM; the case's loss is what goes before it
LOSS_TAILS = {"sqr": "ggml_sqr(ctx, {z})", "sum": "{z}"}

# where the exported code goes in tests/test-backend-ops.cpp (short anchors, one line each)
STRUCT_ANCHOR = "static std::vector<std::unique_ptr<test_case>> make_test_cases_eval() {\n"
REGISTER_ANCHOR = STRUCT_ANCHOR + "    std::vector<std::unique_ptr<test_case>> test_cases;\n"
REGISTER_MARK = "// register it in make_test_cases_eval(), after `std::vector<std::unique_ptr<test_case>> test_cases;`:"


def struct_name(case):
    return "test_gradgate_" + re.sub(r"[^A-Za-z0-9_]", "_", case.id).strip("_")


def _literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value!r}f" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0f"
    if isinstance(value, int):
        return str(value)
    raise UsageError(f"a parameter value {value!r} has no C literal here")


def _refuse(case, why):
    raise UsageError(f"{case.id} cannot be exported to test-backend-ops: {why}")


def _expression(case, node, env):
    """The C expression of one graph node; params and bound names are C variables of build_graph."""
    if isinstance(node, Ref):
        return env[node.name]
    if not isinstance(node, Call):
        _refuse(case, f"{node!r} is not a tensor")
    spec, tensors, params = bind(node, lambda n: _expression(case, n, env))
    if spec.name == "permute":
        return f"ggml_permute(ctx, {tensors['a']}, {', '.join(str(x) for x in params['axes'])})"
    if spec.name == "soft_max":
        return f"ggml_soft_max(ctx, {tensors['a']})"
    if spec.name not in _PLAIN:
        _refuse(case, f"op '{spec.name}' has no exporter yet (exported: {', '.join(sorted(_PLAIN | {'permute', 'soft_max'}))})")
    args = [tensors[t] for t in spec.tensors] + [_literal(params[p.name]) for p in spec.params]
    return f"ggml_{spec.name}(ctx, {', '.join(args)})"


def export(case):
    """(the C++ struct, the line that registers it) for one Case."""
    if case.equivalent:
        _refuse(case, "an equivalence case compares formulations, test-backend-ops compares with finite differences")
    if case.inputs:
        _refuse(case, f"it has inputs ({', '.join(case.inputs)}), which test-backend-ops would draw at random")
    if case.producer != "none":
        _refuse(case, f"producer '{case.producer}' is not exported yet; export the case's item through producer none")
    if case.consumer not in CONSUMER_CHAINS:
        _refuse(case, f"consumer '{case.consumer}' is not exported yet (exported: {', '.join(CONSUMER_CHAINS)})")
    if case.loss not in LOSS_TAILS:
        _refuse(case, f"loss '{case.loss}' is not exported (exported: {', '.join(LOSS_TAILS)})")
    if case.mode != "full":
        _refuse(case, f"mode {case.mode}: test-backend-ops checks every element (mode full)")
    if getattr(case, "ops", None):
        _refuse(case, "it uses ops declared by the case file, which test-backend-ops does not know")
    lines = parse_graph(case.graph)
    op = bind(lines[-1].expr, lambda n: n)[0] if isinstance(lines[-1].expr, Call) else None
    if op is None:
        _refuse(case, "its graph's last line is not an op call")
    name = struct_name(case)
    body, env = [], {}
    for pname, shape in case.params.items():
        ne = ", ".join(str(x) for x in ne4(shape))
        body += [f"        const int64_t ne_{pname}[4] = {{{ne}}};",
                 f"        ggml_tensor * {pname} = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne_{pname});",
                 f"        ggml_set_param({pname});",
                 f"        ggml_set_name({pname}, \"{pname}\");"]
        env[pname] = pname
    for line in lines:
        var = f"t_{line.target}"
        body.append(f"        ggml_tensor * {var} = {_expression(case, line.expr, env)};  // {line.text}")
        env[line.target] = var
    y = env[lines[-1].target]
    # as the gate does: an output that is a view reaches the loss through a cont (CPU unary
    # kernels reject a non-contiguous input), so with consumer none the gradient arrives contiguous
    chain = CONSUMER_CHAINS[case.consumer]
    if case.consumer == "none" and op.name in VIEW_OUTPUTS:
        chain = "ggml_cont(ctx, {y})"
    body += [f"        ggml_set_name({y}, \"y\");",
             f"        // consumer {case.consumer}: the layout the gradient arrives at the op in",
             f"        ggml_tensor * z = {chain.format(y=y)};",
             f"        // loss {case.loss}: the harness sums what build_graph returns",
             f"        ggml_tensor * out = {LOSS_TAILS[case.loss].format(z='z')};",
             "        ggml_set_name(out, \"out\");",
             "        return out;"]
    ranges = {}
    for pname, spec in case.init.items():
        if not isinstance(spec, (list, tuple)):
            _refuse(case, f"init {spec!r} of '{pname}' (only [lo, hi] ranges are exported)")
        ranges[pname] = (float(spec[0]), float(spec[1]))
    # the params alone, from a fixed seed: the harness's own initialize_tensors draws from
    # std::random_device (another case every run, so a limit met by f32 roundoff flips now and
    # then) and writes every tensor of the context, the backward's too, where a view that a wrong
    # backward gave bogus strides aborts the write before the gradients are compared
    init = ["", "    void initialize_tensors(ggml_context * ctx) override {",
            f"        std::mt19937 rng({case.seed});",
            "        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {",
            "            if (!(t->flags & GGML_TENSOR_FLAG_PARAM)) { continue; }",
            "            float lo = -1.0f, hi = 1.0f;"]
    for pname, (lo, hi) in ranges.items():
        init.append(f"            if (strcmp(t->name, \"{pname}\") == 0) {{ lo = {_literal(lo)}; hi = {_literal(hi)}; }}")
    init += ["            std::uniform_real_distribution<float> uniform(lo, hi);",
             "            std::vector<float> values(ggml_nelements(t));",
             "            for (float & v : values) { v = uniform(rng); }",
             "            ggml_backend_tensor_set(t, values.data(), 0, ggml_nbytes(t));",
             "        }", "    }"]
    init = "\n".join(init)
    origin = case.origin.get("path", ""), case.origin.get("line", "")
    struct = "\n".join([
        f"// {case.id}: exported by pytest-gradgate from {origin[0]}:{origin[1]}",
        f"// {op.ggml_op} through consumer {case.consumer}, loss {case.loss} (the harness's SUM after it)",
        "// test-backend-ops gives every tensor memory of its own: a kernel wrong only where ggml's graph",
        "// allocator lays its output over an input (pytest-gradgate's allocation regimes) passes here",
        f"struct {name} : public test_case {{",
        f"    std::string op_desc(ggml_tensor * t) override {{ GGML_UNUSED(t); return \"{_op_desc(op)}\"; }}",
        f"    std::string vars() override {{ return \"gradgate={case.id}\"; }}",
        f"    double max_maa_err() override {{ return {case.max_maa!r}; }}",
        f"    float grad_eps() override {{ return {_literal(float(case.eps))}; }}",
        f"    bool grad_precise() override {{ return {'true' if case.stencil == 4 else 'false'}; }}",
        f"    int64_t grad_nmax() override {{ return {max(10000, case.n_param_elements())}; }}" + init,
        "",
        "    ggml_tensor * build_graph(ggml_context * ctx) override {",
        *body,
        "    }",
        "};",
    ])
    return struct, f"    test_cases.emplace_back(new {name}());"


def _op_desc(spec):
    """What test-backend-ops' -o matches: GGML_OP_* without the prefix, a unary op by its own name."""
    m = re.match(r"(?:UNARY|GLU)\((\w+)\)$", spec.ggml_op)
    return m.group(1) if m else spec.ggml_op


def op_desc_of(case):
    """What `test-backend-ops grad -o` selects the exported case by (its op_desc)."""
    lines = parse_graph(case.graph)
    return _op_desc(bind(lines[-1].expr, lambda n: n)[0])


def text(case):
    struct, register = export(case)
    return f"{struct}\n\n{REGISTER_MARK}\n{register}\n"
