"""The producers axis: a param reaches the op through a transpose, a permute or a gapped view
(ops/producers.py), so the backward also reads the op's forward inputs with other strides.

The bug class is real: the input-strides variant of the default ggml has an RMS_NORM_BACK
kernel that reads x as if it were contiguous (tests/ggml_variants.py); before producers every
built-in rms_norm item passed on it, because x was always a contiguous leaf. And upstream
ggml 0.15.3's SILU_BACK reads x by row index times nb[1] alone, which a permuted x defeats
(the built-in silu[from_permute_0213-none-sqr-cpu] fails, tests/test_builtin_suite.py).
"""

import pytest

from pytest_gradgate.declare.loader import build_cases
from pytest_gradgate.errors import CaseError


def _ids(raw):
    return [c.id for c in build_cases(raw, "cases.yaml", 3)]


def test_each_producer_is_an_item_through_consumer_none_and_ids_name_it():
    ids = _ids({"name": "silu", "params": {"a": [4, 3, 2]}, "graph": "silu(a)"})
    assert ids == ["silu[none-sqr-cpu]", "silu[transpose-sqr-cpu]", "silu[permute_0213_transpose-sqr-cpu]",
                   "silu[permute_1203-sqr-cpu]", "silu[from_transpose-none-sqr-cpu]",
                   "silu[from_permute_0213-none-sqr-cpu]", "silu[from_view_gap-none-sqr-cpu]"]


def test_the_default_set_leaves_out_a_producer_that_changes_no_layout():
    # a 2-D param has no rows to permute apart, a 1-D one nothing to transpose
    assert "from_permute_0213" not in " ".join(_ids({"name": "m", "params": {"a": [4, 3]}, "graph": "silu(a)"}))
    assert [i for i in _ids({"name": "v", "params": {"a": [6]}, "graph": "silu(a)"}) if "from_" in i] == [
        "v[from_view_gap-none-sqr-cpu]"]


def test_a_case_that_names_its_consumers_gets_producer_none_unless_it_names_producers():
    assert _ids({"name": "c", "params": {"a": [4, 3, 2]}, "graph": "silu(a)", "consumers": ["none"]}) == [
        "c[none-sqr-cpu]"]
    assert _ids({"name": "c", "params": {"a": [4, 3, 2]}, "graph": "silu(a)", "consumers": ["none"],
                 "producers": ["none", "permute_1203"]}) == ["c[none-sqr-cpu]", "c[from_permute_1203-none-sqr-cpu]"]


def test_a_named_producer_that_changes_no_layout_is_an_error_at_its_line():
    with pytest.raises(CaseError) as err:
        build_cases({"name": "m", "params": {"a": [4, 3]}, "graph": "silu(a)", "producers": ["permute_0213"]},
                    "cases.yaml", 3, key_lines={"producers": 7})
    assert err.value.line == 7
    assert "producer 'permute_0213' lays out none of the params differently (shapes a [4, 3])" in str(err.value)
    with pytest.raises(CaseError, match="unknown producer 'flip'; known: none, transpose"):
        build_cases({"name": "m", "params": {"a": [4, 3]}, "graph": "silu(a)", "producers": "flip"}, "cases.yaml", 3)


def test_without_consumer_none_a_producer_meets_each_consumer():
    ids = _ids({"name": "s", "params": {"a": [4, 3, 2]}, "graph": "silu(a)", "producers": ["view_gap"],
                "consumers": ["transpose", "permute_1203"]})
    assert ids == ["s[from_view_gap-transpose-sqr-cpu]", "s[from_view_gap-permute_1203-sqr-cpu]"]


def test_producers_none_keeps_the_items_and_ids_of_before():
    assert _ids({"name": "s", "params": {"a": [4, 3, 2]}, "graph": "silu(a)", "producers": ["none"],
                 "consumers": ["none", "transpose"]}) == ["s[none-sqr-cpu]", "s[transpose-sqr-cpu]"]


