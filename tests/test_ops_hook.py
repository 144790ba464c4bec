"""The pytest_gradgate_ops hook (hookspecs.py): ops declared from a conftest.py, as a case file's
top-level `ops:` for every case file of the run, and drawn by --gradgate-explore (issue 43)."""

import pytest

from ggml_variants import WALK_SCALE_PROTOTYPE
from pytest_gradgate.gate.selection import PACKAGE_DIR
from pytest_gradgate.library.cache import cache_root

DEFAULT_BASELINE = str(PACKAGE_DIR / "gate" / "baseline_default.json")
# in the default ggml, not in the op table
SCALE_BIAS = ("struct ggml_tensor * ggml_scale_bias(struct ggml_context * ctx, struct ggml_tensor * a, float s, "
              "float b);")
CASES = """\
cases:
  - name: scale_bias
    params: {a: [4, 3, 2]}
    graph: scale_bias(a, s=0.5, b=1.0)
    consumers: [none]
"""


@pytest.fixture(autouse=True)
def gradgate_cache(monkeypatch):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))


def test_ops_from_the_hook_are_declared_for_every_case_file(pytester, default_build):
    """Seen failing with the hook's ops not given to the loader (gate/items.py): the case was an
    error, "unknown op 'scale_bias'"."""
    pytester.makeconftest(f"""
        def pytest_gradgate_ops(config):
            return {{"scale_bias": {SCALE_BIAS!r}}}
    """)
    pytester.makefile(".yaml", gradgate_bias=CASES)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "gradgate_bias.yaml")
    result.assert_outcomes(passed=1)


def test_a_bad_prototype_from_the_hook_stops_the_run_naming_the_hook(pytester):
    pytester.makeconftest("""
        def pytest_gradgate_ops(config):
            return {"scale_bias": "struct ggml_tensor * ggml_scale_bias(struct ggml_context * ctx, float s"}
    """)
    pytester.makefile(".yaml", gradgate_bias=CASES)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                                           "gradgate_bias.yaml")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*gradgate: pytest_gradgate_ops hook: op 'scale_bias': the prototype does not "
                                 "parse*"])


def test_an_unknown_argument_of_the_hook_is_refused_by_pluggy(pytester):
    """The spec is registered (plugin.py pytest_addhooks), so pluggy checks an implementation's
    argument names: a misspelt one is an error at startup, not a hook never called."""
    pytester.makeconftest("""
        def pytest_gradgate_ops(cfg):
            return {}
    """)
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "pytest_gradgate_ops" in result.stdout.str() + result.stderr.str()


@pytest.mark.slow
def test_gradgate_explore_draws_the_hooks_ops(pytester, ggml_variant):
    """`pytest --gradgate-explore` over walk-scale-wrong with walk_scale declared by the hook alone:
    the planted wrong backward is a failed finding item. Seen failing without the hook's ops in
    gate/explore.py: "unknown op(s) walk_scale", a usage error."""
    root, _ = ggml_variant("walk-scale-wrong")
    pytester.makeconftest(f"""
        def pytest_gradgate_ops(config):
            return {{"walk_scale": {{"c": {WALK_SCALE_PROTOTYPE + ";"!r}, "ranges": {{"s": [-2.0, 2.0]}}}}}}
    """)
    result = pytester.runpytest_subprocess("--gradgate-explore=5s", "--gradgate-explore-ops=walk_scale",
                                           f"--gradgate-ggml-src={root}", f"--gradgate-baseline={DEFAULT_BASELINE}",
                                           "--gradgate-explore-database=", "-p", "no:cacheprovider", "-rf")
    assert result.ret == 1, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["FAILED explore::explore_walk_scale_*"])
