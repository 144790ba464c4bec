"""Row lengths at the CPU kernels' steps, read from the ggml tree a build was made from.

ggml's vector helpers (ggml-cpu's vec.h, the *_back kernels' helpers among them) run a row in
an unrolled SIMD loop of GGML_F32_STEP elements (GGML_F32_EPR per register), then a tail one
element at a time: a row shorter than the step runs the tail alone, and a bug in the unrolled
path shows only past it (the planted silu-back-unrolled). The steps differ by architecture
(SSE and NEON 16, AVX 32, AVX-512 64, ...), so every value the tree defines counts, whichever
this machine compiles: a row at a step, one short of it and one past it, for each.

Read from `src/ggml-cpu/simd-mappings.h` when the library is built and kept in its
build-info.json (`simd_steps`), since the tree a cached build was made from may be gone or be
another copy of the same content by the time explore runs. A build cached before then is read
from the tree its build-info names; a tree without the header gives no sizes, and explore draws
as before.
"""

import json
import re
from pathlib import Path

STEP_DEFINE = re.compile(r"^\s*#\s*define\s+GGML_F(?:32|16)_(?:STEP|EPR)\s+(\d+)\b", re.MULTILINE)
MAX_STEP = 64           # a longer row costs its finite differences more than a draw is worth


def steps_in(ggml_root):
    """The SIMD steps and register widths the tree's CPU kernels define -> sorted tuple."""
    header = Path(ggml_root) / "src" / "ggml-cpu" / "simd-mappings.h"
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return ()
    return tuple(sorted({int(n) for n in STEP_DEFINE.findall(text) if 1 < int(n) <= MAX_STEP}))


def row_lengths(steps):
    """ne0 values around each step: step - 1, step, step + 1 -> sorted tuple (shortest first,
    what a case shrinks towards)."""
    return tuple(sorted({n for step in steps for n in (step - 1, step, step + 1)}))


def for_library(library):
    """row_lengths of the steps of the tree a built library (build folder/libgradgate.so) was
    made from."""
    try:
        info = json.loads((Path(library).parent / "build-info.json").read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(info, dict):
        return ()
    steps = info.get("simd_steps")
    if steps is None:
        steps = steps_in(info["ggml_root"]) if isinstance(info.get("ggml_root"), str) else ()
    return row_lengths(int(n) for n in steps)
