"""`gradgate export NODE_ID --format test-backend-ops`: a gate item as a test_case of ggml's own
harness. With --run the command pastes the exported CONCAT story case into the tree's own
tests/test-backend-ops.cpp (here a copy of the default ggml laid out as llama.cpp lays it out),
builds it and runs it, with the fix and with the fix reverted: test-backend-ops itself passes it
with the fixed CONCAT backward and FAILs it with the buggy one."""

import shutil
import subprocess
import sys

import pytest

from ggml_variants import make_variant
from pytest_gradgate.export.test_backend_ops import REGISTER_MARK

STORY = "pytest_gradgate/cases.yaml::concat_dim1[{}-sqr-cpu]"
# the story's consumer, and the contiguous one: with it the buggy backward passes (the bug needs a
# gradient that arrives non-contiguous), which shows the export keeps the consumer
EXPORTED = {"permute_0213_transpose": STORY.format("permute_0213_transpose"), "none": STORY.format("none")}


def export(node_id):
    return subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "export", node_id, "--format",
                           "test-backend-ops"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_export_rebuilds_the_consumer_chain_and_the_sqr():
    done = export(EXPORTED["permute_0213_transpose"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ggml_concat(ctx, a, b, 1)" in out
    assert "ggml_cont(ctx, ggml_transpose(ctx, ggml_permute(ctx, t_out, 0, 2, 1, 3)))" in out
    assert "ggml_tensor * out = ggml_sqr(ctx, z);" in out
    assert "const int64_t ne_a[4] = {4, 3, 5, 1};" in out and "const int64_t ne_b[4] = {4, 2, 5, 1};" in out
    assert 'return "CONCAT";' in out        # so that `test-backend-ops grad -o CONCAT` selects it
    assert REGISTER_MARK in out and "test_cases.emplace_back(new test_gradgate_concat_dim1_" in out


@pytest.mark.parametrize("node_id, words", [
    ("concat_dim1", "must be FILE::NAME[VARIANT]"),
    ("nowhere.yaml::concat_dim1[none-sqr-cpu]", "'nowhere.yaml' is not a case file"),
    ("pytest_gradgate/cases.yaml::no_such_case[none-sqr-cpu]", "has no case named 'no_such_case'"),
    ("pytest_gradgate/cases.yaml::concat_dim1[bogus]", "has no variant [bogus]; its items are: concat_dim1[none-sqr-cpu]"),
    ("pytest_gradgate/cases.yaml::get_rows_duplicates[none-sqr-cpu]", "it has inputs (rows)"),
])
def test_a_node_id_that_cannot_be_exported_is_one_usage_error(node_id, words):
    done = export(node_id)
    assert done.returncode == 2 and done.stdout == ""
    assert words in done.stderr, done.stderr


def llama_layout(default_ggml, dest, variant):
    """A patched copy of the default ggml laid out as a llama.cpp checkout: DEST/ggml the ggml tree,
    DEST/tests/test-backend-ops.cpp the harness (llama.cpp keeps it at its root, not in ggml/)."""
    tree = make_variant(default_ggml, dest / "ggml", variant)
    (dest / "tests").mkdir()
    shutil.move(tree / "tests" / "test-backend-ops.cpp", dest / "tests" / "test-backend-ops.cpp")
    return tree


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory, default_ggml):
    """`gradgate export STORY NONE --format test-backend-ops --run --revert FIX` on the fixed CONCAT in
    a llama.cpp layout, FIX the fix as `git format-patch` at a llama.cpp root writes it (a/ggml/...)."""
    base = tmp_path_factory.mktemp("export-run")
    fixed = llama_layout(default_ggml, base / "llama.cpp", "concat-fixed")
    buggy = make_variant(default_ggml, base / "buggy" / "ggml", "concat-buggy")
    diff = subprocess.run(["diff", "-u", "--label", "a/ggml/src/ggml.c", "--label", "b/ggml/src/ggml.c",
                           str(buggy / "src" / "ggml.c"), str(fixed / "src" / "ggml.c")],
                          stdout=subprocess.PIPE, text=True)
    assert diff.returncode == 1 and "+++ b/ggml/src/ggml.c" in diff.stdout
    (base / "fix.patch").write_text(diff.stdout)
    # kept in the user cache between sessions, as --workdir is for: a later run rebuilds what changed
    from pytest_gradgate.library.cache import cache_root
    workdir = cache_root() / "tests" / "export-run"
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "export", *EXPORTED.values(), "--format",
                           "test-backend-ops", "--run", "--ggml-src", str(fixed), "--revert", str(base / "fix.patch"),
                           "--workdir", str(workdir)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1200)


