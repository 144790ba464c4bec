"""`gradgate verify --revert REF|PATCH`: does a case gate a change?

The reviewer's question "would this case have caught the bug?", automated: build the ggml
tree as it is (with the change) and a copy with the change reverted (without it), run the
selected cases on both with `pytest --gradgate` in subprocesses, and compare. A case gates
the change when it fails without it and passes with it. Exit 0 only if every selected case
gates the change; 1 if some do not; 2 on bad input (a REF not found, a patch that does not
apply, no case selected).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_gradgate.library.source import copy_tree, resolve_source
from pytest_gradgate.check.outcome import FAILING
from pytest_gradgate.errors import GradgateError, SourceError, UsageError


class VerifyError(UsageError):
    """Bad input to verify (exit 2): a REF not found, a patch that does not apply, no case selected."""


# verify writes only inside a folder of its own under --workdir, marked as verify's by a file,
# so that a user's DIR/pytest.ini, reports or sources are never written over
OWN_FOLDER = "gradgate-verify"


def own_folder(workdir, tool="verify"):
    """The folder under --workdir DIR that `gradgate TOOL` writes in (DIR/gradgate-TOOL), made and
    marked as the tool's; refuses one it did not make."""
    folder = Path(workdir).resolve() / f"gradgate-{tool}"
    mark = folder / f".made-by-gradgate-{tool}"
    if folder.exists() and not mark.is_file():
        raise VerifyError(f"--workdir {workdir}: {folder} exists and was not made by gradgate {tool}; "
                          "it is left as it is: give another --workdir, or move that folder away")
    folder.mkdir(parents=True, exist_ok=True)
    mark.touch()
    return folder


def add_arguments(p):
    p.add_argument("--revert", required=True, metavar="REF|PATCH",
                   help="the change: a commit of the ggml tree's git repository, or a unified diff file "
                        "(paths a/... b/... relative to the ggml root) that the tree contains")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="select cases as pytest -k does")
    p.add_argument("--ggml-src", metavar="PATH",
                   help="the ggml or llama.cpp tree WITH the change (default: as pytest --gradgate resolves it)")
    p.add_argument("--cases", action="append", metavar="FILE",
                   help="YAML case file(s) to run instead of the built-in suite (repeatable)")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"), help="backend to run the cases on")
    p.add_argument("--workdir", metavar="DIR", help="keep the reverted copy and the reports in DIR/" + OWN_FOLDER
                                                     + " (default: a temporary folder, removed afterwards)")


# -- the change ------------------------------------------------------------------------------
def _git(args, cwd):
    env = dict(os.environ, LC_ALL="C")
    return subprocess.run(["git", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)


def diff_of_commit(ref, ggml_root):
    """`git diff REF^ REF`, limited to the ggml root and with paths relative to it (so that a
    llama.cpp commit touching ggml/src/ggml.c yields a/src/ggml.c)."""
    top = _git(["rev-parse", "--show-toplevel"], ggml_root)
    if top.returncode != 0:
        raise VerifyError(f"--revert {ref}: not a file, and {ggml_root} is not in a git repository, so it is "
                          "not a commit either; give a patch file or a commit of the tree's repository")
    found = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], ggml_root)
    if found.returncode != 0:
        raise VerifyError(f"--revert {ref}: no such file, and no such commit in {top.stdout.strip()}")
    commit = found.stdout.strip()
    parent = _git(["rev-parse", "--verify", "--quiet", f"{commit}^"], ggml_root)
    if parent.returncode != 0:
        raise VerifyError(f"--revert {ref}: commit {commit[:12]} has no parent, there is nothing to revert to")
    diff = _git(["diff", "--binary", "--relative", f"{commit}^", commit, "--", "."], ggml_root)
    if diff.returncode != 0:
        raise VerifyError(f"--revert {ref}: git diff failed: {diff.stderr.strip()}")
    if not diff.stdout.strip():
        raise VerifyError(f"--revert {ref}: commit {commit[:12]} changes nothing under {ggml_root}")
    return diff.stdout, f"commit {commit[:12]}"


def read_change(revert, ggml_root):
    """--revert REF|PATCH as (a patch relative to the ggml root, what it is in words)."""
    if Path(revert).is_file():
        return ggml_relative(Path(revert).read_text(), ggml_root), f"patch {revert}"
    return diff_of_commit(revert, ggml_root)


def touched_paths(patch_text):
    """Paths (relative to the ggml root, -p1) that a unified diff touches."""
    paths = set()
    for line in patch_text.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null" and "/" in name:
                rel = name.split("/", 1)[1]
                # a path that climbs out of the tree is not the tree's change: never copy it
                if not rel.startswith("/") and ".." not in Path(rel).parts:
                    paths.add(rel)
    return sorted(paths)


