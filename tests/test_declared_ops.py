"""Ops a case file declares by their C prototype (ops/declared.py): a fork's own op, checked from a
YAML file alone. The fork is a real one: a copy of the default ggml with an op of its own added
(ggml_walk_scale: its GGML_OP, constructor, CPU forward and backward; tests/ggml_variants.py), with
a correct backward (walk-scale) and a planted wrong one (walk-scale-wrong, which reads the incoming
gradient with the input's strides)."""

import json

import pytest

from ggml_variants import WALK_SCALE_PROTOTYPE
from pytest_gradgate.declare.loader import load_file
from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.ops.declared import parse_prototype

FORK_CASES = f"""\
ops:
  walk_scale:
    c: "{WALK_SCALE_PROTOTYPE};"
cases:
  - name: walk_scale
    params: {{a: [4, 3, 2]}}
    graph: walk_scale(a, s=0.5)
    consumers: [none, transpose, permute_0213_transpose]
"""


def test_tensor_arguments_are_positional_and_scalars_keywords(tmp_path):
    declared = parse_prototype("walk_scale", WALK_SCALE_PROTOTYPE)
    assert (declared.symbol, declared.tensors, declared.scalars) == ("ggml_walk_scale", ("a",), (("s", "float"),))
    path = tmp_path / "gradgate_fork.yaml"
    path.write_text(FORK_CASES)
    loaded, errors = load_file(path)
    assert errors == []
    case = loaded[0].cases[0]
    assert case.ops == {"walk_scale": WALK_SCALE_PROTOTYPE + ";"}
    assert case.op == "walk_scale"


@pytest.mark.parametrize("c, graph, line, words", [
    ("struct ggml_tensor * ggml_walk_scale(struct ggml_context * ctx, struct ggml_tensor * a, float s",
     "walk_scale(a, s=0.5)", 2, "the prototype does not parse"),
    ("int ggml_walk_scale(struct ggml_context * ctx, struct ggml_tensor * a);", "walk_scale(a)", 2,
     "must return struct ggml_tensor *"),
    ("struct ggml_tensor * ggml_walk_scale(struct ggml_context * ctx, const char * s);", "walk_scale(a)", 2,
     "argument 's' of ggml_walk_scale is neither struct ggml_tensor *"),
    (WALK_SCALE_PROTOTYPE, "walk_scale(a, s=2)", None, None),       # an int where C takes a float: fine
    (WALK_SCALE_PROTOTYPE, "walk_scale(a, s=true)", 9, "walk_scale: s must be a number"),
    (WALK_SCALE_PROTOTYPE, "walk_scale(a)", 9, "walk_scale: 's' is required"),
])
def test_a_bad_declaration_is_one_error_at_its_line(tmp_path, c, graph, line, words):
    path = tmp_path / "gradgate_fork.yaml"
    path.write_text(f'ops:\n  walk_scale:\n    c: "{c}"\n  other:\n    c: "{WALK_SCALE_PROTOTYPE}"\n'
                    f"cases:\n  - name: uses_it\n    params: {{a: [4, 3]}}\n    graph: {graph}\n"
                    "  - name: fine\n    params: {a: [4, 3]}\n    graph: sqr(a)\n")
    loaded, errors = load_file(path)
    assert "fine" in [e.name for e in loaded]      # the file's other cases still load
    if words is None:
        assert errors == []
        return
    assert len(errors) == 1, [str(e) for e in errors]
    assert errors[0].line == line and words in str(errors[0]), str(errors[0])
    if line == 2:   # the op's error says which cases it kept from loading; they have none of their own
        assert "(not loaded because of it: uses_it)" in str(errors[0])


def test_a_declared_op_may_not_take_a_built_in_name(tmp_path):
    path = tmp_path / "gradgate_fork.yaml"
    path.write_text(f'ops:\n  concat:\n    c: "{WALK_SCALE_PROTOTYPE}"\ncases: []\n')
    _, errors = load_file(path)
    assert errors[0].line == 2 and "is an op of the built-in table" in str(errors[0])


