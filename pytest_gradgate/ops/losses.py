"""Losses: how the consumed output becomes the scalar whose gradient is checked.

`sqr` = sum(z^2): the gradient arriving at z is 2z, different at every element, so a
backward that reads it from the wrong positions gets caught. `wsqr` weights each z^2
with fixed random weights, for ops whose sum of squares is (nearly) constant (rms_norm
rows, softmax rows). `sum` is test-backend-ops' loss, kept to show why it is blind: its
gradient is all ones, which survives any scramble.

Each loss also says its `scale`: the sum of |terms| it adds up, which bounds the f32
roundoff of one loss evaluation (metrics.numeric_noise). For sqr/wsqr every term is
non-negative, so that is |loss|; for sum it is sum |z|, which cancellation can make much
larger than |loss|.
"""

from collections import namedtuple

Loss = namedtuple("Loss", "name build doc scale")
LOSSES = {}


def _abs_loss(g, z, loss_value, read):
    return abs(loss_value)


def loss(name, doc, scale=_abs_loss):
    """scale(g, z, loss_value, read) -> sum of |terms|; read(t) gives a tensor's values."""
    def register(build):
        LOSSES[name] = Loss(name, build, doc, scale)
        return build
    return register


@loss("sqr", "sum(sqr(z))")
def _sqr(g, z):
    return g.lib.ggml_sum(g.ctx, g.lib.ggml_sqr(g.ctx, z))


@loss("wsqr", "sum(w * sqr(z)), w fixed random in [0.1, 1]")
def _wsqr(g, z):
    ne, _ = g.layout(z)
    w = g.constant("__loss_weights", ne, (0.1, 1.0))
    return g.lib.ggml_sum(g.ctx, g.lib.ggml_mul(g.ctx, g.lib.ggml_sqr(g.ctx, z), w))


def _sum_abs(g, z, loss_value, read):
    return float(abs(read(z)).sum())


@loss("sum", "sum(z) (test-backend-ops' loss; blind to scrambles)", scale=_sum_abs)
def _sum(g, z):
    return g.lib.ggml_sum(g.ctx, z)
