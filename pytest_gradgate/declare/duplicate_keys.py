"""Keys that a YAML mapping holds twice, found in the node tree before PyYAML builds dicts.

PyYAML keeps the last of two equal keys without a word, so a copy-paste slip (`name:` or
`graph:` twice in a case, `cases:` twice at the top) ran another case than the one the user
read, or dropped a list of cases. The loader (declare/loader.py) makes each of these an
error at the line of the second occurrence, naming the first's line.
"""

from dataclasses import dataclass

import yaml


@dataclass(frozen=True)
class DuplicateKey:
    key: str
    first_line: int     # 1-based lines of the file
    line: int           # of the second occurrence: where the error points
    trail: tuple = ()   # keys of the mappings above it, under the node that was searched

    def describe(self, advice="remove one of them, or rename it"):
        where = f" in '{': '.join(self.trail)}'" if self.trail else ""
        return (f"duplicate key '{self.key}'{where} (first on line {self.first_line}): a YAML reader keeps "
                f"the last of the two and drops the first without a word; {advice}")


def _identity(key_node):
    # `a:` and `"a":` are one key to PyYAML (same tag, same value); `1:` and `"1":` are not
    return (key_node.tag, key_node.value) if isinstance(key_node, yaml.ScalarNode) else None


def duplicates_in(pairs):
    """Each key of these (key node, value node) pairs that comes again: a DuplicateKey at its
    second (third...) occurrence, in the order of the pairs."""
    first, found = {}, []
    for key_node, _ in pairs:
        ident = _identity(key_node)
        if ident is None:
            continue
        line = key_node.start_mark.line + 1
        if ident in first:
            found.append(DuplicateKey(str(key_node.value), first[ident], line))
        else:
            first[ident] = line
    return found


def first_duplicate(node):
    """The first (in file order) key held twice by any mapping in `node`'s tree, or None.
    An alias is the node it names: a tree is walked once per node, and a recursive one ends."""
    seen, found = set(), []

    def walk(n, trail):
        if id(n) in seen:
            return
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            found.extend(DuplicateKey(d.key, d.first_line, d.line, trail) for d in duplicates_in(n.value))
            for k, v in n.value:
                walk(v, trail + (str(k.value),) if isinstance(k, yaml.ScalarNode) else trail)
        elif isinstance(n, yaml.SequenceNode):
            for item in n.value:
                walk(item, trail)
    walk(node, ())
    return min(found, key=lambda d: d.line, default=None)
