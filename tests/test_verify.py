"""`gradgate verify`: real builds of a ggml tree with and without a change, real pytest runs
on both. The change is DESIGN.md's fix: concat-buggy -> concat-fixed (ggml_variants.py). The
permute_0213_transpose/SQR case gates it; its SUM-loss twin cannot (the all-ones gradient of
a SUM loss survives the scramble), which is why verify exits 1 when both are selected."""

import difflib
import re
import shutil
import subprocess

import pytest

from pytest_gradgate.cli import main as cli_main

pytestmark = pytest.mark.slow      # builds the concat variants (shared with test_gate.py)

SQR_ID = "concat_dim1[permute_0213_transpose-sqr-cpu]"
SUM_ID = "concat_dim1[permute_0213_transpose-sum-cpu]"
CASES = """\
cases:
  - name: concat_dim1
    params: {a: [4, 3, 5, 1], b: [4, 2, 5, 1]}
    graph: concat(a, b, dim=1)
    consumers: [permute_0213_transpose]
    loss: [sqr, sum]
"""


@pytest.fixture(autouse=True)
def outside_ci(monkeypatch):
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GRADGATE_GGML_SRC", "GRADGATE_BASELINE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cases(tmp_path):
    path = tmp_path / "concat_cases.yaml"
    path.write_text(CASES)
    return path


@pytest.fixture
def fix_patch(tmp_path, ggml_variant):
    """The fix as a reviewer sees it: a unified diff from the buggy to the fixed src/ggml.c."""
    buggy, _ = ggml_variant("concat-buggy")
    fixed, _ = ggml_variant("concat-fixed")
    diff = difflib.unified_diff((buggy / "src/ggml.c").read_text().splitlines(keepends=True),
                                (fixed / "src/ggml.c").read_text().splitlines(keepends=True),
                                "a/src/ggml.c", "b/src/ggml.c")
    path = tmp_path / "fix-concat.patch"
    path.write_text("".join(diff))
    return path


