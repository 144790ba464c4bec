"""Losses: how the consumed output becomes the scalar whose gradient is checked.

`sqr` = sum(z^2): the gradient arriving at z is 2z, different at every element, so a
backward that reads it from the wrong positions gets caught. `wsqr` weights each z^2
with fixed random weights, for ops whose sum of squares is (nearly) constant (rms_norm
rows, softmax rows). `sum` is test-backend-ops' loss, kept to show why it is blind: its
gradient is all ones, which survives any scramble.
"""

from collections import namedtuple

Loss = namedtuple("Loss", "name build doc")
LOSSES = {}


def loss(name, doc):
    def register(build):
        LOSSES[name] = Loss(name, build, doc)
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


@loss("sum", "sum(z) (test-backend-ops' loss; blind to scrambles)")
def _sum(g, z):
    return g.lib.ggml_sum(g.ctx, z)
