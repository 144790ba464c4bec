"""Consumers: what sits between the op under test and the loss.

Each one makes the gradient *arrive* at the op with other strides than the op's output
has. `none` is the contiguous consumer test-backend-ops uses; the others are the ways
real training graphs read an op's output (attention transposes V, permutes heads, takes
strided views). Each entry: (requirement on the output shape or None, builder).
"""

from collections import namedtuple

Consumer = namedtuple("Consumer", "name requires build doc")
CONSUMERS = {}


def consumer(name, doc, requires=None):
    def register(build):
        CONSUMERS[name] = Consumer(name, requires, build, doc)
        return build
    return register


@consumer("none", "z = y (contiguous, as test-backend-ops)")
def _none(g, y):
    return y


@consumer("transpose", "z = cont(transpose(y))")
def _transpose(g, y):
    return g.lib.ggml_cont(g.ctx, g.lib.ggml_transpose(g.ctx, y))


@consumer("permute_0213_transpose", "z = cont(transpose(permute(y, 0, 2, 1, 3))) (the CONCAT story's consumer)")
def _permute_0213_transpose(g, y):
    return g.lib.ggml_cont(g.ctx, g.lib.ggml_transpose(g.ctx, g.lib.ggml_permute(g.ctx, y, 0, 2, 1, 3)))


@consumer("permute_1203", "z = cont(permute(y, 1, 2, 0, 3)) (non-involutive: its inverse is another permute)")
def _permute_1203(g, y):
    return g.lib.ggml_cont(g.ctx, g.lib.ggml_permute(g.ctx, y, 1, 2, 0, 3))


@consumer("permute_2013", "z = cont(permute(y, 2, 0, 1, 3)) (non-involutive, the other rotation)")
def _permute_2013(g, y):
    return g.lib.ggml_cont(g.ctx, g.lib.ggml_permute(g.ctx, y, 2, 0, 1, 3))


def _needs_two_columns(ne):
    return None if ne[0] >= 2 else f"view_gap needs ne0 >= 2, the output has {list(ne)}"


@consumer("view_gap", "z = cont(view(y)): every row without its first element (an offset, gapped view)",
          requires=_needs_two_columns)
def _view_gap(g, y):
    ne, nb = g.layout(y)
    v = g.lib.ggml_view_4d(g.ctx, y, ne[0] - 1, ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], nb[0])
    return g.lib.ggml_cont(g.ctx, v)


@consumer("transpose_view_gap", "z = cont(transpose(view(y))): a gapped view read transposed",
          requires=_needs_two_columns)
def _transpose_view_gap(g, y):
    ne, nb = g.layout(y)
    v = g.lib.ggml_view_4d(g.ctx, y, ne[0] - 1, ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], nb[0])
    return g.lib.ggml_cont(g.ctx, g.lib.ggml_transpose(g.ctx, v))


@consumer("reshape", "z = reshape(y, [ne1, ne0, ne2, ne3]) (same memory, other shape)")
def _reshape(g, y):
    ne, _ = g.layout(y)
    return g.lib.ggml_reshape_4d(g.ctx, g.contiguous(y), ne[1], ne[0], ne[2], ne[3])


# The standard set a case gets when it names none: the contiguous consumer and three
# non-contiguous ones of different kinds (transpose, the story's permute, a rotation).
DEFAULT_CONSUMERS = ("none", "transpose", "permute_0213_transpose", "permute_1203")


def check_consumer(name, out_shape):
    """None if `name` can consume an output of this shape, else why not."""
    c = CONSUMERS[name]
    return c.requires(out_shape) if c.requires else None