def verdicts_of(stdout):
    """{case id: (with the change, without it)} from the command's table."""
    out, case_id = {}, None
    for line in stdout.splitlines():
        if line.startswith("concat") and line.endswith(":"):
            case_id = line[:-1]
        elif line.startswith("  with the change:"):
            on = line.split(":", 1)[1].strip()
        elif line.startswith("  without the change:"):
            out[case_id] = (on, line.split(":", 1)[1].strip())
    return out


@pytest.mark.slow
def test_test_backend_ops_fails_the_exported_case_without_the_fix(harness_run):
    """The reviewer's "confirm it fails with the hunk reverted", in upstream's own harness, on a
    llama.cpp layout (the harness at the root, the fix made at the root): the story's case passes
    with the fix and FAILs without it, so it gates the fix. Through consumer none the same bug is
    invisible: that case passes both ways and does not gate, which is why the chain is exported
    (exit 1: not every case gates). Seen failing with the export's SQR taken out (the harness's
    SUM alone): test-backend-ops then says OK on the buggy tree (MAA 1.9e-6); and with the
    harness's own initialize_tensors kept, it aborted in the exported case ("tensor write out of
    bounds") instead of comparing."""
    proc = harness_run
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    said = verdicts_of(proc.stdout)
    story, plain = (f"concat_dim1[{c}-sqr-cpu]" for c in EXPORTED)
    assert said[story][0] == "OK", said
    assert said[story][1].startswith("FAIL ([CONCAT] MAA = "), said
    assert float(said[story][1].split("MAA = ")[1].split()[0]) > 1e-2
    assert said[plain] == ("OK", "OK"), said
    assert "1 of 2 case(s) gate patch" in proc.stdout
    assert "tests/test-backend-ops.cpp" in proc.stderr and "reverted in" in proc.stderr


def test_run_options_need_run_and_a_tree_with_the_harness(tmp_path, default_ggml):
    """--revert without --run, and a tree without tests/test-backend-ops.cpp (here or above), are
    usage errors (exit 2) that say what to do, before anything is built."""
    alone = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "export", EXPORTED["none"], "--format",
                            "test-backend-ops", "--revert", "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    assert alone.returncode == 2 and "--revert goes with --run" in alone.stderr, alone.stderr
    from pytest_gradgate.library.source import copy_tree
    bare = copy_tree(default_ggml, tmp_path / "x" / "ggml")
    shutil.rmtree(bare / "tests", ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "export", EXPORTED["none"], "--format",
                           "test-backend-ops", "--run", "--ggml-src", str(bare)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no tests/test-backend-ops.cpp in it or in the llama.cpp checkout above it" in proc.stderr


def test_a_kept_workdir_is_brought_up_to_date_so_a_build_cannot_go_stale(tmp_path):
    """--workdir keeps the build, so the copy must tell the build what changed: a file whose bytes
    changed (the reverted file of the last run) is written anew, newer than its object; one that
    did not keeps its time stamp, so nothing else recompiles. A copy that kept the source's own
    time stamps would leave last run's reverted ggml.c older than its object, and the next run
    would run the stale, reverted build with the fix in the tree."""
    import os
    from pytest_gradgate.export.harness import sync
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "same.c").write_text("same")
    (src / "sub" / "changed.c").write_text("the fix")
    (dst / "sub").mkdir(parents=True)
    (dst / "same.c").write_text("same")
    (dst / "sub" / "changed.c").write_text("reverted")
    (dst / "gone.c").write_text("no longer in the tree")
    past = 1_000_000_000
    for path in (dst / "same.c", dst / "sub" / "changed.c"):
        os.utime(path, (past, past))
    os.utime(src / "sub" / "changed.c", (past - 10, past - 10))     # the tree's file: older still
    sync(src, dst)
    assert (dst / "sub" / "changed.c").read_text() == "the fix"
    assert os.stat(dst / "sub" / "changed.c").st_mtime > past         # newer than last run's object
    assert os.stat(dst / "same.c").st_mtime == past                   # untouched: nothing to recompile
    assert not (dst / "gone.c").exists()