def test_the_op_reads_the_declared_shape_and_the_leaf_gets_the_gradient(runner):
    """mul through view_gap on the default ggml: the op sees [4, 3, 2]; the checked gradient is
    the leaf's, [5, 3, 2], zero in the gap column (which the finite differences confirm)."""
    case = next(c for c in build_cases({"name": "mul", "params": {"a": [4, 3, 2], "b": [4, 3, 2]},
                                        "graph": "mul(a, b)", "producers": ["view_gap"]}, "cases.yaml", 3)
                if c.producer == "view_gap")
    result = runner.run(case)
    assert result.status == "passed", result.diagnosis
    assert result.producer == "view_gap" and result.power
    assert [(p["name"], p["shape"], p.get("producer")) for p in result.params] == [
        ("a", [5, 3, 2, 1], "view_gap"), ("b", [5, 3, 2, 1], "view_gap")]


CASES = """\
cases:
  - name: rms_norm_inputs
    params: {a: [4, 3, 2]}
    graph: rms_norm(a, eps=1.0e-6)
    loss: wsqr
    consumers: [none]
    producers: [none, permute_0213, view_gap]
"""


@pytest.mark.slow
def test_a_backward_reading_a_forward_input_with_wrong_strides_fails_through_a_producer(pytester, ggml_variant,
                                                                                         default_ggml):
    """input-strides: RMS_NORM_BACK reads x as if contiguous. Through a contiguous x it is exact
    (passes); through a permuted or gapped x it fails, and the failure says where to look. On
    the default ggml the same items pass: the failures are the variant's."""
    root, _ = ggml_variant("input-strides")
    pytester.makefile(".yaml", gradgate_inputs=CASES)
    args = ("--gradgate-no-builtin", "gradgate_inputs.yaml", "-p", "no:cacheprovider", "-rA")
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", *args)
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "PASSED gradgate_inputs.yaml::rms_norm_inputs[none-wsqr-cpu]" in out
    for producer in ("permute_0213", "view_gap"):
        assert f"FAILED gradgate_inputs.yaml::rms_norm_inputs[from_{producer}-none-wsqr-cpu]" in out
    assert "a reaches the op through producer 'permute_0213' (non-contiguous)" in out
    upstream = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={default_ggml}", *args)
    upstream.assert_outcomes(passed=3)
    # the built-in suite sees it through its rms_norm producer items (without them, the variant's
    # built-in rms_norm items end exactly as upstream's: x was always a contiguous leaf)
    builtin = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", "-k", "rms_norm and from_",
                                            "-p", "no:cacheprovider", "-rf")
    builtin.stdout.fnmatch_lines(["FAILED pytest_gradgate/cases.yaml::rms_norm[[]from_permute_0213-none-wsqr-cpu[]]*",
                                  "FAILED pytest_gradgate/cases.yaml::rms_norm[[]from_view_gap-none-wsqr-cpu[]]*"])


@pytest.mark.slow
def test_a_producer_whose_own_backward_is_wrong_is_not_blamed_on_the_op(pytester, ggml_variant):
    """transpose-half: TRANSPOSE's backward halves the gradient. A case through producer
    `transpose` ends producer-failed (the op, cont, is not blamed: it has no TRANSPOSE of its
    own), the same case through `none` passes; one whose TRANSPOSE backward aborts (ne2 = 7)
    dies in the self-check, and that is the producer's failure too."""
    root, _ = ggml_variant("transpose-half")
    pytester.makefile(".yaml", gradgate_selfcheck="""\
cases:
  - name: cont_input
    params: {a: [4, 3, 2]}
    graph: cont(a)
    consumers: [none]
    producers: [none, transpose]
  - name: cont_input_dies
    params: {a: [4, 3, 7]}
    graph: cont(a)
    consumers: [none]
    producers: [transpose]
""")
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", "--gradgate-no-builtin",
                                           "gradgate_selfcheck.yaml", "-p", "no:cacheprovider", "-rA",
                                           "--gradgate-json=report.json")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*cont_input[[]from_transpose-none-sqr-cpu[]]*producer 'transpose' fails on its "
                                 "own in this ggml, with no op after it (its gradient is wrong: MAA*"])
    import json
    cases = {c["id"]: c for c in json.loads((pytester.path / "report.json").read_text())["cases"]}
    bad = cases["cont_input[from_transpose-none-sqr-cpu]"]
    assert (bad["status"], bad["phase"], bad["producer"]) == ("producer-failed", "producer-check", "transpose")
    assert cases["cont_input[none-sqr-cpu]"]["status"] == "passed"
    # a producer that kills the process in its self-check is the producer's death too
    dead = cases["cont_input_dies[from_transpose-none-sqr-cpu]"]
    assert (dead["status"], dead["phase"]) == ("producer-failed", "producer-check")
    assert "producer 'transpose' fails on its own in this ggml, with no op after it (ggml: " in dead["diagnosis"]


