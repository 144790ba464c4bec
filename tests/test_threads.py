"""The threads axis: every case's analytic backward runs on several CPU threads (3 by
default), its finite differences on one, so a kernel that loses a row at a thread boundary
is caught. The bug is real: the thread-boundary variant of the default ggml has a SILU_BACK
kernel in which each thread but the last stops one row short (tests/ggml_variants.py).

Before the threads axis (the engine always computed on one thread) the built-in silu items
passed on that variant.
"""

import pytest

CASES = """\
cases:
  - name: silu_rows
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [none]
  - name: silu_one_thread
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [none]
    threads: 1
"""


@pytest.mark.slow
def test_a_row_lost_at_a_thread_boundary_fails_the_builtin_suite_and_passes_on_one_thread(pytester, ggml_variant):
    root, _ = ggml_variant("thread-boundary")
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", "-k", "silu and none",
                                           "-p", "no:cacheprovider", "-rf")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["FAILED pytest_gradgate/cases.yaml::silu[[]none-sqr-cpu[]]*"])
    pytester.makefile(".yaml", gradgate_threads=CASES)
    result = pytester.runpytest_subprocess("--gradgate", f"--gradgate-ggml-src={root}", "--gradgate-no-builtin",
                                           "gradgate_threads.yaml",
                                           "-p", "no:cacheprovider", "-rA")
    result.stdout.fnmatch_lines(["*silu_rows[[]none-sqr-cpu[]]: FAILED (*backward on 3 threads)*"])
    result.assert_outcomes(passed=1, failed=1)
    assert "PASSED gradgate_threads.yaml::silu_one_thread[none-sqr-cpu]" in result.stdout.str()


def test_threads_must_be_a_positive_integer(pytester):
    pytester.makefile(".yaml", gradgate_bad="""\
cases:
  - name: zero_threads
    params: {a: [4, 3]}
    graph: silu(a)
    threads: 0
""")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "gradgate_bad.yaml",
                                           "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*gradgate_bad.yaml:5: 'threads' must be an integer from 1 to 512, got 0*"])
