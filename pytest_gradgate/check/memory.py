"""What the session's memory checks found (library/native/gradgate_shim.c, gg_session_alloc):
a guard zone that changed (a kernel wrote outside its tensor) and elements no kernel wrote.

Both are facts the run verified, not guesses from gradient values: a zone holds its pattern
until something writes it, and every tensor's data starts as a NaN bit pattern that no kernel
computes. A zone that changed stays changed, so one check after a phase's computes sees a write
made by any of them; the writer is then named by replaying the graph one node at a time from the
same inputs, and only when the replay reproduces the write.
"""

from dataclasses import dataclass

from pytest_gradgate.check.ggml_graph import write_tensor
from pytest_gradgate.check.metrics import ggml_index
from pytest_gradgate.check.outcome import Diagnosis


@dataclass
class Finding:
    kind: Diagnosis
    text: str           # the diagnosis: what was written or left unwritten, where, by which node
    summary: str        # one line for the failure's message
    culprit: str = ""   # the ggml op of the node at fault, when the run named one (ROPE)


def describe(g, t):
    """'ROPE output f32 [7, 2, 3, 1]' or "param 'a' f32 [7, 2, 3, 1]": a tensor as a person finds it."""
    name, shape = _name(g, t), _type_and_shape(g, t)
    op = g.ffi.string(g.lib.gg_tensor_op_name(t)).decode()
    if op == "NONE":
        return f"tensor '{name}' {shape}" if name else f"a leaf tensor {shape}"
    return f"the {op} node's output{f' {name!r}' if name else ''} {shape}"


def _name(g, t):
    return g.ffi.string(g.lib.gg_tensor_name(t)).decode(errors="replace")


def _type_and_shape(g, t):
    ne, _ = g.layout(t)
    return f"{'f32' if g.lib.gg_tensor_is_f32(t) else 'i32'} {list(ne)}"


def guard_breach(g, session, graph, during):
    """None when every guard zone holds its pattern, else a Finding naming the tensor, the side,
    the bytes and (replaying `graph` node by node after writing the case's values again) the node
    whose compute wrote them. `during`: the computes the check covers, for the text."""
    lib, ffi = g.lib, g.ffi
    k, side = ffi.new("int *"), ffi.new("int *")
    first, last, n_changed = ffi.new("int64_t *"), ffi.new("int64_t *"), ffi.new("int64_t *")
    if not lib.gg_session_guard_check(session, k, side, first, last, n_changed):
        return None
    tensor = lib.gg_session_guarded_tensor(session, k[0])
    where = "past the end of" if side[0] > 0 else "before the start of"
    span = f"byte {first[0]}" if first[0] == last[0] else f"bytes {first[0]} to {last[0]}"
    changed = (f"{n_changed[0]} guard byte{'s' if n_changed[0] != 1 else ''} changed, {span} "
               f"{'after its end' if side[0] > 0 else 'before its start'}")
    writer = _replay(g, session, graph)
    if writer is None:
        text = (f"a write {where} {describe(g, tensor)} ({changed}) during the {during}; a replay of the graph one "
                "node at a time from the same inputs did not write there again, so no node is named (the write "
                "depends on thread timing)")
        return Finding(Diagnosis.OUT_OF_BOUNDS_WRITE, text, f"a write {where} {describe(g, tensor)}")
    index, node = writer
    op = g.ffi.string(lib.gg_tensor_op_name(node)).decode()
    target = f"its output {_shape_of(g, tensor)}" if node == tensor else describe(g, tensor)
    text = (f"the {op} kernel (node {index} of the graph) wrote {where} {target} ({changed}) during the {during}; "
            "a replay of the graph one node at a time reproduced the write at this node")
    return Finding(Diagnosis.OUT_OF_BOUNDS_WRITE, text, f"{op} wrote {where} {target}", op)


def _shape_of(g, t):
    name = _name(g, t)
    return f"{name + ' ' if name else ''}{_type_and_shape(g, t)}"


def _replay(g, session, graph):
    """(index, node) of the first node of `graph` whose compute changes a guard zone, starting
    from fresh zones and the case's values; None when no node does."""
    lib = g.lib
    lib.gg_session_guard_fill(session)
    for t, values in g.values:
        write_tensor(g, t, values)
    lib.ggml_graph_reset(graph)
    i = lib.gg_session_guard_replay(session, graph)
    if i < 0:
        return None
    return i, lib.gg_graph_node(graph, i)


def unwritten(g, session, graph):
    """None, or a Finding for the first node of `graph` (compute order) whose output still holds
    elements at the pattern every tensor starts with: its kernel never wrote them. Nodes after it
    that read them show them too; the first is the one that left them."""
    lib, ffi = g.lib, g.ffi
    n, first = ffi.new("int64_t *"), ffi.new("int64_t *")
    i = lib.gg_session_unwritten(session, graph, n, first)
    if i < 0:
        return None
    node = lib.gg_graph_node(graph, i)
    ne, _ = g.layout(node)
    op = ffi.string(lib.gg_tensor_op_name(node)).decode()
    total = ne[0] * ne[1] * ne[2] * ne[3]
    text = (f"unwritten elements: the {op} kernel left {n[0]} of {total} elements of its output "
            f"({describe(g, node)}, node {i} of the graph) unwritten, the first at {ggml_index(first[0], ne)}: "
            "they still hold the NaN pattern every tensor starts with, so whatever reads them reads "
            "memory no kernel wrote")
    return Finding(Diagnosis.UNWRITTEN, text, f"{op} left {n[0]} of {total} output elements unwritten", op)
