"""Declared ops (docs/declared-ops.md) for the search: a fork's own ops, drawn like the table's.

They come from case files' `ops:` (the top level's and each case's) and from Python (the
pytest_gradgate_ops hook), as plain data: name -> {"c": prototype, "ranges": {arg: [lo, hi]}}.
Plain, because a job of the search runs in a process of its own and gets them as JSON.
The table's shape functions do not exist for them: their output's shape is ggml's to say, in
the worker (space.py draws them as a chain's last op only, and their other tensors' shapes).
"""

from pathlib import Path

from pytest_gradgate.errors import CaseError, UsageError


def normalise(ops, where):
    """{name: prototype or {c, ranges}} -> {name: {"c": prototype, "ranges": {arg: [lo, hi]}}};
    a UsageError naming `where` for an op that does not parse, clashes with the table, or whose
    ranges are wrong."""
    from pytest_gradgate.ops.declared import check_ranges, parse_prototype
    from pytest_gradgate.ops.table import OPS
    if not isinstance(ops, dict):
        raise UsageError(f"{where}: declared ops must map op names to C prototypes")
    out = {}
    for name, spec in ops.items():
        text, ranges = (spec.get("c"), spec.get("ranges")) if isinstance(spec, dict) else (spec, None)
        if name in OPS:
            raise UsageError(f"{where}: op '{name}' is an op of the built-in table; give the declared op a name of "
                             "its own")
        try:
            checked = check_ranges(parse_prototype(name, text), ranges)
        except CaseError as exc:
            raise UsageError(f"{where}: {exc}") from None
        out[name] = {"c": text.strip(), "ranges": {arg: list(b) for arg, b in checked.items()}}
    return out


def merge(into, more, where):
    """Add `more` to `into`; one name declared twice with two prototypes is a UsageError."""
    for name, spec in more.items():
        held = into.get(name)
        if held is not None and held["c"].rstrip(";") != spec["c"].rstrip(";"):
            raise UsageError(f"{where}: op '{name}' is declared again with another prototype ({held['c']!r} before)")
        if held is None or not held["ranges"]:
            into[name] = spec
    return into


def from_files(paths, option="--cases"):
    """The ops declared in case files (top level and cases' own), checked as the loader checks them:
    a file with errors in its ops is a UsageError with them."""
    import yaml
    from pytest_gradgate.declare.loader import load_file
    found = {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"{option}: {path} is not a file")
        _, errors = load_file(path)
        broken = [str(e) for e in errors if "op '" in str(e)]
        if broken:
            raise UsageError(f"{option}: the declared ops of {path} have errors:\n  " + "\n  ".join(broken))
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            continue
        merge(found, normalise(data.get("ops") or {}, f"{path}: ops"), str(path))
        for case in data.get("cases") or ():
            if isinstance(case, dict) and case.get("ops"):
                merge(found, normalise(case["ops"], f"{path}: case {case.get('name')!r}"), str(path))
    return found


def prototypes(declared):
    """{name: prototype}, what a case's `ops:` and ops/declared.py table_for take."""
    return {name: spec["c"] for name, spec in (declared or {}).items()}
