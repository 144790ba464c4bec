"""The arithmetic of a backend's matmuls, as far as a roundoff limit needs it.

ggml-cuda runs f32 matmuls through cuBLAS with TF32 tensor-core math: each input is rounded to
TF32 (a 10-bit mantissa: unit roundoff u = 2^-11) before the products are summed in f32. Each
product then carries two input roundings of relative size up to u (uniform: variance u^2/3
each), and a matmul's result, a sum of n such products, carries their weighted mean: on inputs
of mixed sign its error and the sum grow alike with the reduction length n (random walks both),
so the relative error is about u whatever n is; the f32 sum's own roundoff, which does grow with
n, is counted as for any f32 matmul (check/roundoff.py). A chain of matmuls (a forward's and the
two of each backward) adds one such variance per matmul.

SAFETY is smaller than the f32 model's (check/gradsets.py): TF32's error is one rounding per
input, well modelled, where the f32 margin covers conditioning and kernels that round more
often. With it a planted 1% scale error (NMSE 1e-4) stays 10x above the limit of a chain of
three matmuls (4^2 x 3 x 2u^2/3 = 7.6e-6), and the TF32-against-f32 difference of a clean
matmul (about 2u^2/3 = 1.6e-7) is 10x below the limit of one (tests/test_parity.py).

A limit made for f32 turns clean matmul-heavy CUDA cases red (attention-sized cases differ
from f32 at ~1e-4 relative); a limit made for TF32 everywhere would weaken the CPU's. So the
precision is per backend: `cuda` is TF32 unless told otherwise, `cpu` is f32, and
--gradgate-tf32 names the backends whose matmuls are TF32 (a CPU build whose mul_mat rounds to
TF32 is told apart by it).
"""

TF32_UNIT_ROUNDOFF = 2.0 ** -11
# relative variance one product of two rounded inputs carries, by what the inputs are rounded to
INPUT_VARIANCE = {"f32": 0.0, "tf32": 2 * TF32_UNIT_ROUNDOFF ** 2 / 3}
SAFETY = 4.0
DEFAULT_TF32_BACKENDS = ("cuda",)


def input_variance(name):
    return INPUT_VARIANCE[name]


def parse_backends(text):
    """--gradgate-tf32's value -> the backends named (\\"none\\" or empty: no backend)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    return () if names in ([], ["none"]) else tuple(names)


def matmul_precision(backend, tf32_backends=DEFAULT_TF32_BACKENDS):
    """The precision of `backend`'s f32 matmuls."""
    return "tf32" if backend in tf32_backends else "f32"
