"""pytest-gradgate: check ggml's backward pass through non-contiguous consumers."""

__version__ = "0.1.0"
