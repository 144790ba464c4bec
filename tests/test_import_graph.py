"""The package's modules import one another in one direction: no circle, lazy imports included.

A circle makes a module both a toolbox and a user of its users (check/engine.py was: it ran
the equivalence cases, which imported its graph primitives back), and hides itself behind
imports moved into functions. So every import counts here, at module level or inside a
function. Seen failing: with `from pytest_gradgate.check.engine import run_case` put back into
check/lanes.py, the test names the circle engine -> lanes -> engine.
"""

import ast
from pathlib import Path

import pytest_gradgate

PACKAGE = Path(pytest_gradgate.__file__).parent


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, modules):
    """The package's modules that `path` imports, anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a.b import c` imports a.b.c where c is a module, else a.b
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # a package's __init__ is not a dependency of the modules inside it
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def import_graph():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def find_cycle(graph):
    """One circle of the graph as a list of modules (first == last), or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "pytest_gradgate.check.ggml_graph" in graph["pytest_gradgate.check.engine"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_a_circle():
    """The check itself can fail: a graph with a circle is reported, with its modules."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
