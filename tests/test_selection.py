"""What a run selects and under which config, through real `pytest --gradgate` runs:
built-in ids pasted back, `file.yaml::id`, --lf/--ff/--sw, the fixture's marker, a ggml
tree given with a space that must not become pytest's rootdir, and the order items run in.

Each test names what it caught before the change that it guards.
"""

import json
import os
import re
from pathlib import Path

import pytest

from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.declare.case import Case
from pytest_gradgate.gate.order import LONG_WORK, estimated_work, long_first

USER_CACHE = cache_root()      # read before pytester moves HOME
DUP_ID = "pytest_gradgate/cases.yaml::dup[none-sqr-cpu]"
MY_CASES = """\
cases:
  - name: my_add
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none, transpose]
  - name: my_silu            # SILU's backward ignores grad's strides on ggml 0.15.3: transpose fails
    params: {a: [4, 3]}
    graph: silu(a)
    consumers: [none, transpose]
"""


@pytest.fixture(autouse=True)
def user_cache(monkeypatch, default_build):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GRADGATE_GGML_SRC", "GRADGATE_BASELINE", "GRADGATE_CASES"):
        monkeypatch.delenv(name, raising=False)


def ran(result):
    """Node ids that ran, in the order they ran: the `-v` lines."""
    return re.findall(r"^(\S+\.yaml::\S+) (?:PASSED|FAILED|XFAIL|XPASS|ERROR|SKIPPED)", result.stdout.str(), re.M)