@pytest.fixture
def fork_gate(pytester, ggml_variant, monkeypatch, tmp_path):
    """Run pytest --gradgate on FORK_CASES alone against a walk-scale variant -> its JSON cases by id."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    empty = tmp_path / "empty-baseline.json"
    empty.write_text(json.dumps({"schema": 2, "entries": {}}))

    def run(variant, text=FORK_CASES):
        root, _ = ggml_variant(variant)
        (pytester.path / "gradgate_fork.yaml").write_text(text)
        report = pytester.path / "report.json"
        result = pytester.runpytest_subprocess(
            "--gradgate", "--gradgate-no-builtin", "--gradgate-ggml-src", str(root), f"--gradgate-baseline={empty}",
            "--gradgate-json", str(report), "-p", "no:cacheprovider", "gradgate_fork.yaml")
        cases = {c["id"]: c for c in json.loads(report.read_text())["cases"]} if report.exists() else {}
        return result, cases
    return run


@pytest.mark.slow
def test_the_forks_op_with_a_correct_backward_passes_through_every_consumer(fork_gate):
    result, cases = fork_gate("walk-scale")
    result.assert_outcomes(passed=3)
    assert all(c["power"] is True for c in cases.values()), cases


@pytest.mark.slow
def test_the_forks_op_with_a_wrong_backward_fails_through_the_non_contiguous_consumers(fork_gate):
    """The planted bug (walk-scale-wrong) is what these failures are: the same YAML passes on the
    correct variant above, and through the contiguous consumer, where the gradient arrives laid
    out like the input, the wrong backward reads the right elements and passes."""
    result, cases = fork_gate("walk-scale-wrong")
    result.assert_outcomes(passed=1, failed=2)
    assert cases["walk_scale[none-sqr-cpu]"]["status"] == "passed"
    for consumer in ("transpose", "permute_0213_transpose"):
        case = cases[f"walk_scale[{consumer}-sqr-cpu]"]
        assert case["status"] == "failed" and case["maa"] > 1e-2, case


@pytest.mark.slow
def test_a_function_the_forks_headers_lack_is_one_error_at_its_line(fork_gate):
    """Seen failing with the header check taken out of gate/items.py: three failed items instead."""
    text = FORK_CASES.replace("ggml_walk_scale", "ggml_walk_scaled")
    result, _ = fork_gate("walk-scale", text)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gradgate_fork.yaml:2: op 'walk_scale': ggml_walk_scaled is not declared in the "
                                 "headers of the ggml tree under test*(cases not run because of it: walk_scale)*"])


SCALE_BIAS = ("struct ggml_tensor * ggml_scale_bias(struct ggml_context * ctx, struct ggml_tensor * a, float s, "
              "float b);")


def test_the_fixture_takes_declared_ops_and_a_missing_function_is_an_error_naming_it(pytester, monkeypatch,
                                                                                        default_build):
    """ggml_scale_bias is in the default ggml but not in the op table: declared from Python, it is
    built and checked; a function the library lacks fails the check with its name, not a traceback.
    Seen failing with binding._DeclaredLibrary's lookup error left as cffi's own."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    pytester.makepyfile(test_checks=f'''
        SCALE_BIAS = {SCALE_BIAS!r}

        def test_declared(gradgate):
            r = gradgate.check("scale_bias(a, s=0.5, b=1.0)", params={{"a": [4, 3]}}, ops={{"scale_bias": SCALE_BIAS}})
            assert r.power is True and r.op == "scale_bias"

        def test_missing(gradgate):
            r = gradgate.run("nope(a)", params={{"a": [4, 3]}},
                             ops={{"nope": "struct ggml_tensor * ggml_nope(struct ggml_context * ctx, struct ggml_tensor * a);"}})
            assert r.status == "error" and "ggml_nope is not in" in r.message, r.message
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=2)


def test_a_consumer_that_cannot_read_a_declared_ops_output_is_found_in_the_worker(pytester, monkeypatch,
                                                                                   default_build):
    """The output's shape is ggml's to say, so the consumer's requirement (view_gap needs ne0 >= 2) is
    checked once ggml built the op: an error that says so, not a crash of the consumer. Seen failing
    with the engine's check taken out."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    pytester.makepyfile(test_checks='''
        def test_rows(gradgate):
            r = gradgate.run("rows(a)", params={"a": [4, 3]}, consumer="view_gap", ops={"rows":
                "struct ggml_tensor * ggml_sum_rows(struct ggml_context * ctx, struct ggml_tensor * a);"})
            assert r.status == "error", (r.status, r.message)
            assert "consumer 'view_gap' cannot read this output: view_gap needs ne0 >= 2" in r.message, r.message
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1)


def test_an_abort_inside_a_declared_op_names_the_ggml_function_that_holds_it(pytester, default_build):
    """Issue 52: a crash inside a declared op named ggml's assert (`ggml/src/ggml.c:2146: GGML_ASSERT(
    ggml_nelements(b) <= ggml_nelements(a)) failed`) but not the ggml function, among those the
    op calls, that holds it. Here the op is ggml_acc, and the assert is in ggml_acc_impl."""
    (pytester.path / "gradgate_declared.yaml").write_text(
        "ops:\n  my_acc:\n    c: \"struct ggml_tensor * ggml_acc(struct ggml_context * ctx, struct ggml_tensor * a, "
        "struct ggml_tensor * b, size_t nb1, size_t nb2, size_t nb3, size_t offset);\"\n"
        "cases:\n  - name: too_big\n    params: {a: [2, 2], b: [4, 3]}\n"
        "    graph: my_acc(a, b, nb1=8, nb2=16, nb3=16, offset=0)\n    consumers: [none]\n")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "gradgate_declared.yaml")
    result.stdout.fnmatch_lines(["*too_big[[]none-sqr-cpu[]]: crashed: ggml aborted in phase build-forward: "
                                 "*ggml.c:*: GGML_ASSERT(ggml_nelements(b) <= ggml_nelements(a)) failed "
                                 "(in ggml's ggml_acc_impl, src/ggml.c:* of the tree under test)"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
