"""The SIMD steps explore draws row lengths at (library/kernel_steps.py), read from the tree's
CPU kernels when it is built and kept in the build's build-info.json."""

import json

from pytest_gradgate.library import kernel_steps


def test_the_default_trees_steps_cover_every_architecture(default_ggml, default_build):
    """ggml 0.15.3 defines steps of 16 (SSE, NEON), 32 (AVX) and 64 (AVX-512) and registers of 4,
    8 and 16 floats; the build keeps them, and explore's rows are one short of, at and one past
    each."""
    assert kernel_steps.steps_in(default_ggml) == (4, 8, 16, 32, 64)
    info = json.loads((default_build.library.parent / "build-info.json").read_text())
    assert info.get("simd_steps") == [4, 8, 16, 32, 64], (
        f"{default_build.library.parent} was built before build-info kept simd_steps: remove it to rebuild")
    assert kernel_steps.for_library(default_build.library) == (3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)


def test_a_tree_without_the_header_or_gone_gives_no_lengths(tmp_path):
    """A fork whose kernels define other steps gets those; a build cached before build-info kept
    the steps reads its tree, and a tree gone since gives none (explore then draws as before)."""
    header = tmp_path / "tree" / "src" / "ggml-cpu" / "simd-mappings.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define GGML_F32_STEP 128\n#  define GGML_F32_EPR  12\n#define GGML_F32_ARR (GGML_F32_STEP/GGML_F32_EPR)\n")
    assert kernel_steps.steps_in(tmp_path / "tree") == (12,)    # 128 is past MAX_STEP
    build = tmp_path / "build"
    build.mkdir()
    (build / "build-info.json").write_text(json.dumps({"ggml_root": str(tmp_path / "tree")}))
    assert kernel_steps.for_library(build / "libgradgate.so") == (11, 12, 13)
    (build / "build-info.json").write_text(json.dumps({"ggml_root": str(tmp_path / "gone")}))
    assert kernel_steps.for_library(build / "libgradgate.so") == ()
