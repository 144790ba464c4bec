"""`gradgate export NODE_ID --format test-backend-ops`: a gate item as a test_case of ggml's own
harness. The exported CONCAT story case, pasted into a copy of the default ggml's
tests/test-backend-ops.cpp at the anchors the export names and built there, is run by
test-backend-ops itself: it FAILs with the buggy CONCAT backward and passes with the fixed one."""

import subprocess
import sys

import pytest

from ggml_variants import insert_before, make_variant, replace_once
from pytest_gradgate.export.test_backend_ops import REGISTER_ANCHOR, REGISTER_MARK, STRUCT_ANCHOR

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


def pasted(tree, node_ids):
    """Every node id's export put into tree's test-backend-ops.cpp at the anchors it names."""
    source = tree / "tests" / "test-backend-ops.cpp"
    for node_id in node_ids:
        done = export(node_id)
        assert done.returncode == 0, done.stderr
        struct, register = done.stdout.split(REGISTER_MARK + "\n")
        insert_before(source, STRUCT_ANCHOR, struct + "\n")
        replace_once(source, REGISTER_ANCHOR, REGISTER_ANCHOR + register)
    return tree


@pytest.fixture(scope="module")
def harness_on(tmp_path_factory, default_ggml):
    """variant -> {consumer: status of our exported case in `test-backend-ops grad -o CONCAT -b CPU`}."""
    reference = pytest.importorskip("reference")     # bench/reference.py: builds test-backend-ops
    runs = {}

    def run(variant):
        if variant not in runs:
            tree = make_variant(default_ggml, tmp_path_factory.mktemp(variant) / "ggml", variant)
            build = reference.ensure_reference(pasted(tree, EXPORTED.values()))
            done = reference.run_grad(build.binary, "CONCAT")
            ours = {c.vars: c for c in done.cases if c.vars.startswith("gradgate=")}
            runs[variant] = {consumer: ours[f"gradgate={node_id.split('::')[1]}"]
                             for consumer, node_id in EXPORTED.items()}
        return runs[variant]
    return run


@pytest.mark.slow
def test_test_backend_ops_fails_the_exported_case_on_the_buggy_concat(harness_on):
    """The bug is in the tree (the concat-buggy variant): ggml's harness must say FAIL. Seen failing
    with the export's SQR taken out (the harness's SUM alone): test-backend-ops then says OK on the
    buggy tree (MAA 1.9e-6); and with the harness's own initialize_tensors kept, it aborted in the
    exported case ("tensor write out of bounds") instead of comparing."""
    story = harness_on("concat-buggy")["permute_0213_transpose"]
    assert story.status == "fail", (story.status, story.detail, story.maa)
    assert max(story.maa.values()) > 1e-2
    # through the contiguous consumer the same bug is invisible: the chain is what catches it
    assert harness_on("concat-buggy")["none"].status == "ok"


@pytest.mark.slow
def test_test_backend_ops_passes_the_exported_case_on_the_fixed_concat(harness_on):
    for consumer, ref in harness_on("concat-fixed").items():
        assert ref.status == "ok", (consumer, ref.status, ref.detail, ref.maa)
