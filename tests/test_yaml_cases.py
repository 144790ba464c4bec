"""YAML case files through real pytest runs: bad input is an error at its file:line while the
other cases still run; where files come from; readable ids; reportinfo; the JSON Schema.

Runs use `--gradgate-no-builtin` and tiny cases (consumer `none`), so each costs about a
second on top of the cached default build.
"""

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

import pytest_gradgate
from pytest_gradgate.library.cache import cache_root
from pytest_gradgate.ops.consumers import CONSUMERS
from pytest_gradgate.declare.loader import CASE_KEYS, load_file
from pytest_gradgate.ops.losses import LOSSES

PACKAGE = Path(pytest_gradgate.__file__).parent
USER_CACHE = cache_root()    # read before pytester moves HOME: the cache holding the default build
GOOD = """\
  - name: good
    params: {a: [4, 3]}
    graph: sqr(a)
    consumers: [none]
"""


@pytest.fixture
def run_gate(pytester, tmp_path, monkeypatch, default_build):
    """Run pytest --gradgate in pytester's directory (without the built-in suite and with an
    empty baseline, so outcomes are the raw ones)."""
    # pytester points HOME elsewhere: keep using the cache that holds the default build
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(USER_CACHE))
    empty = tmp_path / "empty-baseline.json"
    empty.write_text(json.dumps({"schema": 2, "entries": {}}))

    def run(*args, builtin=False):
        if not (pytester.path / "tox.ini").exists():
            # a configured project: pytest --gradgate then discovers gradgate_*.yaml under it
            # (in a bare directory it checks the built-in suite only)
            pytester.makeini("[pytest]\n")
        # one token: pytest takes a bare path argument into account when it picks the rootdir
        base = ["--gradgate", "-p", "no:cacheprovider", f"--gradgate-baseline={empty}"]
        if not builtin:
            base.append("--gradgate-no-builtin")
        return pytester.runpytest(*base, *args)
    return run


# (case text, line of the error relative to the case's first line, text the error must show)
BAD_CASES = {
    "unknown op": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: frobnicate(a)
""", 2, "unknown op 'frobnicate'"),
    "wrong arity": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: mul(a)
""", 2, "mul takes 2 tensor argument(s) (a, b), got 1"),
    "unknown op keyword": ("""\
  - name: bad
    params: {a: [4, 3], b: [4, 2]}
    graph: concat(a, b, axis=1)
""", 2, "concat: unknown keyword 'axis'; signature is concat(a, b, dim=0)"),
    "unknown case keyword": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    tolerance: 1.0e-3
""", 3, "unknown key 'tolerance'"),
    "shape mismatch": ("""\
  - name: bad
    params: {a: [4, 3], b: [5, 3]}
    graph:
      - c = sqr(a)
      - mul_mat(c, b)
""", 4, "graph line 2 'mul_mat(c, b)': shape mismatch: mul_mat: a [4, 3, 1, 1] and b [5, 3, 1, 1] must share ne0"),
    "unknown consumer": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    consumers: [none, sideways]
""", 3, "unknown consumer 'sideways'; known: none, transpose"),
    "unknown loss": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    loss: cube
""", 3, "unknown loss 'cube'; known: sqr, wsqr, sum"),
    "bad tolerance": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    max_maa: 5
""", 3, "'max_maa' 5.0 would pass anything"),
    "bad eps": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    eps: -0.1
""", 3, "'eps' must be a positive number, got -0.1"),
    "duplicate key": ("""\
  - name: bad
    params: {a: [4, 3]}
    graph: sqr(a)
    graph: abs(a)
""", 3, "duplicate key 'graph' (first on line"),
    "duplicate name": ("""\
  - name: good
    params: {a: [4, 3]}
    graph: sqr(a)
