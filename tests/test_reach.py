"""The built-in suite reaches the planted bugs of issue 53's classes: each variant here was green
on the suite before the case that catches it was added (tests/ggml_variants.py has the patches;
the four in other ops than relu share one tree, `reach`, and each test selects its op's items).

- pool-max-negative: POOL_2D's max backward starts its search for the window's maximum at 0, so
  a window whose values are all negative loses its gradient. The suite's pool_2d_max draws mixed
  signs, where every window has a positive value: green. pool_2d_max_negative draws all negative.
- rms-norm-back-batches: RMS_NORM_BACK reads x's rows of batch (i2, i3) at (i2 + i3) * nb12, right
  whenever ne2 or ne3 is 1, which every rms_norm case had: green. rms_norm_batches is 4-D.
- rope-back-no-yarn: ROPE's backward reads ext_factor as 0 (no YaRN correction), right at the
  defaults every rope case used: green. rope_yarn and rope_multi_yarn set the YaRN parameters.
- relu-unmasked: RELU's backward without its mask. The relu case alone (sqr loss) sends a zero
  gradient where a < 0, so the missing mask changes nothing: green. relu_mask adds b after relu.
- silu-back-unrolled: SILU's backward helper unrolled by 8 with a wrong unrolled path and a right
  tail; every silu case had ne0 = 4, where only the tail runs: green. silu_wide has rows of 67.
"""

import os
import subprocess
import sys

import pytest

from ggml_variants import REACH


def gate(cwd, *args, ggml_src=None):
    cmd = [sys.executable, "-m", "pytest", "--gradgate", "-p", "no:cacheprovider", "-q", *args]
    if ggml_src:
        cmd.append(f"--gradgate-ggml-src={ggml_src}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADGATE_")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_pool_max_losing_negative_windows_is_caught(tmp_path, ggml_variant, default_build):
    """Seen green before pool_2d_max_negative was added: `-k pool_2d_max` on the variant passed
    (7 passed, 17 xfailed over every pool_2d item)."""
    root = ggml_variant(REACH)[0]
    caught = gate(tmp_path, "-k", "pool_2d_max", ggml_src=root)
    assert caught.returncode == 1, caught.stdout[-3000:]
    assert "pool_2d_max_negative[none-sqr-cpu]" in caught.stdout
    assert "the backward drops this gradient" in caught.stdout


@pytest.mark.slow
def test_a_batch_index_flattened_wrong_is_caught(tmp_path, ggml_variant, default_build):
    """Seen green before rms_norm_batches was added: `-k rms_norm` on the variant passed
    (7 passed, 4 xfailed)."""
    root = ggml_variant(REACH)[0]
    caught = gate(tmp_path, "-k", "rms_norm", ggml_src=root)
    assert caught.returncode == 1, caught.stdout[-3000:]
    failed = [line for line in caught.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1 and "rms_norm_batches[none-wsqr-cpu]" in failed[0], failed


@pytest.mark.slow
def test_a_backward_that_ignores_an_op_parameter_is_caught(tmp_path, ggml_variant, default_build):
    """Seen green before rope_yarn was added: `-k rope` on the variant gave 12 passed, 29 xfailed."""
    root = ggml_variant(REACH)[0]
    caught = gate(tmp_path, "-k", "rope", ggml_src=root)
    assert caught.returncode == 1, caught.stdout[-3000:]
    failed = sorted(line.split()[1] for line in caught.stdout.splitlines() if line.startswith("FAILED "))
    assert failed == ["pytest_gradgate/cases.yaml::rope_multi_yarn[none-sqr-cpu]"] + [
        f"pytest_gradgate/cases.yaml::rope_yarn,mode={m}[none-sqr-cpu]" for m in (0, 2)], failed


@pytest.mark.slow
def test_a_backward_without_its_mask_is_caught(tmp_path, ggml_variant, default_build):
    """Seen green before relu_mask was added: `-k relu` on the variant gave 7 passed."""
    root = ggml_variant("relu-unmasked")[0]
    caught = gate(tmp_path, "-k", "relu", ggml_src=root)
    assert caught.returncode == 1, caught.stdout[-3000:]
    failed = [line.split()[1] for line in caught.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed and all("::relu_mask[" in f for f in failed), failed
    assert "gradient where the numeric one is zero" in caught.stdout


@pytest.mark.slow
def test_a_wrong_unrolled_path_is_caught(tmp_path, ggml_variant, default_build):
    """Seen green before silu_wide was added: `-k silu` on the variant gave 3 passed, 4 xfailed."""
    root = ggml_variant(REACH)[0]
    caught = gate(tmp_path, "-k", "silu", ggml_src=root)
    assert caught.returncode == 1, caught.stdout[-3000:]
    failed = [line.split()[1] for line in caught.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed == ["pytest_gradgate/cases.yaml::silu_wide[none-sqr-cpu]"], failed


NEW_CASES = ("pool_2d_max_negative", "rms_norm_batches", "rope_yarn", "rope_multi_yarn", "relu_mask", "silu_wide")


def test_the_new_cases_pass_on_the_clean_default(tmp_path, default_build):
    clean = gate(tmp_path, "-k", " or ".join(NEW_CASES))
    assert clean.returncode == 0, clean.stdout[-3000:]
    assert "10 passed" in clean.stdout, clean.stdout[-3000:]


def test_explore_draws_rows_past_the_simd_steps_and_finds_the_unrolled_bug(ggml_variant, default_build):
    """silu-back-unrolled is wrong only in the unrolled path, which rows shorter than 8 never run:
    explore's sizes of 1 to 5 could not meet it. With one draw in four at a SIMD step of the
    tree (library/kernel_steps.py) it finds SILU wrong on contiguous tensors within 10 s of silu
    alone, its case shrunk to a row of at least 8. Seen failing with kernel_steps.for_library
    returning no lengths."""
    from pytest_gradgate.explore import search
    found, _ = search.explore(ggml_variant(REACH)[1].library, 10.0, seed=0, ops=["silu"])
    hits = [f for f in found if f.key == ("silu", "misread", "contiguous")]
    assert hits, [f.key for f in found]
    assert hits[0].mapping["params"]["a"][0] >= 8 and hits[0].result["status"] == "failed"
