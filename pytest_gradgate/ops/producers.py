"""Producers: what a param goes through before it reaches the op under test.

The mirror of a consumer, on the input side. A backward kernel reads the op's forward
inputs too (silu_back reads x, rms_norm_back reads x, soft_max_back reads y, mul's backward
reads the other factor, mul_mat's reads both), and in a training graph those inputs are
often views: a transposed weight, permuted heads, a row slice. A producer makes the param
a leaf of another layout whose view has the declared shape, so the op reads a
non-contiguous input of exactly the shape the case declares; the gradient that is checked
is the leaf's.

Each entry: (leaf shape for a declared shape, the view's strides in elements, builder).
A producer applies to a param only where its view is really non-contiguous (transposing a
column vector changes nothing).
"""

from collections import namedtuple

Producer = namedtuple("Producer", "name doc leaf_shape strides build")
PRODUCERS = {}


def producer(name, doc, leaf_shape, strides):
    def register(build):
        PRODUCERS[name] = Producer(name, doc, leaf_shape, strides, build)
        return build
    return register


def _contiguous_strides(ne):
    nb, step = [], 1
    for n in ne:
        nb.append(step)
        step *= n
    return nb


def _permuted_leaf(axes):
    # ggml_permute(L, axes) puts L's dim i at axes[i]: x.ne[axes[i]] = L.ne[i]
    return lambda ne: tuple(ne[axes[i]] for i in range(4))


def _permuted_strides(axes):
    def strides(ne):
        leaf_nb = _contiguous_strides(_permuted_leaf(axes)(ne))
        nb = [0] * 4
        for i in range(4):
            nb[axes[i]] = leaf_nb[i]
        return nb, 0
    return strides


@producer("none", "x = a (contiguous, as test-backend-ops)", lambda ne: tuple(ne),
          lambda ne: (_contiguous_strides(ne), 0))
def _none(g, leaf, ne):
    return leaf


@producer("transpose", "x = transpose(a): the first stride is not the element size (a transposed weight)",
          _permuted_leaf((1, 0, 2, 3)), _permuted_strides((1, 0, 2, 3)))
def _transpose(g, leaf, ne):
    return g.lib.ggml_transpose(g.ctx, leaf)


@producer("permute_0213", "x = permute(a, 0, 2, 1, 3): rows of contiguous elements, not adjacent (heads)",
          _permuted_leaf((0, 2, 1, 3)), _permuted_strides((0, 2, 1, 3)))
def _permute_0213(g, leaf, ne):
    return g.lib.ggml_permute(g.ctx, leaf, 0, 2, 1, 3)


@producer("permute_1203", "x = permute(a, 1, 2, 0, 3) (non-involutive: a rotation of the dims)",
          _permuted_leaf((1, 2, 0, 3)), _permuted_strides((1, 2, 0, 3)))
def _permute_1203(g, leaf, ne):
    return g.lib.ggml_permute(g.ctx, leaf, 1, 2, 0, 3)


def _gap_leaf(ne):
    return (ne[0] + 1,) + tuple(ne[1:])


@producer("view_gap", "x = view(a): every row of a without its first element (an offset, gapped view)",
          _gap_leaf, lambda ne: (_contiguous_strides(_gap_leaf(ne)), 1))
def _view_gap(g, leaf, ne):
    _, nb = g.layout(leaf)
    return g.lib.ggml_view_4d(g.ctx, leaf, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], nb[0])


# The standard set a case gets when it names neither producers nor consumers (a case that names
# its consumers has chosen its layouts, and gets producer none unless it names producers): the contiguous input and three layouts of
# different kinds (first stride not the element size, rows apart, a gap and an offset). Where
# one cannot lay out any of a case's params differently (a 2-D param has no rows to permute
# apart), the default set leaves it out; a producer named in the case is an error then.
DEFAULT_PRODUCERS = ("none", "transpose", "permute_0213", "view_gap")


def changes_layout(name, ne):
    """Whether producer `name` makes an input of shape ne (4 sizes) non-contiguous."""
    nb, offset = PRODUCERS[name].strides(tuple(ne))
    if offset:
        return True
    expected = 1
    for n, stride in zip(ne, nb):
        if n > 1 and stride != expected:
            return True
        expected *= n
    return False


def laid_out_params(name, params):
    """The params (name -> ne4) that producer `name` lays out differently, in declared order."""
    if name == "none":
        return []
    return [p for p, ne in params.items() if changes_layout(name, ne)]
