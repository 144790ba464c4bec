"""Print a gate item's case for another harness: `--format test-backend-ops` gives a C++
`test_case` for ggml's tests/test-backend-ops.cpp and the line that registers it.

    gradgate export 'pytest_gradgate/cases.yaml::concat_dim1[permute_0213_transpose-sqr-cpu]' \\
        --format test-backend-ops

NODE_ID is the item's pytest node id, as `pytest --gradgate` prints it: a case file (a path, or
pytest_gradgate/<file> for the built-in suite), `::`, the case's name and [variant].
"""

import dataclasses
from pathlib import Path

from pytest_gradgate.errors import UsageError

FORMATS = ("test-backend-ops",)


def add_arguments(p):
    p.add_argument("node_id", metavar="NODE_ID",
                   help="a gate item's node id, e.g. 'pytest_gradgate/cases.yaml::concat_dim1[transpose-sqr-cpu]'")
    p.add_argument("--format", choices=FORMATS, required=True, help="what to print: test-backend-ops (C++)")


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
    print(test_backend_ops.text(find_case(args.node_id)), end="")
    return 0
