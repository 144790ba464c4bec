"""A case's graph in ggml: the context and its helpers (GraphBuilder), the leaves with their
values, the forward graph up to the loss, and reading and writing tensors through their strides.

The toolbox that every check uses (the finite-difference engine, the equivalence and parity
comparisons, the lanes, the self-checks); it imports no check, so no check imports another
through it.
"""

import numpy as np

from pytest_gradgate.library import binding
from pytest_gradgate.declare.expr import ops_used
from pytest_gradgate.declare.graph import input_shape, walk
from pytest_gradgate.ops.consumers import CONSUMERS
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.producers import PRODUCERS, laid_out_params
from pytest_gradgate.ops.declared import table_for
from pytest_gradgate.ops.table import ne4

# Room in a graph beyond the tensors its context can hold (see GraphBuilder).
GRAPH_SLACK = 16


class GraphBuilder:
    """What op builders, consumers and losses get: the library, the context, helpers."""

    def __init__(self, lib, case, n_tensors, graph_room=0):
        self.lib = lib
        self.ffi = binding.ffi
        self.case = case
        # Tensors in self.ctx, graphs in a context of their own. A graph's nodes and leafs are
        # tensors of self.ctx, which holds n_tensors (and a few more in the room it keeps for
        # graphs it never makes), so a graph of n_tensors + GRAPH_SLACK is never full (a full
        # graph aborts: a crash that would be blamed on the op). In one context the graphs'
        # room, unused, could hold more tensors than any such size; and the fixed 4096 it had
        # made every case fault in ~0.5 MB of hash arrays it never used (120 page faults,
        # 1.5-2 ms per small case in a forked child).
        self.graph_size = n_tensors + GRAPH_SLACK
        # graph_room: graphs of that size that others make in self.ctx (ggml-opt makes its own)
        self.ctx = lib.gg_ctx_new(n_tensors, graph_room)
        self.graph_ctx = lib.gg_ctx_new(0, self.graph_size)     # room for 4 graphs
        if self.ctx == binding.ffi.NULL or self.graph_ctx == binding.ffi.NULL:
            self.free()
            raise MemoryError("ggml_init failed")
        self.rng = np.random.default_rng(case.seed)
        self.values = []          # (tensor, numpy array) written after allocation

    def forward_graph(self, loss):
        return self.lib.gg_graph_forward(self.graph_ctx, loss, self.graph_size)

    def backward_graph(self, gf):
        return self.lib.gg_graph_backward(self.graph_ctx, self.ctx, gf, self.graph_size)

    def free(self):
        for ctx in (self.ctx, self.graph_ctx):
            if ctx != binding.ffi.NULL:
                self.lib.gg_ctx_free(ctx)

    def layout(self, t):
        ne = self.ffi.new("int64_t[4]")
        nb = self.ffi.new("size_t[4]")
        self.lib.gg_tensor_layout(t, ne, nb)
        return list(ne), list(nb)

    def is_contiguous(self, t):
        ne, nb = self.layout(t)
        expected = 4
        for i in range(4):
            # ne0 = 1 does not excuse nb0: ggml's CPU kernels assert nb0 == sizeof(float) whatever
            # ne0 is, and transpose(a) of a vector a is [1, n] with nb0 = 4n (explore found it:
            # the loss's sqr aborted behind such an output, which blamed the op)
            if (ne[i] > 1 or i == 0) and nb[i] != expected:
                return False
            expected *= ne[i]
        return True

    def contiguous(self, t):
        return t if self.is_contiguous(t) else self.lib.ggml_cont(self.ctx, t)

    def new_tensor(self, ne, is_i32=False, name=None):
        ne = ne4(ne)
        t = self.lib.gg_new_tensor(self.ctx, 1 if is_i32 else 0, 4, self.ffi.new("int64_t[4]", list(ne)))
        if name:
            self.lib.ggml_set_name(t, name.encode()[:63])
        return t

    def shape_tensor(self, shape):
        return self.new_tensor(shape, name="__shape")

    def constant(self, name, ne, init):
        t = self.new_tensor(ne, name=name)
        self.values.append((t, make_values(np.random.default_rng(self.case.seed + 7919), ne4(ne), init)))
        return t


