"""The `gradgate` fixture end to end, through real pytest runs on the default ggml.

On ggml 0.15.3 (CPU): MUL_MAT's backward takes a gradient that arrives through
permute(0,2,1,3)+transpose (passes); SILU's gives wrong values through a transpose (fails
with a diagnosis); SQRT's aborts in ggml_div through a transpose (a crash, which must be
one failed test while the next test still runs); REGLU has no backward at all.
"""

import textwrap

import pytest

from pytest_gradgate.library.cache import cache_root

USER_CACHE = cache_root()    # read before pytester moves HOME: the cache holding the default build


@pytest.fixture
def run_tests(pytester, monkeypatch, default_build):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))

    def run(source, *args):
        pytester.makepyfile(test_checks=textwrap.dedent(source))
        return pytester.runpytest("-p", "no:cacheprovider", "-rA", *args)
    return run


def test_checks_pass_fail_crash_and_lack_a_backward(run_tests):
    result = run_tests("""
        import json

        def test_passes(gradgate):
            r = gradgate.check("mul_mat(a, b)", params={"a": [4, 3, 2], "b": [4, 5, 2]},
                               consumer="permute_0213_transpose")
            assert r.ok and r.status == "passed" and r.power is True
            assert r.maa < r.limit and r.cosine > 0.999
            print(r.report())

        def test_wrong_values(gradgate):
            gradgate.check("silu(a)", params={"a": [4, 3, 2]}, consumer="transpose")

        def test_crash(gradgate):
            gradgate.check("sqrt(a)", params={"a": [4, 3, 2]}, init={"a": [0.3, 1.0]}, consumer="transpose")

        def test_after_the_crash(gradgate):
            gradgate.check("sqrt(a)", params={"a": [4, 3, 2]}, init={"a": [0.3, 1.0]}, loss="wsqr")

        def test_no_backward(gradgate):
            gradgate.check("reglu(a)", params={"a": [4, 3, 2]})

        def test_run_returns_without_failing(gradgate):
            r = gradgate.run("silu(a)", params={"a": [4, 3, 2]}, consumer="transpose")
            assert not r.ok and r.status == "failed" and r.maa > 0.1
            assert r.params[0]["name"] == "a" and len(r.params[0]["analytic_values"]) == 24
            json.dumps(r.result.to_dict())      # plain data all the way down

        def test_invalid_check(gradgate):
            gradgate.check("concat(a, b, axis=1)", params={"a": [4, 3], "b": [4, 2]})
        """)
    result.assert_outcomes(passed=3, failed=4)
    out = result.stdout.str()
    # the passing check's readable report: where it was declared, metrics per param
    result.stdout.fnmatch_lines([
        "test_passes-1[[]permute_0213_transpose-sqr-cpu[]]: PASSED (phase done, op mul_mat, *",
        "  declared at *test_checks.py:4",
        "  param a [[]4, 3, 2, 1[]]: MAA * (limit *), cosine 1.0000, *power yes",
    ])
    # a failed check fails its test with the diagnosis and the worst elements
    result.stdout.fnmatch_lines([
        "*_ test_wrong_values _*",
        "test_wrong_values-1[[]transpose-sqr-cpu[]]: FAILED (phase done, op silu, consumer transpose, *",
        "  diagnosis: a: *",
        "*param a [[]4, 3, 2, 1[]]: MAA * (limit *), cosine *",
        "      at [[]*[]]: analytic * numeric *",
    ])
    # the abort is one failed test with ggml's message; the next test ran in a fresh child
    result.stdout.fnmatch_lines([
        "*_ test_crash _*",
        "test_crash-1[[]transpose-sqr-cpu[]]: CRASHED (phase compute, op sqrt, *",
        "  diagnosis: ggml aborted in phase compute: *GGML_ASSERT(*) failed",
        "  signal: SIGABRT",
    ])
    result.stdout.fnmatch_lines(["PASSED test_checks.py::test_after_the_crash"])
    # a user's own check of an op without backward fails (the built-in suite would skip it)
    result.stdout.fnmatch_lines(["*_ test_no_backward _*", "*diagnosis: no backward for REGLU in this ggml"])
    # a bad declaration is a clear message at the test's line, not a traceback into the plugin
    result.stdout.fnmatch_lines(["*invalid gradgate check: *test_checks.py:29: *concat: unknown keyword 'axis'*"])
    assert "Traceback" not in out


STORY = """
    def test_story(gradgate):
        story = dict(params={"a": [4, 3, 5, 1], "b": [4, 2, 5, 1]}, consumer="permute_0213_transpose")
        blind = gradgate.run("concat(a, b, dim=1)", loss="sum", **story)
        assert blind.status == "passed" and blind.power is False     # SUM cannot see the bug
        gradgate.check("concat(a, b, dim=1)", **story)
    """


@pytest.mark.slow
@pytest.mark.parametrize("variant, passes", [("concat-fixed", True), ("concat-buggy", False)])
def test_the_story_through_the_fixture(variant, passes, ggml_variant, run_tests):
    """DESIGN.md's story as a user would write it: ggml patched with a CONCAT backward that
    slices the gradient assuming its first stride is the element size fails the check (and
    the same check with a SUM loss passes, blind); the fixed backward passes."""
    root, _ = ggml_variant(variant)
    result = run_tests(STORY, f"--gradgate-ggml-src={root}")
    if passes:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*diagnosis: *right values at wrong positions*"])
