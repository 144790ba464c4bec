"""The collection memo: a case file's loaded cases, remembered between processes, and only
ever what the loader would give now. Real pytest processes and real files; loader.load_file
is spied on (the real function runs) where a test tells a hit from a load."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pytest_gradgate.declare import collection_memo as memo
from pytest_gradgate.declare import loader
from pytest_gradgate.declare.loader import load_file

BUILTIN_FILES = ("cases.yaml", "cases_fast.yaml", "cases_equivalence.yaml")
CASE_FILE = textwrap.dedent("""\
    cases:
      - name: scaled
        params: {a: [4, 3]}
        graph: scale(a, 0.5)
        consumers: [none, transpose]
""")

# collect in a fresh process; say whether YAML was ever imported and what was collected
COLLECT = """
import sys, pytest
rc = pytest.main(["--gradgate", "--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
print("yaml imported:", "yaml" in sys.modules)
sys.exit(rc)
"""


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def loads(monkeypatch):
    """How often the real loader ran."""
    calls = []
    real = loader.load_file

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(loader, "load_file", spy)
    return calls


def summary(loaded):
    return [(e.name, str(e.path), e.line, [(c.to_dict(), c.op) for c in e.cases]) for e in loaded]


def collect(tmp_path, *args, env=None):
    proc = subprocess.run([sys.executable, "-c", COLLECT, *args], cwd=tmp_path, text=True, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout.splitlines()


def test_a_second_collection_takes_the_memo_and_never_imports_yaml(tmp_path, cache):
    """Verified to fail with CaseFile.collect calling load_file again: the second process
    imports YAML too."""
    first = collect(tmp_path)
    assert "yaml imported: True" in first and any("659 tests collected" in line for line in first)
    assert sorted(p.name for p in (cache / "collections").iterdir()) == sorted(
        memo.memo_path(memo.PACKAGE / name, ("cpu",), True).name for name in BUILTIN_FILES)
    second = collect(tmp_path)
    assert "yaml imported: False" in second
    ids = [line for line in first if "::" in line]
    assert len(ids) == 659 and ids == [line for line in second if "::" in line]


@pytest.mark.parametrize("name", BUILTIN_FILES)
def test_the_memo_gives_what_the_loader_gives(name, cache, loads):
    path = memo.PACKAGE / name
    expected, errors = load_file(path, ("cpu", "cuda"), builtin=True)
    assert errors == []
    assert summary(memo.load_file_remembered(path, ("cpu", "cuda"), builtin=True)[0]) == summary(expected)
    assert summary(memo.load_file_remembered(path, ("cpu", "cuda"), builtin=True)[0]) == summary(expected)
    assert len(loads) == 1
    # other backends or a user file's treatment are other inputs, each with its own memo
    assert summary(memo.load_file_remembered(path, ("cpu",), builtin=True)[0]) == summary(
        load_file(path, ("cpu",), builtin=True)[0])
    assert summary(memo.load_file_remembered(path, ("cpu",), builtin=False)[0]) == summary(
        load_file(path, ("cpu",), builtin=False)[0])
    assert len(loads) == 3


def test_an_edit_of_the_file_is_a_miss_even_with_its_size_and_mtime_kept(tmp_path, cache, loads):
    path = tmp_path / "gradgate_cases.yaml"
    path.write_text(CASE_FILE)
    st = path.stat()
    assert memo.load_file_remembered(path)[0][0].cases[0].graph == "scale(a, 0.5)"
    path.write_text(CASE_FILE.replace("0.5", "0.7"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert memo.load_file_remembered(path)[0][0].cases[0].graph == "scale(a, 0.7)"
    assert len(loads) == 2


def test_an_edit_of_the_package_is_a_miss(tmp_path, cache):
    """A copy of the package, imported ahead of the installed one: after its default eps is
    changed, the same case file loads with the new default. Verified to fail with the
    package's digest taken out of the key: the second process got the old eps from the memo."""
    copy = tmp_path / "pkg" / "pytest_gradgate"
    shutil.copytree(memo.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    cases = tmp_path / "gradgate_cases.yaml"
    cases.write_text(CASE_FILE)
    script = ("import sys, pytest_gradgate\n"
              "from pytest_gradgate.declare.collection_memo import load_file_remembered\n"
              "print(pytest_gradgate.__file__, load_file_remembered(sys.argv[1])[0][0].cases[0].eps)\n")
    env = dict(os.environ, PYTHONPATH=str(copy.parent))

    def eps_seen():
        out = subprocess.run([sys.executable, "-c", script, str(cases)], env=env, cwd=tmp_path, text=True, timeout=120,
                             stdout=subprocess.PIPE, check=True).stdout.split()
        assert out[0] == str(copy / "__init__.py")
        return float(out[1])
    assert eps_seen() == 0.1
    case_py = copy / "declare" / "case.py"
    case_py.write_text(case_py.read_text().replace("DEFAULT_EPS = 1e-1 ", "DEFAULT_EPS = 5e-2 ", 1))
    assert eps_seen() == 0.05


def test_a_file_with_errors_is_loaded_every_time(tmp_path, cache, loads):
    """Verified to fail with errors remembered too: the second load returned none."""
    path = tmp_path / "gradgate_cases.yaml"
    path.write_text(CASE_FILE + "  - name: bad\n    params: {a: [4, 3]}\n    graph: frobnicate(a)\n")
    for _ in range(2):
        loaded, errors = memo.load_file_remembered(path)
        assert [e.name for e in loaded] == ["scaled"]
        assert len(errors) == 1 and "unknown op 'frobnicate'" in str(errors[0]) and errors[0].line == 8
    assert len(loads) == 2 and not memo.memo_path(path, ("cpu",), False).exists()


@pytest.mark.parametrize("damage", ["truncated", "not a pickle", "not a memo"])
def test_a_damaged_memo_is_a_miss(tmp_path, cache, loads, damage):
    path = tmp_path / "gradgate_cases.yaml"
    path.write_text(CASE_FILE)
    expected = summary(memo.load_file_remembered(path)[0])
    where = memo.memo_path(path, ("cpu",), False)
    data = where.read_bytes()
    where.write_bytes({"truncated": data[:len(data) // 2], "not a pickle": data.split(b"\n")[0] + b"\nxyz",
                       "not a memo": b"[1, 2]\n"}[damage])
    assert summary(memo.load_file_remembered(path)[0]) == expected
    assert len(loads) == 2


def test_the_memos_of_files_that_are_gone_are_dropped(tmp_path, cache):
    """Verified to fail with _prune's call taken out."""
    gone, kept, new = (tmp_path / f"gradgate_{n}.yaml" for n in ("gone", "kept", "new"))
    for path in (gone, kept, new):
        path.write_text(CASE_FILE)
    memo.load_file_remembered(gone)
    memo.load_file_remembered(kept)
    gone.unlink()
    memo.load_file_remembered(new)
    assert sorted(p.name for p in memo.memo_dir().iterdir()) == sorted(
        memo.memo_path(p, ("cpu",), False).name for p in (kept, new))


def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch, loads):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(blocker))
    path = tmp_path / "gradgate_cases.yaml"
    path.write_text(CASE_FILE)
    assert [e.name for e in memo.load_file_remembered(path)[0]] == ["scaled"]
    assert [e.name for e in memo.load_file_remembered(path)[0]] == ["scaled"]
    assert len(loads) == 2
