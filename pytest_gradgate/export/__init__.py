"""Cases rewritten for other harnesses: ggml's own test-backend-ops (test_backend_ops.py)."""