""", 0, "duplicate case name 'good' (first declared on line 2)"),
}


def test_each_bad_case_is_an_error_at_its_line_and_the_good_cases_still_run(pytester, run_gate):
    """One file holding a good case, one bad case of each kind, and a good case again."""
    path = pytester.path / "gradgate_cases.yaml"
    text, expected, line = "cases:\n" + GOOD, {}, 2 + GOOD.count("\n")
    for kind, (case_text, offset, message) in BAD_CASES.items():
        expected[kind] = (line + offset, message)
        text += case_text
        line += case_text.count("\n")
    text += GOOD.replace("good", "good_after")
    path.write_text(text)
    result = run_gate("-rA")
    result.assert_outcomes(passed=2, errors=len(BAD_CASES))
    for kind, (bad_line, message) in expected.items():
        lines = [x for x in result.stdout.lines if x.startswith(f"invalid case: {path}:{bad_line}: ")]
        assert len(lines) == 1 and message in lines[0], (kind, lines)
    result.stdout.fnmatch_lines(["PASSED gradgate_cases.yaml::good[[]none-sqr-cpu[]]",
                                 "PASSED gradgate_cases.yaml::good_after[[]none-sqr-cpu[]]"])


def test_yaml_syntax_error_is_an_error_at_its_line_and_other_files_still_run(pytester, run_gate):
    broken = pytester.path / "gradgate_broken.yaml"
    broken.write_text("cases:\n  - name: x\n    params: {a: [4, 3]\n    graph: sqr(a)\n")
    (pytester.path / "gradgate_fine.yaml").write_text("cases:\n" + GOOD)
    result = run_gate("-rA")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"invalid case: {broken}:4: YAML syntax error: *"])


def test_cases_option_is_repeatable_and_ini_adds_files(pytester, run_gate):
    """--gradgate-cases PATH (twice) and ini gradgate_cases: files that no discovery rule
    would find (wrong name, outside the test paths) are collected."""
    elsewhere = pytester.mkdir("elsewhere")
    for name in ("one", "two", "three"):
        (elsewhere / f"{name}.yaml").write_text("cases:\n" + GOOD.replace("good", f"case_{name}"))
    (pytester.path / "tests").mkdir()
    pytester.makeini("[pytest]\ntestpaths = tests\ngradgate_cases =\n    elsewhere/three.yaml\n")
    result = run_gate("--co", "-q", f"--gradgate-cases={elsewhere / 'one.yaml'}",
                      f"--gradgate-cases={elsewhere / 'two.yaml'}")
    out = result.stdout.str()
    assert "case_one[none-sqr-cpu]" in out and "case_two[none-sqr-cpu]" in out
    # the command line overrides the ini key (CLI > env > ini), as for every setting
    assert "case_three" not in out
    result = run_gate("--co", "-q")
    assert "case_three[none-sqr-cpu]" in result.stdout.str()


def test_gradgate_yaml_files_are_discovered_under_test_paths_and_others_ignored(pytester, run_gate):
    sub = pytester.mkdir("tests")
    (sub / "gradgate_mine.yaml").write_text("cases:\n" + GOOD.replace("good", "discovered"))
    (sub / "other.yaml").write_text("cases:\n" + GOOD.replace("good", "ignored"))
    (sub / "config.yaml").write_text("not: [a, case, file]\n")
    result = run_gate("--co", "-q", "tests")
    out = result.stdout.str()
    assert "tests/gradgate_mine.yaml::discovered[none-sqr-cpu]" in out
    assert "ignored" not in out and "invalid" not in out


def test_ids_are_readable_and_selectable_with_k(pytester, run_gate):
    (pytester.path / "gradgate_ids.yaml").write_text(textwrap.dedent("""\
        cases:
          - name: concat_dim1
            params: {a: [4, 3, 5, 1], b: [4, 2, 5, 1]}
            graph: concat(a, b, dim=1)
            loss: [sqr, sum]
        """))
    result = run_gate("--co", "-q")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert len(ids) == 14       # (4 default consumers + 3 default producers) x 2 losses
    assert "gradgate_ids.yaml::concat_dim1[from_view_gap-none-sum-cpu]" in ids
    assert "gradgate_ids.yaml::concat_dim1[permute_0213_transpose-sqr-cpu]" in ids
    result = run_gate("--co", "-q", "-k", "permute_0213_transpose and sqr")
    assert [line for line in result.stdout.lines if "::" in line] == [
        "gradgate_ids.yaml::concat_dim1[permute_0213_transpose-sqr-cpu]"]


def test_reportinfo_points_at_the_case_line_in_junit_xml(pytester, run_gate):
    (pytester.path / "gradgate_where.yaml").write_text("cases:\n" + GOOD + GOOD.replace("good", "second"))
    xml = pytester.path / "junit.xml"
    result = run_gate(f"--junitxml={xml}", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=2)
    where = {tc.get("name"): (tc.get("file"), tc.get("line")) for tc in ET.parse(xml).iter("testcase")}
    # JUnit lines are 0-based like pytest's locations: the cases start on YAML lines 2 and 6
    assert where == {"good[none-sqr-cpu]": ("gradgate_where.yaml", "1"),
                     "second[none-sqr-cpu]": ("gradgate_where.yaml", "5")}


def test_user_case_for_an_op_without_backward_fails_with_that_reason(pytester, run_gate):
    """The built-in suite skips such a case (tests/test_builtin_suite.py); a user's own
    case declares that they need the backward, so it fails."""
    (pytester.path / "gradgate_mine.yaml").write_text(textwrap.dedent("""\
        cases:
          - name: my_reglu
            params: {a: [4, 3, 2]}
            graph: reglu(a)
            consumers: [none]
        """))
    result = run_gate("-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*diagnosis: no backward for REGLU in this ggml*"])


def test_builtin_case_for_an_op_without_backward_is_skipped_with_the_reason(pytester, run_gate):
    result = run_gate("-rs", "-k", "reglu and none", builtin=True)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no backward for REGLU in this ggml*"])


# -- the JSON Schema ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra: pip install -e '.[test]'")
    schema = json.loads((PACKAGE / "declare" / "cases.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_builtin_suite_is_valid_under_the_schema(validator):
    data = yaml.safe_load((PACKAGE / "cases.yaml").read_text())
    assert [e.message for e in validator.iter_errors(data)] == []


def test_schema_rejects_bad_cases(validator):
    data = yaml.safe_load("cases:\n" + GOOD + "".join(BAD_CASES[k][0] for k in
                                                        ("unknown case keyword", "unknown consumer",
                                                         "unknown loss", "bad tolerance", "bad eps")))
    data["cases"].append({"name": "no graph", "params": {"a": [0]}})
    bad = sorted({e.absolute_path[1] for e in validator.iter_errors(data)})
    assert bad == [1, 2, 3, 4, 5, 6]


def test_schema_names_the_same_keys_consumers_and_losses_as_the_loader():
    """Editors complete from the schema: it must not drift from what the loader accepts."""
    schema = json.loads((PACKAGE / "declare" / "cases.schema.json").read_text())
    defs = schema["$defs"]
    assert set(defs["caseFields"]["properties"]) == set(CASE_KEYS)
    assert defs["consumer"]["enum"] == list(CONSUMERS)
    assert defs["loss"]["enum"] == list(LOSSES)


@pytest.mark.parametrize("text, line, message", [
    ("defaults: [1]\ncases:\n  - name: x\n", 1, "'defaults' must be a mapping"),
    ("cases:\n  - name: [x]\n    params: {a: [4]}\n    graph: sqr(a)\n", 2, "'name' must be a string"),
    ("cases:\n  - name: p\n    params: {a: [4, 4]}\n    graph: pool_2d(a, s0=0)\n", 4, "s0=0 must be positive"),
    ("cases:\n  - name: i\n    params: {a: [4, 4]}\n    graph: im2col(a, a, d1=0)\n", 4, "d1=0 must be positive"),
    ("cases:\n  - name: t\n    params: {a: [4]}\n    graph: sqr(a)\n    timeout: .inf\n", 5, "must be a finite number"),
])
def test_values_no_check_foresaw_are_errors_at_their_line_not_tracebacks(text, line, message):
    """Each of these once escaped the loader as a TypeError/ZeroDivisionError traceback
    (losing the file's other cases); a good case after it still loads."""
    good = "  - name: good\n    params: {a: [4]}\n    graph: sqr(a)\n"
    loaded, errors = load_file("f.yaml", text=text + ("" if text.startswith("defaults") else good))
    assert [str(e) for e in errors] and str(errors[0]).startswith(f"f.yaml:{line}: ") and message in str(errors[0])
    if not text.startswith("defaults"):
        assert [c.name for c in loaded] == ["good"]


def test_editors_find_the_schema_by_a_documented_line_and_an_id_that_resolves():
    """The schema's $id is the raw URL of its own file in the repository (it used to point at
    a GitHub page, and to a path that no longer exists); docs/cases.md and the built-in files carry
    the yaml-language-server line that names it."""
    repo = PACKAGE.parent
    raw = "https://raw.githubusercontent.com/pytest-gradgate/pytest-gradgate/main/"
    for rel in ("pytest_gradgate/declare/cases.schema.json", "pytest_gradgate/report/report.schema.json"):
        assert json.loads((repo / rel).read_text())["$id"] == raw + rel
    line = f"# yaml-language-server: $schema={raw}pytest_gradgate/declare/cases.schema.json"
    assert line in (repo / "docs" / "cases.md").read_text()   # the README links to it
    for builtin in ("cases.yaml", "cases_fast.yaml", "cases_equivalence.yaml"):
        assert (PACKAGE / builtin).read_text().splitlines()[0] == line


# -- parameter axes (vary) ---------------------------------------------------------------------

VARY = """\
cases:
  - name: perm
    params: {a: [2, 3, 4, 5]}
    graph: permute(a, axes=$axes)
    consumers: [none]
    vary:
      axes: [[0, 1, 3, 2], [3, 2, 1, 0]]
  - name: mm
    params: {a: [4, 3, $n2, $n3], b: [4, 5, 6, 2]}
    graph: mul_mat(a, b)
    consumers: [none]
    vary: {n2: [1, 6], n3: [1, 2]}
  - name: listed
    params: {a: [4, 3]}
    graph: $op(a)
    consumers: [none]
    vary: [{op: sqr}, {op: nope}, {op: sqrt}]
"""


def test_vary_expands_one_entry_into_named_cases(tmp_path):
    """Before parameter axes, each point of an op's parameter space was a copy of the entry."""
    path = tmp_path / "gradgate_vary.yaml"
    path.write_text(VARY)
    loaded, errors = load_file(path)
    names = [entry.name for entry in loaded]
    assert names == ["perm,axes=0-1-3-2", "perm,axes=3-2-1-0", "mm,n2=1,n3=1", "mm,n2=1,n3=2", "mm,n2=6,n3=1",
                     "mm,n2=6,n3=2", "listed,op=sqr", "listed,op=sqrt"]
    cases = {e.name: e.cases[0] for e in loaded}
    assert cases["perm,axes=3-2-1-0"].graph == "permute(a, axes=[3, 2, 1, 0])"
    assert cases["mm,n2=6,n3=1"].params["a"] == [4, 3, 6, 1]     # a whole "$n2" is the value itself
    assert cases["mm,n2=6,n3=1"].id == "mm,n2=6,n3=1[none-sqr-cpu]"
    # one bad combination is one error at its line, naming it; the others still load
    assert len(errors) == 1 and errors[0].line == 15     # its graph: line
    assert str(errors[0]).startswith(f"{path}:15: listed,op=nope: ") and "unknown op 'nope'" in str(errors[0])


@pytest.mark.parametrize("vary, message", [
    ("{n: []}", "vary: 'n' must be a non-empty list of values"),
    ("[1, 2]", "'vary' must map names to lists of values"),
    ("{n: [1, 2], m: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], k: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], j: [1, 2, 3, 4, 5]}",
     "vary: 2 x 11 x 10 x 5 = 1100 combinations; at most 1000 per entry"),
    ("{'bad name': [1]}", "vary: 'bad name' is not a name"),
])
def test_bad_vary_is_one_error_at_its_line(tmp_path, vary, message):
    path = tmp_path / "gradgate_vary.yaml"
    path.write_text(f"cases:\n  - name: x\n    params: {{a: [4, 3]}}\n    graph: sqr(a)\n    vary: {vary}\n")
    loaded, errors = load_file(path)
    assert loaded == [] and len(errors) == 1
    assert str(errors[0]).startswith(f"{path}:5: {message}"), str(errors[0])


def test_yaml_spellings_of_booleans_are_booleans_in_an_expression():
    """`is_2d=false` was an unknown name 'false' (only Python's False was accepted)."""
    from pytest_gradgate.declare.expr import parse_expression
    call = parse_expression("im2col(kernel, a, is_2d=false, s0=1)")
    assert dict(call.kwargs) == {"is_2d": False, "s0": 1}
    assert dict(parse_expression("f(a, x=true, y=null)").kwargs) == {"x": True, "y": None}


# -- a key written twice --------------------------------------------------------------------------

GOOD_AFTER = "  - name: good\n    params: {a: [4]}\n    graph: sqr(a)\n"


@pytest.mark.parametrize("case, line, message", [
    ("  - name: dup\n    name: dup2\n    params: {a: [4]}\n    graph: sqr(a)\n", 3,
     "duplicate key 'name' (first on line 2)"),
    ("  - name: g\n    graph: sqr(a)\n    params: {a: [4]}\n    graph: abs(a)\n", 5,
     "duplicate key 'graph' (first on line 3)"),
    ("  - name: p\n    params: {a: [4]}\n    graph: sqr(a)\n    params: {a: [5]}\n", 5,
     "duplicate key 'params' (first on line 3)"),
    ("  - name: m\n    params: {a: [4]}\n    graph: sqr(a)\n    max_maa: 1.0e-4\n    max_maa: 0.5\n", 6,
     "duplicate key 'max_maa' (first on line 5)"),
    ("  - name: n\n    params:\n      a: [4]\n      a: [5]\n    graph: sqr(a)\n", 5,
     "duplicate key 'a' in 'params' (first on line 4)"),
    ("  - name: i\n    params: {a: [4]}\n    inputs:\n      r: {type: i32, values: [0], values: [1]}\n"
     "    graph: sqr(a)\n", 5, "duplicate key 'values' in 'inputs: r' (first on line 5)"),
    ("  - name: e\n    params: {a: [4]}\n    equivalent:\n      x: sqr(a)\n      y: mul(a, a)\n"
     "      x: abs(a)\n", 7, "duplicate key 'x' in 'equivalent' (first on line 5)"),
    ("  - name: v\n    params: {a: [4]}\n    graph: $op(a)\n    vary:\n      op: [sqr]\n      op: [abs]\n", 7,
     "duplicate key 'op' in 'vary' (first on line 6)"),
], ids=["name", "graph", "params", "max_maa", "a-param", "an-input's-values", "a-formulation", "a-vary-axis"])
def test_a_key_written_twice_in_a_case_is_one_error_at_its_second_line(case, line, message):
    """Before, PyYAML kept the last of the two without a word: `name: dup` then `name: dup2`
    ran as dup2, a second `graph:` checked another graph than the one read first. Seen
    failing with the duplicate check taken out of load_file: no error, the case loads."""
    loaded, errors = load_file("f.yaml", text="cases:\n" + case + GOOD_AFTER)
    assert [str(e) for e in errors] == [str(errors[0])] and str(errors[0]).startswith(f"f.yaml:{line}: {message}: ")
    assert [c.name for c in loaded] == ["good"]     # the file's other cases still load


def test_cases_written_twice_is_one_error_and_both_lists_load():
    """Before, the second `cases:` list replaced the first: its cases were gone without a word."""
    text = "cases:\n" + GOOD_AFTER + "defaults: {seed: 3}\ncases:\n" + GOOD_AFTER.replace("good", "second")
    loaded, errors = load_file("f.yaml", text=text)
    assert [str(e) for e in errors] == ["f.yaml:6: duplicate key 'cases' (first on line 1): a YAML reader keeps the "
                                        "last of the two and drops the first without a word; put the cases under "
                                        "one 'cases:' (the cases of every list are loaded)"]
    assert [c.name for c in loaded] == ["good", "second"]
    assert all(c.cases[0].seed == 3 for c in loaded)


@pytest.mark.parametrize("text, line, message", [
    ("defaults: {eps: 0.1, threads: 2, eps: 0.2}\ncases:\n", 1, "duplicate key 'eps' in 'defaults' (first on line 1)"),
    ("defaults:\n  eps: 0.1\ncases:\n", 0, "duplicate key 'defaults' (first on line 1)"),
], ids=["in-one-block", "in-two-blocks"])
def test_a_default_set_twice_is_one_error_naming_the_cases_it_leaves_out(text, line, message):
    """A default written twice leaves each case that takes it from the defaults in doubt:
    those are named in the one error and not loaded; a case that sets the key itself loads."""
    own = "  - name: own\n    params: {a: [4]}\n    graph: sqr(a)\n    eps: 0.01\n"
    if line == 0:   # the second `defaults:` block comes after the cases
        body = text + GOOD_AFTER + own + "defaults: {eps: 0.2, threads: 2}\n"
        line = body.count("\n")
    else:
        body = text + GOOD_AFTER + own
    loaded, errors = load_file("f.yaml", text=body)
    assert len(errors) == 1 and str(errors[0]).startswith(f"f.yaml:{line}: {message}: "), [str(e) for e in errors]
    assert str(errors[0]).endswith("the cases that take it from the defaults are not loaded until it is fixed: good")
    assert [(c.name, c.cases[0].eps, c.cases[0].threads) for c in loaded] == [("own", 0.01, 2)]
