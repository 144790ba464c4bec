"""A concentrated error: most of it in a few elements, the others right. It is said so, and the
elements are named, by the finite-difference check (metrics.diagnose), the equivalence
comparator (gradsets.diagnose) and so the parity items, which use it.

On a real build: ggml_variants.py 'last-element' gets the last element of SILU's backward
wrong (the incoming gradient alone, as if silu'(x) were 1) and every other element right.
Before check/concentration.py both the finite differences and the parity item called it
"an error spread over the elements", as CUDA's one-element bug was called on an H200; with
the concentration check taken out, the two tests on that variant fail that way (seen).
"""

import textwrap

import numpy as np
import pytest

from pytest_gradgate.check import concentration, gradsets
from pytest_gradgate.check.outcome import Diagnosis, Status
from pytest_gradgate.declare.case import Case
from pytest_gradgate.library.cache import cache_root


def _diagnose_sets(a, b, shape):
    m = gradsets.compare_values(a, b, gradsets.nmse_limit(10, 10), shape, ("tested", "reference"))
    assert not m["passed"]
    return gradsets.diagnose(a, b, m, ("tested", "reference"), shape)


def test_three_wrong_elements_of_24_are_named_and_a_spread_error_is_not_called_concentrated():
    rng = np.random.default_rng(1)
    b = rng.uniform(-1, 1, 24)
    a = b.copy()
    a[[5, 11, 23]] += [0.3, -0.2, 0.4]
    kind, text = _diagnose_sets(a, b, [4, 3, 2, 1])
    assert kind == Diagnosis.CONCENTRATED
    assert text.startswith("3 of 24 elements wrong: [1, 1, 0, 0], [3, 2, 0, 0], [3, 2, 1, 0] (100% of the error)")
    one = b.copy()
    one[23] *= 1.5
    assert "1 of 24 elements wrong: the last element [3, 2, 1, 0]" in _diagnose_sets(one, b, [4, 3, 2, 1])[1]
    spread = b * (1 + rng.uniform(-1e-3, 1e-3, 24))
    assert _diagnose_sets(spread, b, [4, 3, 2, 1])[0] == Diagnosis.DISAGREE


def test_a_few_that_do_not_explain_the_failure_are_not_named():
    """The claim is verified: without the few elements the rest must pass."""
    diff = np.zeros(64)
    diff[3] = 20.0
    diff[4:] = 0.5      # 90% of the error in one element, but the others are wrong too
    assert concentration.concentrated(diff, lambda i: [i], lambda keep: False) is None
    assert concentration.concentrated(diff, lambda i: [i], lambda keep: True).startswith("1 of 64 elements wrong: [3]")


@pytest.mark.slow
def test_a_one_element_error_of_a_real_backward_is_concentrated_naming_the_element(run_on):
    r = run_on("last-element", Case(name="silu", graph="silu(x)", params={"x": [4, 3, 2]}))
    assert r.status == Status.FAILED and r.kind == Diagnosis.CONCENTRATED
    assert r.diagnosis.startswith("x: 1 of 24 elements wrong: the last element [3, 2, 1, 0]")


@pytest.mark.slow
def test_a_parity_item_names_the_one_element_the_tested_tree_changed(pytester, monkeypatch, ggml_variant,
                                                                      default_ggml):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache_root()))
    for name in ("GITHUB_ACTIONS", "GRADGATE_GGML_SRC", "GRADGATE_BASELINE", "GRADGATE_REFERENCE_SRC"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "gradgate_silu.yaml").write_text(textwrap.dedent("""\
        cases:
          - name: silu_rows
            params: {x: [64, 8]}
            graph: silu(x)
            consumers: [none]
        """))
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_silu.yaml",
                                           "--gradgate-ggml-src", str(ggml_variant("last-element")[0]),
                                           "--gradgate-reference-src", str(default_ggml), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*silu_rows[[]none-sqr-cpu-vs-reference[]]*the tested side changed the gradient "
                                 "of x (against the reference side): x: 1 of 512 elements wrong: the last element "
                                 "[[]63, 7, 0, 0[]]*"])
