"""Print a gate item's case for another harness: `--format test-backend-ops` gives a C++
`test_case` for ggml's tests/test-backend-ops.cpp and the line that registers it.

    gradgate export 'pytest_gradgate/cases.yaml::concat_dim1[permute_0213_transpose-sqr-cpu]' \\
        --format test-backend-ops

NODE_ID is the item's pytest node id, as `pytest --gradgate` prints it: a case file (a path, or
pytest_gradgate/<file> for the built-in suite), `::`, the case's name and [variant]. Several may
be given.

With --run, the cases are not printed but run in the harness itself (export/harness.py): built
into the tree's own test-backend-ops (--ggml-src: a ggml or llama.cpp tree), and with --revert
REF|PATCH also with that change reverted, the reviewer's "confirm it fails without the fix".
Exit 0 when every case passes (with --revert: fails without the change and passes with it), 1
when not, 2 on bad input.
"""

import dataclasses
from pathlib import Path

from pytest_gradgate.errors import UsageError

FORMATS = ("test-backend-ops",)


def add_arguments(p):
    p.add_argument("node_ids", nargs="+", metavar="NODE_ID",
                   help="a gate item's node id, e.g. 'pytest_gradgate/cases.yaml::concat_dim1[transpose-sqr-cpu]'")
    p.add_argument("--format", choices=FORMATS, required=True, help="what to print: test-backend-ops (C++)")
    p.add_argument("--run", action="store_true", dest="in_harness",
                   help="build the tree's own test-backend-ops with the case(s) and run them there instead of printing")
    p.add_argument("--ggml-src", metavar="PATH",
                   help="with --run: the ggml or llama.cpp tree to build the harness from (default: as pytest "
                        "--gradgate resolves it)")
    p.add_argument("--revert", metavar="REF|PATCH",
                   help="with --run: also run the cases with this change (a commit of the tree's repository, or a "
                        "unified diff) reverted: a case gates it when it fails without the change and passes with it")
    p.add_argument("--workdir", metavar="DIR",
                   help="with --run: build in DIR/gradgate-export and keep it (a later run rebuilds only what "
                        "changed; default: a temporary folder, removed afterwards)")


def case_file(path_part):
    """The case file a node id's path names: a built-in one by its stable id, else a path."""
    from pytest_gradgate.gate.selection import BUILTIN_FILES, builtin_nodeid
    path = Path(path_part)
    if not path.is_file():
        builtin = next((f for f in BUILTIN_FILES if path_part.replace("\\", "/").endswith(builtin_nodeid(f))), None)
        if builtin is None:
            raise UsageError(f"NODE_ID: '{path_part}' is not a case file (give the path before '::' as "
                             "pytest prints it, from the folder it ran in)")
        path = builtin
    return path


def find_case(node_id):
    """The Case of a gate item's node id, or a UsageError saying what the id lacks."""
    from pytest_gradgate.declare.loader import load_file
    from pytest_gradgate.gate.selection import is_builtin
    path_part, sep, item = node_id.partition("::")
    if not sep or not item.endswith("]") or "[" not in item:
        raise UsageError(f"NODE_ID '{node_id}' must be FILE::NAME[VARIANT], a gate item's node id as "
                         "`pytest --gradgate --collect-only -q` prints it")
    path = case_file(path_part)
    name = item[:item.index("[")]
    loaded, errors = load_file(path, ("cpu", "cuda"), builtin=is_builtin(path))
    entry = next((e for e in loaded if e.name == name), None)
    if entry is None:
        bad = next((e for e in errors if f"'{name}'" in str(e) or (e.args and name in e.args[0])), None)
        if bad is not None:
            raise UsageError(f"case '{name}' does not load: {bad}")
        raise UsageError(f"{path} has no case named '{name}'")
    case = next((c for c in entry.cases if c.id == item), None)
    if case is None:
        raise UsageError(f"case '{name}' has no variant [{item[item.index('[') + 1:-1]}]; its items are: "
                         f"{', '.join(c.id for c in entry.cases)}")
    # the comment of the export names the file as the node id does, not where it is installed
    return dataclasses.replace(case, origin={**case.origin, "path": path_part})


def run(args):
    from pytest_gradgate.export import test_backend_ops
    cases = [find_case(node_id) for node_id in args.node_ids]
    exports = [test_backend_ops.text(case) for case in cases]      # refused cases stop here, before a build
    if not args.in_harness:
        for flag in ("ggml_src", "revert", "workdir"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} goes with --run (it says which tree to run the cases in)")
        print("\n".join(exports), end="")
        return 0
    return run_in_harness(args, cases, exports)


def run_in_harness(args, cases, exports):
    import shutil
    import sys
    import tempfile
    from pytest_gradgate.cli import verify
    from pytest_gradgate.errors import SourceError
    from pytest_gradgate.export import harness
    from pytest_gradgate.export.test_backend_ops import op_desc_of
    from pytest_gradgate.library.source import resolve_source
    try:
        source = resolve_source(args.ggml_src, option_name="--ggml-src")
        root = source.root
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    harness.harness_source(root)           # bad input is said before anything is written
    change = verify.read_change(args.revert, root) if args.revert else None

    def progress(text):
        print(f"gradgate export: {text}", file=sys.stderr, flush=True)
    if args.workdir:
        work = verify.own_folder(args.workdir, "export")
    else:
        work = Path(tempfile.mkdtemp(prefix="gradgate-export-"))
    ops = [op_desc_of(case) for case in cases]
    ids = [case.id for case in cases]
    try:
        tree = work / "harness"
        copy = harness.prepare(root, exports, tree)
        progress(f"test-backend-ops from {harness.harness_source(root)}, ggml {source.version} from {source.label}, "
                 f"with {len(cases)} exported case(s); building in {tree}")
        with_change, seconds = harness.run(harness.build(tree, progress), ops, ids)
        progress(f"ran test-backend-ops grad -o {' -o '.join(dict.fromkeys(ops))} in {seconds:.1f} s")
        without = None
        if change is not None:
            patch_text, what = change
            verify.revert_in(copy, root, patch_text, what)
            progress(f"{what} reverted in {copy}; building again")
            without, seconds = harness.run(harness.build(tree, progress), ops, ids)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return report(ids, with_change, without, change[1] if change else None)


def report(ids, with_change, without, what):
    """Print each case's verdict(s); -> the exit code."""
    if without is None:
        for case_id in ids:
            print(f"{case_id}: {with_change[case_id].text()}")
        failing = [i for i in ids if with_change[i].status != "ok"]
        print(f"\ngradgate export: {len(ids) - len(failing)} of {len(ids)} case(s) pass in test-backend-ops")
        return 1 if failing else 0
    gate = []
    for case_id in ids:
        on, off = with_change[case_id], without[case_id]
        gates = on.status == "ok" and off.status in ("fail", "died")
        gate.append(gates)
        print(f"{case_id}:\n  with the change:    {on.text()}\n  without the change: {off.text()}\n"
              f"  {'gates the change' if gates else 'does NOT gate the change'}")
    print(f"\ngradgate export: {sum(gate)} of {len(ids)} case(s) gate {what} in test-backend-ops (a case gates it "
          "when it fails without the change and passes with it)")
    return 0 if all(gate) else 1