def rows(out):
    """case id -> (with, without, gates) from verify's table."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"^(\S+\[\S+\])\s{2,}(.+?)\s{2,}(.+?)\s{2,}(yes|control|NO)$", line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return found


def test_sqr_case_gates_the_concat_fix_and_its_sum_twin_is_a_control(ggml_variant, fix_patch, cases, capsys):
    """The SUM twin passes with and without the fix (an all-ones gradient survives the scramble):
    beside the SQR item that gates, it is the case's control, not a case that fails to gate
    (issue 52: a control item made verify exit 1). Alone, it does not gate."""
    fixed, _ = ggml_variant("concat-fixed")
    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(fixed), "--cases", str(cases)])
    out = capsys.readouterr().out
    table = rows(out)
    assert code == 0, out
    assert table[SQR_ID][0].startswith("passed") and table[SQR_ID][1].startswith("failed (MAA ")
    assert table[SQR_ID][2] == "yes"
    assert table[SUM_ID][0].startswith("passed") and table[SUM_ID][1].startswith("passed")
    assert table[SUM_ID][2] == "control"
    assert "all 1 selected cases gate" in out and "1 control item(s) pass with and without it" in out

    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(fixed), "--cases", str(cases), "-k", "sum"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert rows(out) == {SUM_ID: (rows(out)[SUM_ID][0], rows(out)[SUM_ID][1], "NO")}
    assert "1 of 1 selected cases do NOT gate" in out

    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(fixed), "--cases", str(cases), "-k", "sqr and not sum"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert set(rows(out)) == {SQR_ID} and "all 1 selected cases gate" in out


def test_a_patch_made_at_a_llama_cpp_root_applies_to_its_ggml(ggml_variant, fix_patch, cases, tmp_path, capsys):
    """Issue 52: `git format-patch` at a llama.cpp checkout writes a/ggml/src/ggml.c; verify builds
    its ggml/ and said the patch did not apply. A file outside ggml/ in the patch is left out."""
    fixed, _ = ggml_variant("concat-fixed")
    llama = tmp_path / "llama.cpp"
    shutil.copytree(fixed, llama / "ggml")
    text = fix_patch.read_text().replace("--- a/src/", "--- a/ggml/src/").replace("+++ b/src/", "+++ b/ggml/src/")
    text += "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -1 +1 @@\n-old\n+new\n"
    patch = tmp_path / "0001-concat-backward.patch"
    patch.write_text(text)
    code = cli_main(["verify", "--revert", str(patch), "--ggml-src", str(llama), "--cases", str(cases),
                     "-k", "sqr and not sum"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert rows(out)[SQR_ID][2] == "yes"


def test_a_git_commit_can_be_reverted(ggml_variant, cases, tmp_path, capsys):
    """--revert REF: the tree is a git repository whose last commit is the fix."""
    buggy, _ = ggml_variant("concat-buggy")
    fixed, _ = ggml_variant("concat-fixed")
    repo = tmp_path / "ggml"
    shutil.copytree(buggy, repo)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       stdout=subprocess.DEVNULL)
    git("init", "-q")
    git("add", "src/ggml.c")
    git("commit", "-qm", "CONCAT backward")
    shutil.copy2(fixed / "src/ggml.c", repo / "src/ggml.c")
    git("commit", "-qam", "CONCAT backward: slice a contiguous copy of the gradient")

    code = cli_main(["verify", "--revert", "HEAD", "--ggml-src", str(repo), "--cases", str(cases), "-k", "sqr and not sum"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert rows(out)[SQR_ID][2] == "yes" and "commit " in out

    code = cli_main(["verify", "--revert", "no-such-ref", "--ggml-src", str(repo), "--cases", str(cases)])
    assert code == 2
    assert "--revert no-such-ref: no such file, and no such commit in" in capsys.readouterr().err


def test_a_patch_that_does_not_apply_is_a_clear_error(ggml_variant, fix_patch, cases, capsys):
    """The buggy tree does not contain the fix, so the fix cannot be reverted from it."""
    buggy, _ = ggml_variant("concat-buggy")
    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(buggy), "--cases", str(cases)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--revert patch {fix_patch}: the change does not apply in reverse to {buggy}" in err
    assert "src/ggml.c" in err


def test_a_ref_outside_a_git_repository_is_a_clear_error(ggml_variant, cases, capsys):
    fixed, _ = ggml_variant("concat-fixed")
    code = cli_main(["verify", "--revert", "HEAD", "--ggml-src", str(fixed), "--cases", str(cases)])
    assert code == 2
    assert "is not in a git repository" in capsys.readouterr().err


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_workdir_never_writes_over_a_users_files(ggml_variant, fix_patch, cases, tmp_path, capsys):
    """--workdir DIR holding the user's own pytest.ini, reports and a reverted/ folder: verify
    writes only in DIR/gradgate-verify, before and after reading --revert, and refuses a
    gradgate-verify folder it did not make."""
    fixed, _ = ggml_variant("concat-fixed")
    user = tmp_path / "user-dir"
    (user / "reverted").mkdir(parents=True)
    (user / "pytest.ini").write_text("[pytest]\naddopts = -x\n")
    (user / "with.json").write_text('{"mine": 1}\n')
    (user / "reverted" / "change.patch").write_text("my patch\n")
    before = _snapshot(user)

    code = cli_main(["verify", "--revert", "no-such-ref", "--ggml-src", str(fixed), "--cases", str(cases),
                     "--workdir", str(user)])
    assert code == 2
    assert _snapshot(user) == before and not (user / "gradgate-verify").exists()

    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(fixed), "--cases", str(cases),
                     "-k", "sqr and not sum", "--workdir", str(user)])
    out = capsys.readouterr().out
    assert code == 0, out
    after = _snapshot(user)
    assert {k: v for k, v in after.items() if not k.startswith("gradgate-verify/")} == before
    assert (user / "gradgate-verify" / "with.json").is_file()

    stranger = tmp_path / "other"
    (stranger / "gradgate-verify").mkdir(parents=True)
    (stranger / "gradgate-verify" / "notes.txt").write_text("mine\n")
    code = cli_main(["verify", "--revert", str(fix_patch), "--ggml-src", str(fixed), "--cases", str(cases),
                     "--workdir", str(stranger)])
    assert code == 2
    assert "was not made by gradgate verify" in capsys.readouterr().err
    assert _snapshot(stranger) == {"gradgate-verify/notes.txt": b"mine\n"}
