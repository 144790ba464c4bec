"""The `gradgate` fixture end to end, through real pytest runs on the default ggml.

On ggml 0.15.3 (CPU): MUL_MAT's backward takes a gradient that arrives through
permute(0,2,1,3)+transpose (passes); SILU's gives wrong values through a transpose (fails
with a diagnosis); SQRT's aborts in ggml_div through a transpose (a crash, which must be
one failed test while the next test still runs); REGLU has no backward at all.
"""

import json
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
    # once, not again after "During handling of the above exception" (pytest.fail inside the
    # except block printed it twice; seen failing so)
    assert "During handling" not in out
    failure = out.split("_ test_invalid_check _")[1].split("=====")[0]
    assert failure.count("unknown keyword 'axis'") == 1, failure


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


PLURALS = """
    def test_consumers(gradgate):
        gradgate.check("silu(a)", params={"a": [4, 3, 2]}, consumers=["none", "transpose"])

    def test_producers(gradgate):
        gradgate.check("silu(a)", params={"a": [4, 3, 2]}, producers=["none", "permute_0213"])

    def test_vary(gradgate):
        gradgate.check("silu(a)", params={"a": [4, "$n", 2]}, consumer="$c",
                       vary=[{"n": 3, "c": "none"}, {"n": 5, "c": "transpose"}])

    def test_run_returns_every_result(gradgate):
        r = gradgate.run("silu(a)", params={"a": [4, 3, 2]}, consumers=["none", "transpose"])
        assert [x.case_id for x in r] == ["test_run_returns_every_result-1[none-sqr-cpu]",
                                          "test_run_returns_every_result-1[transpose-sqr-cpu]"]
        assert [x.ok for x in r] == [True, False] and not r.ok

    def test_every_case_passes(gradgate):
        r = gradgate.check("mul_mat(a, b)", params={"a": [4, 3, 2], "b": [4, 5, 2]},
                           consumers=["none", "permute_0213_transpose"])
        assert len(r) == 2 and r.ok

    def test_singular_and_plural(gradgate):
        gradgate.check("silu(a)", params={"a": [4, 3, 2]}, consumer="none", consumers=["transpose"])
    """


def test_a_call_that_declares_several_cases_checks_every_one(run_tests):
    """The fixture takes YAML's plural keys with YAML's meaning, and checks every case a call
    declares. Before: `**fields` replaced the one-consumer list, build_cases made one case per
    consumer and only the first (consumer none) was checked, so `consumers=["none", "transpose"]`
    passed on the default ggml, whose SILU backward fails through a transpose; the same with
    `producers=` (SILU_BACK fails through permute_0213) and `vary` was ignored ("got [4, '$n', 2]").
    Seen failing on that code: test_consumers and test_producers passed, test_vary was an
    invalid check, test_run_returns_every_result got one result."""
    result = run_tests(PLURALS)
    result.assert_outcomes(passed=2, failed=4)
    result.stdout.fnmatch_lines([
        "*_ test_consumers _*",
        "test_consumers-1[[]transpose-sqr-cpu[]]: FAILED (phase done, op silu, consumer transpose, *",
    ])
    result.stdout.fnmatch_lines([
        "*_ test_producers _*",
        "test_producers-1[[]from_permute_0213-none-sqr-cpu[]]: FAILED (*",
    ])
    result.stdout.fnmatch_lines([
        "*_ test_vary _*",
        "test_vary-1,n=5,c=transpose[[]transpose-sqr-cpu[]]: FAILED (*",
    ])
    out = result.stdout.str()
    # a passing case of a failed call is not reported as a failure
    assert "test_consumers-1[none-sqr-cpu]: FAILED" not in out
    assert "test_vary-1,n=3,c=none[none-sqr-cpu]: FAILED" not in out
    result.stdout.fnmatch_lines(["PASSED test_checks.py::test_run_returns_every_result",
                                 "PASSED test_checks.py::test_every_case_passes"])
    result.stdout.fnmatch_lines(["*invalid gradgate check: *test_checks.py:23: consumer= and consumers= both given*"])


WITH_AND_WITHOUT = """
    import sys

    def test_plain():
        assert True

    def test_silu_through_a_transpose(gradgate):
        gradgate.check("silu(a)", params={"a": [4, 3, 2]}, consumer="transpose")
    """
# which of the heavy parts the run imported (docs/install.md: none without the gate), written at its end
IMPORTS_AT_THE_END = """
import json, sys
def pytest_unconfigure(config):
    heavy = sorted(m for m in sys.modules if m in ("numpy", "cffi", "yaml", "pytest_gradgate.library.cmake",
                                                   "pytest_gradgate.isolation.parent", "pytest_gradgate.declare.loader"))
    (config.rootpath / "imported.json").write_text(json.dumps(heavy))
"""


@pytest.mark.parametrize("args, fixture_test, note", [
    ((), "failed", True),                                   # asked for by the test: it runs, and says so
    (("-m", "not gradgate"), None, False),                  # left out: nothing of the gate runs
    (("--gradgate", "--gradgate-no-builtin"), "failed", False),
])
def test_fixture_tests_run_with_or_without_the_gradgate_option(pytester, monkeypatch, default_build, args,
                                                               fixture_test, note):
    """A test that asks for the `gradgate` fixture asks for its check: it runs with or without
    --gradgate (a skip would let a project's plain `pytest` in CI pass without checking), with
    the same outcome: here a failure, SILU's backward through a transpose being wrong on the
    default ggml. Without --gradgate one line after collection says so and how to leave them
    out; `-m "not gradgate"` does, and then nothing of the gate is imported or built, which is
    what "stays out of the way" promises. Before: no line said why a plain `pytest` built ggml,
    and the README said the plugin stayed out of the way without --gradgate (seen failing on the
    first row)."""
    from pytest_gradgate.plugin import FIXTURE_TESTS_RUN
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))
    pytester.makepyfile(test_checks=textwrap.dedent(WITH_AND_WITHOUT))
    pytester.makeconftest(IMPORTS_AT_THE_END)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, "test_checks.py")
    outcomes = {"passed": 1, "failed": 1} if fixture_test else {"passed": 1, "deselected": 1}
    result.assert_outcomes(**outcomes)
    note_line = FIXTURE_TESTS_RUN.format(count=1, tests="test uses")
    assert (note_line in result.stdout.str()) is note, result.stdout.str()
    imported = json.loads((pytester.path / "imported.json").read_text())
    if fixture_test:
        result.stdout.fnmatch_lines(["FAILED test_checks.py::test_silu_through_a_transpose*"])
        assert "pytest_gradgate.library.cmake" in imported
    else:
        assert imported == [], imported
        assert "gradgate:" not in result.stdout.str(), result.stdout.str()