def test_a_builtin_id_pasted_back_selects_exactly_that_item(pytester):
    """Before: 'file or directory not found: pytest_gradgate/cases.yaml::dup[none-sqr-cpu]'."""
    result = pytester.runpytest_subprocess("--gradgate", DUP_ID, "-v", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    assert ran(result) == [DUP_ID]
    result.assert_outcomes(passed=1)


def test_where_the_package_is_installed_is_no_keyword_of_the_builtin_items(pytester):
    """Before: the built-in items' keywords held every folder on the way to the installed
    package (site-packages, lib, the venv's name...): `-k <that folder>` selected all 604
    of them, and `-k "not <it>"` none."""
    import pytest_gradgate
    folder = Path(pytest_gradgate.__file__).resolve().parent.parent.name   # e.g. site-packages
    pytester.makeconftest(
        "def pytest_collection_finish(session):\n"
        "    with open('keywords.txt', 'w') as f:\n"
        "        f.write(repr(sorted(session.items[0].keywords)))\n")
    result = pytester.runpytest_subprocess("--gradgate", DUP_ID, "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    keywords = (pytester.path / "keywords.txt").read_text()
    assert repr(folder) not in keywords and "'pytest_gradgate'" not in keywords, keywords
    result = pytester.runpytest_subprocess("--gradgate", "--collect-only", "-q", "-p", "no:cacheprovider",
                                           "-k", f"not {folder}", DUP_ID)
    assert "1 test collected" in result.stdout.str(), result.stdout.str()


def test_a_user_file_id_selects_that_item_only(pytester):
    """Before: every built-in item ran as well (the built-in files were always appended)."""
    pytester.makefile(".yaml", gradgate_mine=MY_CASES)
    result = pytester.runpytest_subprocess("--gradgate", "gradgate_mine.yaml::my_add[transpose-sqr-cpu]", "-v",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    assert ran(result) == ["gradgate_mine.yaml::my_add[transpose-sqr-cpu]"]


def test_an_id_printed_for_a_project_file_pastes_back_from_another_folder(pytester, monkeypatch):
    """Issue 52: a run from outside a fork's checkout printed `tests/gradgate_cases.yaml::...`
    (relative to the fork's root), and the id pasted into the same command from that folder was
    `file or directory not found`, rc 4."""
    fork = pytester.path / "fork"
    (fork / "tests").mkdir(parents=True)
    (fork / ".git").mkdir()
    (fork / "tests" / "gradgate_cases.yaml").write_text(MY_CASES)
    elsewhere = pytester.path / "elsewhere"
    elsewhere.mkdir()
    command = ("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider", "--gradgate-cases",
               "../fork/tests/gradgate_cases.yaml", "--rootdir", str(elsewhere))
    monkeypatch.chdir(elsewhere)
    first = pytester.runpytest_subprocess(*command, "-rf")
    failed = re.findall(r"^FAILED (\S+::my_silu\[transpose-sqr-cpu\])", first.stdout.str(), re.M)
    assert failed == ["tests/gradgate_cases.yaml::my_silu[transpose-sqr-cpu]"], first.stdout.str()
    again = pytester.runpytest_subprocess(*command, failed[0], "-q")
    assert again.ret == pytest.ExitCode.TESTS_FAILED, again.stdout.str() + again.stderr.str()
    again.assert_outcomes(failed=1)


def test_lf_ff_and_sw_rerun_the_failures_of_user_and_builtin_files(pytester):
    """Before: `--lf` reran every item of the built-in files, which are initial paths of every
    run (pytest keeps all items of an initial path); here the built-in silu items fail too,
    since the empty baseline knows no failure."""
    pytester.makefile(".yaml", gradgate_mine=MY_CASES)
    empty = pytester.path / "empty-baseline.json"
    empty.write_text(json.dumps({"schema": 2, "ggml_version": "0.15.3", "entries": {}}))
    base = ["--gradgate", "--gradgate-baseline", str(empty), "-v", "-rf", "-k", "silu or add"]
    first = pytester.runpytest_subprocess(*base, "--gradgate-cases", "gradgate_mine.yaml")
    failed = set(re.findall(r"^FAILED (\S+)", first.stdout.str(), re.M))
    assert "gradgate_mine.yaml::my_silu[transpose-sqr-cpu]" in failed
    assert any(f.startswith("pytest_gradgate/cases.yaml::silu[") for f in failed), failed
    total = len(ran(first))
    assert total > len(failed) + 2

    again = pytester.runpytest_subprocess(*base, "--gradgate-cases", "gradgate_mine.yaml", "--lf")
    assert set(ran(again)) == failed, again.stdout.str()
    again.stdout.fnmatch_lines(["*run-last-failure: rerun previous * failure*"])

    first_failed = pytester.runpytest_subprocess(*base, "--gradgate-cases", "gradgate_mine.yaml", "--ff")
    order = ran(first_failed)
    assert set(order[:len(failed)]) == failed and len(order) == total

    step = pytester.runpytest_subprocess(*base, "--gradgate-cases", "gradgate_mine.yaml", "--sw")
    stopped_at = re.findall(r"^FAILED (\S+)", step.stdout.str(), re.M)
    assert len(stopped_at) == 1 and step.ret == pytest.ExitCode.INTERRUPTED   # how --sw stops
    resumed = pytester.runpytest_subprocess(*base, "--gradgate-cases", "gradgate_mine.yaml", "--sw")
    assert ran(resumed)[0] == stopped_at[0]   # --sw starts again at the failure it stopped at


def test_tests_that_use_the_fixture_carry_the_gradgate_marker(pytester):
    pytester.makepyfile(test_mixed="""
        def test_uses_it(gradgate):
            pass

        def test_plain():
            pass
    """)
    result = pytester.runpytest_subprocess("-m", "gradgate", "--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["test_mixed.py::test_uses_it", "*1/2 tests collected (1 deselected)*"])


@pytest.mark.parametrize("spelling", ["space", "equals"])
def test_the_tree_under_test_never_becomes_rootdir_or_config(pytester, default_ggml, spelling):
    """A llama.cpp-shaped tree with a pyproject.toml of its own, whose addopts would deselect
    everything. Before, written with a space, pytest took the tree for a test path, made it
    the rootdir, and ran under its config (here: 0 selected, rc 5)."""
    tree = pytester.path / "llama.cpp"
    tree.mkdir()
    os.symlink(default_ggml, tree / "ggml")
    (tree / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-k nothing_is_selected"\n')
    option = ["--gradgate-ggml-src", str(tree)] if spelling == "space" else [f"--gradgate-ggml-src={tree}"]
    result = pytester.runpytest_subprocess("--gradgate", *option, "-k", "dup and none and not get_rows", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    assert f"rootdir: {pytester.path}\n" in out
    assert "configfile" not in out
    assert f"gradgate: ggml 0.15.3 from {tree}" in out
    assert result.parseoutcomes()["passed"] >= 1


LONG_LAST = """\
cases:
  - name: short_add
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none, transpose]
  - name: long_sqr           # a million elements in fast mode: far more work than the others
    params: {a: [1024, 1024]}
    graph: sqr(a)
    mode: fast
    consumers: [none, transpose]
  - name: short_neg
    params: {a: [4, 3]}
    graph: neg(a)
    consumers: [none]
    producers: [none]
"""


def test_long_cases_run_first_and_the_rest_as_collected(pytester):
    """Before: items ran in file order, so the suite's long fast-mode cases came last, and
    under -n 2 two of them could land on one xdist worker while the other core idled."""
    pytester.makefile(".yaml", gradgate_mine=LONG_LAST)
    args = ["--gradgate", "--gradgate-no-builtin", "--gradgate-cases", "gradgate_mine.yaml", "-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(*args, "-v")
    assert result.ret == 0, result.stdout.str()
    assert [i.split("::")[1] for i in ran(result)] == [
        "long_sqr[none-sqr-cpu]", "long_sqr[transpose-sqr-cpu]",
        "short_add[none-sqr-cpu]", "short_add[transpose-sqr-cpu]", "short_neg[none-sqr-cpu]"]
    # xdist runs a collection only if every worker collected the same items in the same order
    spread = pytester.runpytest_subprocess(*args, "-n", "2")
    assert spread.ret == 0, spread.stdout.str()
    spread.assert_outcomes(passed=5)


def ran_on(result):
    """{node id: the xdist worker that ran it}, from `-v` lines under -n ("[gw0] [ 20%] PASSED id")."""
    return dict((i, w) for w, i in re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] \w+ (\S+)\s*$", result.stdout.str(), re.M))


def test_under_xdist_the_long_cases_go_to_different_workers(pytester):
    """Before: xdist sent each worker a first chunk of consecutive items, so the long cases,
    run first, all went to one worker, which ran them one after the other (the built-in
    suite's five: 9-10 s under -n 2, the whole run under -n 16). Now items are dealt in turn
    (gate/xdist_schedule.py), unless the user chose how (--maxschedchunk)."""
    pytester.makefile(".yaml", gradgate_mine=LONG_LAST)
    args = ["--gradgate", "--gradgate-no-builtin", "--gradgate-cases", "gradgate_mine.yaml", "-p", "no:cacheprovider",
            "-n", "2", "-v"]
    long_ids = ["gradgate_mine.yaml::long_sqr[none-sqr-cpu]", "gradgate_mine.yaml::long_sqr[transpose-sqr-cpu]"]
    dealt = pytester.runpytest_subprocess(*args)
    assert dealt.ret == 0, dealt.stdout.str()
    workers = ran_on(dealt)
    assert len(workers) == 5 and workers[long_ids[0]] != workers[long_ids[1]], dealt.stdout.str()
    dealt.stdout.fnmatch_lines(["scheduling tests via DealtScheduling"])
    chosen = pytester.runpytest_subprocess(*args, "--maxschedchunk", "2")
    assert chosen.ret == 0, chosen.stdout.str()
    chosen.stdout.fnmatch_lines(["scheduling tests via LoadScheduling"])


def test_under_xdist_a_session_with_python_tests_keeps_xdists_chunks(pytester):
    """A module's tests stay together on one worker with xdist's own chunks (its module-scoped
    fixtures are set up once): with a Python test in the session, items are not dealt, and
    the first two (the long cases) go to one worker, as xdist sends consecutive items."""
    pytester.makefile(".yaml", gradgate_mine=LONG_LAST)
    pytester.makepyfile(test_zzz="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-no-builtin", "--gradgate-cases",
                                           "gradgate_mine.yaml", "-p", "no:cacheprovider", "-n", "2", "-v",
                                           "gradgate_mine.yaml", "test_zzz.py")
    assert result.ret == 0, result.stdout.str()
    workers = ran_on(result)
    assert len(workers) == 6, result.stdout.str()
    assert workers["gradgate_mine.yaml::long_sqr[none-sqr-cpu]"] == workers[
        "gradgate_mine.yaml::long_sqr[transpose-sqr-cpu]"], result.stdout.str()


def test_long_first_moves_only_the_long_cases_and_leaves_other_items_in_place():
    small = [Case(name=f"s{k}", graph="neg(a)", params={"a": [4, 3]}) for k in range(3)]
    long_ = Case(name="long", graph="sqr(a)", params={"a": [1024, 1024]}, mode="fast")
    longer = Case(name="longer", graph="sqr(a)", params={"a": [2048, 1024]}, mode="fast")
    assert estimated_work(small[0]) < LONG_WORK <= estimated_work(long_) < estimated_work(longer)
    entries = ["test_py_item", small[0], long_, "other_item", small[1], longer, small[2]]
    assert long_first(entries, lambda e: e if isinstance(e, Case) else None) == [
        "test_py_item", longer, long_, "other_item", small[0], small[1], small[2]]
    assert long_first(small) == small
