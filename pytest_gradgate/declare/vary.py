"""Parameter axes: one case entry over several values of an op's parameters or shapes.

    - name: permute
      params: {a: [2, 3, 4, 5]}
      graph: cont(permute(a, axes=$axes))
      vary:
        axes: [[0, 1, 3, 2], [1, 0, 2, 3], [3, 2, 1, 0]]

`vary` maps names to lists of values and the entry becomes one case per combination (their
product); a list of mappings instead gives the combinations one by one. In every other value
of the entry, a string that is exactly `$name` becomes the value itself (so shapes can vary:
`a: [4, 3, $n2]`), and `$name` inside a longer string (a graph line) becomes the value's
literal (`[0, 1, 3, 2]`). Each case is named after its values, e.g.
`permute,axes=0-1-3-2`, so that `-k` and node ids can pick one.
"""

import itertools
import re

from pytest_gradgate.errors import CaseError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_CASES = 1000        # what one entry may expand to: a typo should not make a million items


def _label(value):
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "-".join(_label(v) for v in value)
    return str(value)


def _literal(value):
    if isinstance(value, str):
        return value
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def _substitute(value, bindings):
    if isinstance(value, str):
        for key, bound in bindings.items():
            if value == f"${key}":
                return bound
        for key in sorted(bindings, key=len, reverse=True):    # $n2 before $n
            value = value.replace(f"${key}", _literal(bindings[key]))
        return value
    if isinstance(value, list):
        return [_substitute(v, bindings) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, bindings) for k, v in value.items()}
    return value


def combinations(vary, where):
    """The list of {name: value} bindings that `vary` declares."""
    if isinstance(vary, dict):
        for key, values in vary.items():
            if not isinstance(key, str) or not NAME_RE.match(key):
                raise CaseError(f"vary: {key!r} is not a name (letters, digits, _)", *where)
            if not isinstance(values, list) or not values:
                raise CaseError(f"vary: '{key}' must be a non-empty list of values, got {values!r}", *where)
        keys = list(vary)
        total = 1
        for key in keys:
            total *= len(vary[key])
        if total > MAX_CASES:
            raise CaseError(f"vary: {' x '.join(str(len(vary[k])) for k in keys)} = {total} combinations; at most "
                            f"{MAX_CASES} per entry (split it, or list the combinations you want)", *where)
        return [dict(zip(keys, values)) for values in itertools.product(*(vary[k] for k in keys))]
    if isinstance(vary, list) and vary and all(isinstance(b, dict) and b for b in vary):
        if len(vary) > MAX_CASES:
            raise CaseError(f"vary: {len(vary)} combinations; at most {MAX_CASES} per entry", *where)
        for bindings in vary:
            for key in bindings:
                if not isinstance(key, str) or not NAME_RE.match(key):
                    raise CaseError(f"vary: {key!r} is not a name (letters, digits, _)", *where)
        return [dict(b) for b in vary]
    raise CaseError("'vary' must map names to lists of values (their product), or be a list of "
                    "{name: value} mappings", *where)


def expand(raw, where):
    """The case mappings that `raw` stands for: itself without `vary`, else one per combination."""
    if "vary" not in raw:
        return [raw]
    rest = {k: v for k, v in raw.items() if k != "vary"}
    cases = []
    for bindings in combinations(raw["vary"], where):
        case = _substitute(rest, bindings)
        # "," joins, not ".": pytest's verbose lines show a "." of a test's name as "::"
        case["name"] = ",".join([str(raw.get("name"))] + [f"{k}={_label(v)}" for k, v in bindings.items()])
        cases.append(case)
    return cases
