"""The build key's tree digest and its stat memo: a remembered digest is used only for the
very tree it was computed from. Real files on disk, edited the ways people and tools edit
them; hash_files is spied on (the real function runs) to tell a memo hit from a hash."""

import os
import shutil
import time

import pytest

from pytest_gradgate.library import tree_digest as td
from pytest_gradgate.library.cmake import BuildOptions, cache_key
from pytest_gradgate.library.source import copy_tree

NAMES = ("CMakeLists.txt", "src")
HASH_FILES = td.hash_files   # the real one, for expected values: not counted by the spy


@pytest.fixture
def hashes(monkeypatch, tmp_path):
    """A cache folder of this test's, and the count of full hashes made meanwhile."""
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def spy(files):
        calls.append(len(files))
        return HASH_FILES(files)
    monkeypatch.setattr(td, "hash_files", spy)
    return calls


def make_tree(root):
    (root / "src" / "deep").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(x)\n")
    (root / "src" / "a.c").write_text("int a = 1;\n")
    (root / "src" / "deep" / "b.h").write_text("#define B 2\n")
    (root / "docs.md").write_text("not an input\n")
    return root


def fresh(root):
    return HASH_FILES(td._files(root, NAMES))


@pytest.fixture
def settled(monkeypatch):
    """Files written by the test count as old at once (the racy window is tested on its own)."""
    monkeypatch.setattr(td, "RACY_NS", 0)


def test_a_memo_is_written_and_then_used_instead_of_reading_the_files(tmp_path, hashes, settled):
    root = make_tree(tmp_path / "tree")
    first = td.tree_digest(root, NAMES)
    assert td.memo_path(root, NAMES).is_file()
    assert td.tree_digest(root, NAMES) == first
    assert hashes == [3], "the second call should have taken the memo's digest"


@pytest.mark.parametrize("edit", ["same size, mtime restored", "new file", "removed file", "renamed file",
                                  "file replaced by a copy"])
def test_any_change_to_an_input_file_is_seen_through_the_memo(tmp_path, hashes, settled, edit):
    """Verified to fail with ctime taken out of the memo's rows: an edit of the same size whose
    mtime is set back (os.utime, as `cp -p`, rsync or a checkout can leave it) kept the old digest."""
    root = make_tree(tmp_path / "tree")
    before = td.tree_digest(root, NAMES)
    a = root / "src" / "a.c"
    if edit == "same size, mtime restored":
        st = a.stat()
        time.sleep(0.01)
        a.write_text("int a = 7;\n")
        os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (a.stat().st_size, a.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    elif edit == "new file":
        (root / "src" / "deep" / "c.h").write_text("")
    elif edit == "removed file":
        (root / "src" / "deep" / "b.h").unlink()
    elif edit == "renamed file":
        a.rename(root / "src" / "z.c")
    else:
        copy = tmp_path / "a.c"
        copy.write_text("int a = 8;\n")
        os.replace(copy, a)
    after = td.tree_digest(root, NAMES)
    assert after != before and after == fresh(root)
    assert len(hashes) == 2


def test_files_outside_the_inputs_do_not_change_the_digest(tmp_path, hashes, settled):
    root = make_tree(tmp_path / "tree")
    before = td.tree_digest(root, NAMES)
    (root / "docs.md").write_text("edited\n")
    assert td.tree_digest(root, NAMES) == before and hashes == [3]


def test_files_written_just_now_are_hashed_every_time(tmp_path, hashes):
    """Git's racy case: a file written again within the clock's tick of its hashing can keep
    its stat, so no memo is written while any input is younger than RACY_NS. Verified to fail
    with the check removed: the memo appears after the first call."""
    root = make_tree(tmp_path / "tree")
    td.tree_digest(root, NAMES)
    td.tree_digest(root, NAMES)
    assert not td.memo_path(root, NAMES).exists()
    assert hashes == [3, 3]


@pytest.mark.parametrize("damage", ["garbage", "other version", "wrong type"])
def test_a_damaged_memo_is_no_memo(tmp_path, hashes, settled, damage):
    root = make_tree(tmp_path / "tree")
    digest = td.tree_digest(root, NAMES)
    memo = td.memo_path(root, NAMES)
    memo.write_text({"garbage": "{not json", "other version": '{"version": 0, "digest": "x"}\n[]\n',
                     "wrong type": "[1, 2]"}[damage])
    assert td.tree_digest(root, NAMES) == digest
    assert len(hashes) == 2


def test_the_memos_of_trees_that_are_gone_are_dropped(tmp_path, hashes, settled):
    """Every pytester run and verify copy is a tree at a new path: without pruning, their
    memos (about 100 kB for ggml) would pile up in the user cache. Verified to fail with
    _prune's call taken out."""
    gone, kept = make_tree(tmp_path / "gone"), make_tree(tmp_path / "kept")
    td.tree_digest(gone, NAMES)
    td.tree_digest(kept, NAMES)
    shutil.rmtree(gone)
    assert td.memo_path(gone, NAMES).is_file()
    td.tree_digest(make_tree(tmp_path / "new"), NAMES)
    assert sorted(p.name for p in td.memo_dir().iterdir()) == sorted(
        td.memo_path(t, NAMES).name for t in (kept, tmp_path / "new"))


def test_an_unwritable_cache_still_gives_the_digest(tmp_path, hashes, settled, monkeypatch):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(blocker))
    root = make_tree(tmp_path / "tree")
    assert td.tree_digest(root, NAMES) == td.tree_digest(root, NAMES) == fresh(root)
    assert len(hashes) == 2


def test_the_build_key_of_a_ggml_copy_follows_an_edit_that_keeps_size_and_mtime(default_ggml, tmp_path,
                                                                                hashes, settled):
    """The key that picks a build: a copy of the default ggml keyed twice uses the memo, and a
    one-byte edit of ggml.c (its last byte; size and mtime kept) gives another key."""
    root = copy_tree(default_ggml, tmp_path / "ggml")
    key = cache_key(root, BuildOptions())
    assert cache_key(root, BuildOptions()) == key
    ggml_c = root / "src" / "ggml.c"
    st = ggml_c.stat()
    text = ggml_c.read_bytes()
    ggml_c.write_bytes(text[:-1] + (b" " if text[-1:] != b" " else b"\n"))
    os.utime(ggml_c, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ggml_c.stat().st_size == st.st_size
    assert cache_key(root, BuildOptions()) != key