def test_a_forward_that_rejects_the_layout_is_a_skip_that_says_so(pytester):
    """sqr's CPU forward asserts contiguous rows: through producer transpose nothing about its
    backward can be checked, and the item says why instead of failing on the forward's assert
    (which would blame the op's backward for its forward's limit)."""
    pytester.makefile(".yaml", gradgate_fwd="""\
cases:
  - name: sqr_input
    params: {a: [4, 3, 2]}
    graph: sqr(a)
    consumers: [none]
    producers: [none, transpose]
""")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_fwd.yaml",
                                           "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*producer 'transpose': the op's forward does not take its input laid out "
                                 "so in this ggml (ggml: *GGML_ASSERT(*) failed); nothing about the backward was checked"])


def test_a_forward_that_misreads_the_layout_is_the_forwards_failure_not_the_backwards(pytester):
    """ggml 0.15.3's SUM and GET_ROWS forwards read a transposed input as if its rows were
    contiguous: the loss itself is then wrong, the finite differences differentiate that wrong
    forward, and before the forward was compared with a contiguous copy these items failed with
    a confident diagnosis of the backward ("values disagree", "right values at wrong positions").
    Now the forward's own failure is the verdict and the backward is not blamed. An op whose
    forward copes (SILU, whose SILU_BACK misreads the permuted x) still reaches the backward."""
    pytester.makefile(".yaml", gradgate_fwd_wrong="""\
cases:
  - name: sum_input
    params: {a: [4, 3]}
    graph: sum(a)
    consumers: [none]
    producers: [none, transpose]
  - name: get_rows_input
    params: {a: [4, 6]}
    inputs: {rows: {shape: [5], type: i32, values: [0, 2, 2, 5, 1]}}
    graph: get_rows(a, rows)
    consumers: [none]
    producers: [transpose]
  - name: silu_input
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [none]
    producers: [permute_0213]
""")
    pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_fwd_wrong.yaml",
                                  "-p", "no:cacheprovider", "--gradgate-json", "r.json")
    import json
    cases = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["cases"]}
    for item in ("sum_input[from_transpose-none-sqr-cpu]", "get_rows_input[from_transpose-none-sqr-cpu]"):
        r = cases[item]
        assert (r["status"], r["phase"]) == ("failed", "producer-forward"), r
        assert "than on a contiguous copy of the same input" in r["diagnosis"]
        assert "so the backward was not checked" in r["diagnosis"]
    assert cases["sum_input[none-sqr-cpu]"]["status"] == "passed"
    silu = cases["silu_input[from_permute_0213-none-sqr-cpu]"]
    assert (silu["status"], silu["phase"]) == ("failed", "done")
    assert "through producer 'permute_0213'" in silu["diagnosis"]


def test_the_fixture_takes_a_producer(pytester):
    pytester.makepyfile(test_fixture_producer="""
        def test_rms_norm_input(gradgate):
            res = gradgate.check("rms_norm(a)", params={"a": [4, 3, 2]}, producer="permute_0213", loss="wsqr")
            assert res.status == "passed"
            res = gradgate.run("silu(a)", params={"a": [4, 3, 2]}, producer="permute_0213")
            assert res.status == "failed" and "through producer 'permute_0213'" in res.diagnosis
    """)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "test_fixture_producer.py",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
