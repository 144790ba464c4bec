"""The arithmetic of a backend's matmuls, as far as a roundoff limit needs it.

ggml-cuda runs f32 matmuls through cuBLAS with TF32 tensor-core math: each input is rounded to
TF32 (a 10-bit mantissa: unit roundoff 2^-11, machine epsilon 2^-10) before the products are
summed in f32. A row of n products then carries n roundings of that size instead of f32's, so
its error grows with the reduction length as f32's does (check/roundoff.py counts the steps),
only 2^13 times larger per step. Every other op stays f32.

A limit made for f32 turns clean matmul-heavy CUDA cases red (attention-sized cases differ
from f32 at ~1e-4 relative); a limit made for TF32 everywhere would weaken the CPU's. So the
precision is per backend: `cuda` is TF32 unless told otherwise, `cpu` is f32, and
--gradgate-tf32 names the backends whose matmuls are TF32 (a CPU build whose mul_mat rounds to
TF32, in the tests, is told apart by it).
"""

F32_EPS = 2.0 ** -23
TF32_EPS = 2.0 ** -10       # as F32_EPS is f32's: twice the unit roundoff 2^-11
EPS = {"f32": F32_EPS, "tf32": TF32_EPS}
DEFAULT_TF32_BACKENDS = ("cuda",)


def matmul_eps(name):
    return EPS[name]


def parse_backends(text):
    """--gradgate-tf32's value -> the backends named (\\"none\\" or empty: no backend)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    return () if names in ([], ["none"]) else tuple(names)


def matmul_precision(backend, tf32_backends=DEFAULT_TF32_BACKENDS):
    """The precision of `backend`'s f32 matmuls."""
    return "tf32" if backend in tf32_backends else "f32"
