"""gradgate mutate (issue 54): mutants planted in the backward code of a copy of the default ggml,
each built and run against the cases that reach it.

The verdicts are checked on mutants whose fate is known: SILU's backward graph with its operands
swapped or one dropped (ggml_silu_back(ctx, grad, src0) in ggml_compute_backward) is killed by a
silu case; a mutation of SILU_BACK's f16 kernel, which no f32 case runs, survives and is listed
with its diff. The run is interrupted after its first result and started again: it resumes, and
a mutant past its time limit is a timeout, not a stuck run.
"""

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pytest_gradgate.library.source import copy_tree

pytest.importorskip("tree_sitter", reason="gradgate mutate needs the [mutate] extra")

from pytest_gradgate.mutate import sites  # noqa: E402

SILU_CASES = """\
cases:
  - name: silu_rows
    params: {a: [9, 3]}
    graph: silu(a)
    consumers: [none]
"""


def _lines(default_ggml):
    """(the line of ggml_silu_back's call in ggml_compute_backward, a line of the f16 kernel with one
    mutant), read from the tree: they move between ggml versions."""
    ms = sites.mutants(default_ggml, ops=["silu"])
    per_line = Counter((m.path, m.line) for m in ms)
    call = next(m for m in ms if m.function == "ggml_compute_backward" and "ggml_silu_back" in m.description)
    f16 = next(m for m in ms if m.function == "ggml_compute_forward_silu_back_f16" and m.operator == "arithmetic"
               and per_line[(m.path, m.line)] == 1)
    return f"{call.path}:{call.line}", f"{f16.path}:{f16.line}"


def mutate(*args, cwd):
    return [sys.executable, "-m", "pytest_gradgate.cli", "mutate", *args]


def test_sites_name_the_op_and_replace_one_node(default_ggml):
    """Each mutant replaces one node's bytes and names the op whose backward runs it: a case block
    of ggml_compute_backward its op, a kernel the op it serves, a shared helper every op."""
    ms = sites.mutants(default_ggml)
    assert len(ms) > 1000 and len({m.id for m in ms}) == len(ms)
    text = (Path(default_ggml) / "src/ggml.c").read_bytes()
    swap = next(m for m in ms if m.function == "ggml_compute_backward" and "ggml_silu_back: operands" in m.description)
    assert swap.ops == ("silu",) and swap.diff_line(text) == (
        "- ggml_add_or_set(ctx, cgraph, isrc0, ggml_silu_back(ctx, grad, src0));\n"
        "+ ggml_add_or_set(ctx, cgraph, isrc0, ggml_silu_back(ctx, src0, grad));")
    kernel = {m.ops for m in ms if m.function.startswith("ggml_compute_forward_soft_max_ext_back")}
    assert kernel == {("soft_max",)}
    assert {m.ops for m in ms if m.function == "ggml_add_or_set"} == {("*",)}
    assert {m.operator for m in ms} == {"arithmetic", "comparison", "accumulation", "constant", "dimension", "operand"}
    # the Release build the gate runs compiles `#ifndef NDEBUG` blocks out: no mutant there
    ops_lines = (Path(default_ggml) / "src/ggml-cpu/ops.cpp").read_text().splitlines()
    debug, inside = set(), False
    for number, text in enumerate(ops_lines, 1):
        inside = inside or text.strip() == "#ifndef NDEBUG"
        if inside:
            debug.add(number)
            inside = not text.strip().startswith("#endif")
    kernel_lines = {m.line for m in ms if m.path == "src/ggml-cpu/ops.cpp"}
    assert debug and not kernel_lines & debug


def test_since_mutates_only_the_lines_a_commit_changed(tmp_path, default_ggml):
    """--since on a commit that adds a backward: only that commit's lines get mutants."""
    tree = copy_tree(default_ggml, tmp_path / "ggml")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tree, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tree, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tree, check=True)
    ggml_c = tree / "src" / "ggml.c"
    text = ggml_c.read_text()
    anchor = "        case GGML_OP_SQR: {\n"
    assert text.count(anchor) == 1
    added = ("        case GGML_OP_SQR: {\n"
             "            if (src0_needs_grads) { // a new backward line, written for this test\n"
             "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale(ctx, ggml_mul(ctx, src0, grad), 2.0f));\n"
             "                break;\n"
             "            }\n")
    ggml_c.write_text(text.replace(anchor, added))
    subprocess.run([*git, "commit", "-qam", "sqr backward"], cwd=tree, check=True)
    first = text[:text.index(anchor)].count("\n") + 2     # the `if` line
    lines = sites.changed_lines(tree, "HEAD~1")
    assert lines == {"src/ggml.c": {first, first + 1, first + 2, first + 3}}
    ms = sites.mutants(tree, lines=lines)
    assert ms and {m.line for m in ms} <= lines["src/ggml.c"] and {m.ops for m in ms} == {("sqr",)}
    assert any(m.description == "ggml_mul: operands src0 and grad swapped" for m in ms)