def _file_sections(patch_text):
    """A unified diff cut into one piece per file (each piece's lines, header first)."""
    lines = patch_text.splitlines(keepends=True)
    git_style = any(line.startswith("diff --git ") for line in lines)
    sections, current = [], []
    for i, line in enumerate(lines):
        starts = (line.startswith("diff --git ") if git_style else
                  line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "))
        if starts and current:
            sections.append(current)
            current = []
        current.append(line)
    if current:
        sections.append(current)
    return sections


def ggml_relative(patch_text, ggml_root):
    """A patch made at a llama.cpp checkout's root (`git format-patch`: a/ggml/src/ggml.c) as a
    patch of its ggml/ folder, which is the root the gate builds (a/src/ggml.c): the files
    outside ggml/ are no part of the ggml build and are left out. Any other patch as it is."""
    ggml_root = Path(ggml_root)
    if ggml_root.name != "ggml" or (ggml_root / "ggml").exists():
        return patch_text
    if not any(path.startswith("ggml/") for path in touched_paths(patch_text)):
        return patch_text
    kept = []
    for section in _file_sections(patch_text):
        if not any(path.startswith("ggml/") for path in touched_paths("".join(section))):
            continue    # a llama.cpp file outside ggml/ (or the patch's preamble)
        in_header = True
        for line in section:
            if line.startswith("@@"):
                in_header = False
            if in_header:
                for prefix in ("a/", "b/"):
                    line = line.replace(f" {prefix}ggml/", f" {prefix}")
                if line.startswith(("rename from ggml/", "rename to ggml/", "copy from ggml/", "copy to ggml/")):
                    line = line.replace(" ggml/", " ", 1)
            kept.append(line)
    return "".join(kept)


def reverted_copy(ggml_root, patch_text, dest, what):
    """A copy of the ggml tree (what a build needs, plus every file the patch touches) with
    the patch applied in reverse."""
    copy_tree(ggml_root, dest)
    return revert_in(dest, ggml_root, patch_text, what)


def revert_in(dest, ggml_root, patch_text, what):
    """Apply the patch in reverse to dest, a copy of ggml_root (the files it touches that the copy
    lacks are copied first); VerifyError, naming the tools' words, if it does not apply."""
    dest = Path(dest)
    for rel in touched_paths(patch_text):
        src = Path(ggml_root) / rel
        if src.is_file() and not (dest / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    patch_file = dest.parent / "change.patch"
    patch_file.write_text(patch_text)
    errors = []
    for tool in _apply_commands(patch_file):
        # GIT_CEILING_DIRECTORIES: git apply must not find a repository above the copy and
        # resolve the paths against that repository's root instead of the copy
        env = dict(os.environ, LC_ALL="C", GIT_CEILING_DIRECTORIES=str(dest.parent))
        if shutil.which(tool[0]) is None:
            continue
        check = subprocess.run(tool + ["--check"] if tool[0] == "git" else tool + ["--dry-run"], cwd=dest, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check.returncode == 0:
            done = subprocess.run(tool, cwd=dest, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode == 0:
                return dest
            check = done
        errors.append(f"{' '.join(tool[:3])}: {check.stdout.strip()}")
    raise VerifyError(f"--revert {what}: the change does not apply in reverse to {ggml_root} (is it the change "
                      "this tree contains, with paths a/... b/... relative to the ggml root?)\n  "
                      + "\n  ".join(errors or ["neither git nor patch is installed"]))


def _apply_commands(patch_file):
    return [["git", "apply", "-R", "-p1", str(patch_file)],
            ["patch", "-R", "-p1", "-f", "--silent", "--no-backup-if-mismatch", "-i", str(patch_file)]]


# -- running the cases -----------------------------------------------------------------------
def run_side(ggml_root, report_path, args, workdir, label):
    """Run the selected cases on one tree with pytest --gradgate; returns {case id: record}."""
    cmd = [sys.executable, "-m", "pytest", "--gradgate", "--gradgate-ggml-src", str(ggml_root),
           "--gradgate-json", str(report_path), "--gradgate-backend", args.backend,
           "-p", "no:cacheprovider", "-q", "-rN", "--rootdir", str(workdir), "-c", str(workdir / "pytest.ini")]
    if args.keyword:
        cmd += ["-k", args.keyword]
    if args.cases:
        cmd.append("--gradgate-no-builtin")
        for f in args.cases:
            cmd += ["--gradgate-cases", str(Path(f).resolve())]
    # the run is defined by the command line alone: no inherited source, baseline, cases or
    # outputs (the cache folder is kept: both sides should hit the user's build cache)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRADGATE_", "GITHUB_")) or k == "GRADGATE_CACHE_DIR"}
    Path(report_path).unlink(missing_ok=True)  # a report left in a reused workdir is not this run's
    print(f"gradgate verify: running the cases {label} ({ggml_root})", flush=True)
    proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not Path(report_path).is_file():
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise GradgateError(f"pytest --gradgate {label} did not run (exit {proc.returncode}):\n{tail}")
    doc = json.loads(Path(report_path).read_text())
    return {c["id"]: c for c in doc["cases"]}


def verdict(record):
    if record is None:
        return "not run"
    status = record["status"]
    maa = record.get("maa")
    if status in ("passed", "failed") and maa is not None:
        shown = maa if isinstance(maa, str) else f"{maa:.3g}"
        return f"{status} (MAA {shown})"
    return status


def gates(with_change, without):
    return (with_change is not None and with_change["status"] == "passed"
            and without is not None and without["status"] in FAILING)


def passes_both(with_change, without):
    return (with_change is not None and with_change["status"] == "passed"
            and without is not None and without["status"] == "passed")


def case_of(item_id):
    """The case an item belongs to: its id without the [variant]."""
    return item_id.split("[", 1)[0]


def item_verdicts(with_side, without_side):
    """{item id: "yes" | "control" | "NO"}. An item that passes with and without the change is a
    control where another item of its case gates (a `none` consumer beside the layout that shows
    the bug, a SUM twin beside a SQR loss); alone, it is a case that does not gate."""
    ids = list(with_side) + [i for i in without_side if i not in with_side]
    gating_cases = {case_of(i) for i in ids if gates(with_side.get(i), without_side.get(i))}
    verdicts = {}
    for i in ids:
        a, b = with_side.get(i), without_side.get(i)
        verdicts[i] = ("yes" if gates(a, b) else
                       "control" if passes_both(a, b) and case_of(i) in gating_cases else "NO")
    return verdicts


def table(with_side, without_side):
    """(the table's text, cases that gate, cases) -- a case gates when one of its items gates and
    none is a NO."""
    verdicts = item_verdicts(with_side, without_side)
    rows = [("case", "with the change", "without (reverted)", "gates")]
    for cid, said in verdicts.items():
        rows.append((cid, verdict(with_side.get(cid)), verdict(without_side.get(cid)), said))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    cases = {case_of(i) for i in verdicts}
    failing = {case_of(i) for i, said in verdicts.items() if said == "NO"}
    return "\n".join(lines), len(cases - failing), len(cases)


def verify(args):
    try:
        source = resolve_source(args.ggml_src, option_name="--ggml-src")
    except SourceError as exc:
        raise VerifyError(str(exc)) from None
    root = source.root
    for f in args.cases or ():
        if not Path(f).is_file():
            raise VerifyError(f"--cases {f}: not a file")
    # the change is read before anything is written: bad input leaves no trace
    patch_text, what = read_change(args.revert, root)
    keep = args.workdir is not None
    if keep:
        workdir = own_folder(args.workdir)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="gradgate-verify-"))
    try:
        (workdir / "pytest.ini").write_text("[pytest]\n")
        reverted_dir = workdir / "reverted" / "ggml"
        if reverted_dir.exists():
            shutil.rmtree(reverted_dir)
        reverted = reverted_copy(root, patch_text, reverted_dir, what)
        print(f"gradgate verify: {what} reverted in {reverted}", flush=True)
        with_side = run_side(root, workdir / "with.json", args, workdir, "with the change")
        without_side = run_side(reverted, workdir / "without.json", args, workdir, "without the change")
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not with_side and not without_side:
        raise VerifyError("no case selected" + (f" by -k {args.keyword!r}" if args.keyword else ""))
    text, n_gate, n = table(with_side, without_side)
    print(text)
    controls = sum(1 for said in item_verdicts(with_side, without_side).values() if said == "control")
    also = (f" ({controls} control item(s) pass with and without it, beside an item of their case that gates)"
            if controls else "")
    if n_gate == n:
        print(f"\ngradgate verify: all {n} selected cases gate {what}{also}")
        return 0
    print(f"\ngradgate verify: {n - n_gate} of {n} selected cases do NOT gate {what}{also} "
          "(a case gates when an item of it fails without the change and passes with it, and each of its "
          "other items passes with the change)")
    return 1


def run(args):
    return verify(args)