def make_values(rng, ne, init):
    """Values for a tensor of shape ne (logical order, i0 fastest) from an init spec."""
    n = int(np.prod(ne))
    if isinstance(init, dict) and "abs" in init:
        lo, hi = init["abs"]
        return (rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    if init == "causal_mask":
        i0 = np.arange(ne[0])[None, :]
        i1 = np.arange(ne[1])[:, None]
        rows = np.where(i0 > i1 + (ne[0] - ne[1]), -np.inf, 0.0)
        return np.broadcast_to(rows, (ne[3] * ne[2], ne[1], ne[0])).astype(np.float32).ravel()
    if init == "probs":
        x = rng.uniform(0.1, 1.0, (n // ne[0], ne[0]))
        return (x / x.sum(axis=1, keepdims=True)).astype(np.float32).ravel()
    lo, hi = init
    return rng.uniform(lo, hi, n).astype(np.float32)


def read_tensor(g, t, dtype=np.float64):
    """A tensor's values through its strides (it may be a view), logical order, float64
    (or `dtype`: float32 keeps ggml's values exactly, in half the fresh memory)."""
    ne, nb = g.layout(t)
    nbytes = g.lib.gg_tensor_nbytes(t)
    buf = np.empty(nbytes, dtype=np.uint8)
    g.lib.gg_tensor_read(t, g.ffi.from_buffer(buf), 0, nbytes)
    arr = np.ndarray(shape=(ne[3], ne[2], ne[1], ne[0]), dtype=np.float32, buffer=buf,
                     strides=(nb[3], nb[2], nb[1], nb[0]))
    return arr.astype(dtype).ravel()


def write_tensor(g, t, values):
    data = np.ascontiguousarray(values)
    g.lib.gg_tensor_write(t, g.ffi.from_buffer(data), 0, data.nbytes)


def build_leaves(g, case):
    """The case's params and inputs as tensors of g, their values queued for writing ->
    (leaves the graph reads, param tensors, leaf shapes, params laid out by the producer).
    The values depend on the case alone (its seed, in declaration order), so every graph built
    from one case (the formulations of an equivalence case) sees the same."""
    lib = g.lib
    leaves, params, shapes = {}, {}, {}
    declared = {name: ne4(shape) for name, shape in case.params.items()}
    laid_out = laid_out_params(case.producer, declared)
    for name, ne in declared.items():
        # through a producer the op reads a view of the declared shape; the leaf behind it
        # (another layout) is what gets the gradient and the finite differences
        producer = PRODUCERS[case.producer if name in laid_out else "none"]
        shapes[name] = producer.leaf_shape(ne)
        t = g.new_tensor(shapes[name], name=name)
        lib.ggml_set_param(t)
        params[name] = t
        leaves[name] = producer.build(g, t, ne)
        # init ranges are per element, so values drawn for the leaf's shape are as good
        g.values.append((t, make_values(g.rng, shapes[name], case.init.get(name, (-1.0, 1.0)))))
    for name, spec in case.inputs.items():
        is_i32 = spec.get("type", "f32") == "i32"
        t = g.new_tensor(input_shape(spec), is_i32=is_i32, name=name)
        leaves[name] = t
        if "values" in spec:
            g.values.append((t, np.asarray(spec["values"], dtype=np.int32 if is_i32 else np.float32)))
        else:
            g.values.append((t, make_values(g.rng, input_shape(spec), spec.get("init", (-1.0, 1.0)))))
    return leaves, params, shapes, laid_out


def graph_tensors(case, lines):
    """Tensors a context needs for one case's graph: sized by ops, not lines (one line may nest
    many: its forward, consumer, loss and backward tensors), with room for the power probe's
    second backward over the same nodes, and for a producer's view of each param."""
    n_ops = max(len(lines), len(ops_used(lines)))
    return 128 + 64 * n_ops + 2 * len(case.params) + len(case.inputs)


def forward_parts(g, case, lines):
    """The case's leaves and forward graph in g -> (declared shapes, params laid out by the
    producer, param leaves, leaf shapes, the op's output)."""
    leaves, params, shapes, laid_out = build_leaves(g, case)
    declared = {name: ne4(shape) for name, shape in case.params.items()}
    y = walk(lines, leaves, lambda spec, tensors, p: spec.build(g, tensors, p), table_for(case.ops))
    return declared, laid_out, params, shapes, y


def build_forward(g, case, lines):
    """The case's forward graph up to its loss: ({param: tensor}, y the op's output, z what the
    loss reads, loss). Values to write after allocation go to g.values."""
    _, _, params, _, y = forward_parts(g, case, lines)
    # an op whose output is a view (transpose, permute) would reach the loss's sqr kernel
    # non-contiguous, which ggml's CPU unary kernels reject; the cont makes the gradient
    # reach the op contiguous, which is what consumer `none` means
    z = g.contiguous(CONSUMERS[case.consumer].build(g, y))
    return params, y, z, LOSSES[case.loss].build(g, z)