@pytest.mark.slow
def test_verdicts_survivors_and_a_resumed_run(tmp_path, default_ggml, default_build):
    cases = tmp_path / "silu.yaml"
    cases.write_text(SILU_CASES)
    killed_at, survived_at = _lines(default_ggml)
    args = ["--ggml-src", str(default_ggml), "--cases", str(cases), "--at", killed_at, "--at", survived_at,
            "--workdir", str(tmp_path / "work")]
    report = tmp_path / "work" / "gradgate-mutate" / "report.json"
    # interrupted once its first mutant has a verdict
    proc = subprocess.Popen(mutate(*args, "--explore-s", "0", cwd=tmp_path), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if report.is_file() and json.loads(report.read_text())["results"]:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; 1 results kept" in err
    tree_copy = tmp_path / "work" / "gradgate-mutate" / "tree-0"
    assert (tree_copy / "src/ggml.c").read_bytes() == (Path(default_ggml) / "src/ggml.c").read_bytes()
    assert (tree_copy / "src/ggml-cpu/ops.cpp").read_bytes() == (Path(default_ggml) / "src/ggml-cpu/ops.cpp").read_bytes()
    # started again: the first verdict is kept, the rest run; the survivor is searched by explore,
    # whose findings on silu (upstream's own laid-out failures) fail unmutated too: no killing case
    done = subprocess.run(mutate(*args, "--explore-s", "3", cwd=tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-2000:]        # a survivor
    assert "3 mutants, 1 done before, 2 to run" in done.stderr
    doc = json.loads(report.read_text())
    verdicts = {(r["path"], r["line"], r["description"]): r["verdict"] for r in doc["results"].values()}
    path, line = killed_at.split(":")
    assert [v for (p, n, _), v in verdicts.items() if (p, n) == (path, int(line))] == ["killed", "killed"]
    path, line = survived_at.split(":")
    assert [v for (p, n, _), v in verdicts.items() if (p, n) == (path, int(line))] == ["survived"]
    assert doc["score"] == pytest.approx(2 / 3)
    assert f"survivors (1): no selected case turned red\n  {survived_at} in ggml_compute_forward_silu_back_f16 (silu)" \
        in done.stdout
    survivor = next(r for r in doc["results"].values() if r["verdict"] == "survived")
    assert survivor["explored"]["verdict"] == "possibly-equivalent", survivor["explored"]
    assert survivor["explored"]["cases_drawn"] > 0
    assert "possibly-equivalent: explore drew" in done.stdout
    # one line of them again: nothing runs, and the table is over that line's mutant alone
    again = subprocess.run(mutate("--ggml-src", str(default_ggml), "--cases", str(cases), "--at", survived_at,
                                  "--workdir", str(tmp_path / "work"), "--explore-s", "0", cwd=tmp_path),
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "1 mutants, 1 done before, 0 to run" in again.stderr, again.stderr[-2000:]
    assert again.stdout.startswith("mutants: 1; killed 0, timeout 0, survived 1, not compiled 0, unreached 0; "
                                   "not run 0\nmutation score: 0.0%"), again.stdout
    killed = next(r for r in doc["results"].values() if r["verdict"] == "killed")
    assert killed["detail"].startswith("silu_rows[none-sqr-cpu]")


@pytest.mark.slow
def test_a_mutant_past_its_time_limit_is_a_timeout(tmp_path, default_ggml, default_build):
    cases = tmp_path / "silu.yaml"
    cases.write_text(SILU_CASES)
    killed_at, _ = _lines(default_ggml)
    done = subprocess.run(mutate("--ggml-src", str(default_ggml), "--cases", str(cases), "--at", killed_at,
                                 "--limit", "1", "--timeout", "0.5", "--workdir", str(tmp_path / "work"), cwd=tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[1/1] timeout" in done.stderr
    assert "killed 0, timeout 1, survived 0" in done.stdout
    assert not list((tmp_path / "work" / "gradgate-mutate").glob("cache-0/builds/*"))


def test_explore_kills_a_survivor_and_gives_the_case(ggml_variant, default_build):
    """The survivor search on a real planted bug standing for a mutant (silu-back-unrolled, in
    the reach tree: wrong only on rows past 8, which a suite of 4-element rows let through):
    explore over silu finds a case that fails on it and passes on the unmutated default, and
    prints it shrunk as a case file holds it. Findings that fail unmutated too (upstream's laid-out
    SILU failures) are not taken for kills."""
    pytest.importorskip("hypothesis")
    from ggml_variants import REACH
    from pytest_gradgate.mutate import survivors
    survivor = {"ops": ["silu"], "path": "src/ggml-cpu/vec.h", "line": 1, "description": "planted"}
    found = survivors.search(ggml_variant(REACH)[1].library, default_build.library, survivor, 10.0)
    assert found["verdict"] == "killed-by-explore", found
    assert found["detail"].endswith(": silu misread contiguous"), found["detail"]
    assert found["case"].startswith("# kills src/ggml-cpu/vec.h:1 (planted)\ncases:\n") and "graph: silu(a)" in found["case"]
