"""A cached build whose library cannot be loaded: set aside and built again once, the run
goes on; a fresh build that cannot be loaded either stops the run with one message.

The damaged entry is a copy of the default build (same key: the gate finds it) whose
library is cut to 4 KiB, as a full disk during a copy or a killed sync leaves it: dlopen
dies of SIGBUS in whichever process loads it, so only workers may. Each test rebuilds the
default ggml once in its own cache (ccache holds its objects: configure and link, seconds).

How they were seen to fail with the bug put back:
- without GateState._rebuild_unloadable (the code before it): the run stopped with rc 2 and
  "the library cannot be loaded; the build looks broken (remove ... so that it is rebuilt)",
  failing both runs of test_a_cached_library_that_cannot_load_is_rebuilt_once;
- the crash cap's stop on a broken build removed: every case of the broken-again run fails
  alike, failing test_a_library_still_unloadable_after_its_rebuild_stops_the_run;
- set_aside moving whatever entry is there (not only the library found broken): the -n 2
  run failed 3 times out of 3 (the second process set aside the first one's fresh build).
"""

import shutil
import subprocess

import pytest

CASES_YAML = """\
cases:
  - name: sqr_ok
    params: {a: [4, 3]}
    graph: sqr(a)
    consumers: [none]
  - name: add_ok
    params: {a: [4, 3], b: [4, 3]}
    graph: add(a, b)
    consumers: [none]
  - name: abs_ok
    params: {a: [4, 3]}
    graph: abs(a)
    consumers: [none]
"""


@pytest.fixture
def damaged_cache(pytester, default_build, monkeypatch):
    """(cache folder, entry) holding the default build with its library cut short."""
    cache = pytester.path / "cache"
    entry = cache / "builds" / default_build.path.name
    shutil.copytree(default_build.path, entry)
    library = entry / default_build.library.name
    library.write_bytes(library.read_bytes()[:4096])
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(cache))
    return cache, entry


def gate(pytester, ggml_root, *extra):
    cases = pytester.makefile(".yaml", gradgate_three=CASES_YAML)
    return pytester.runpytest("--gradgate", "--gradgate-no-builtin", "-p", "no:cacheprovider",
                              "--gradgate-ggml-src", str(ggml_root), "--gradgate-cases", str(cases), *extra)


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist-n2"])
def test_a_cached_library_that_cannot_load_is_rebuilt_once_and_the_run_goes_on(pytester, default_ggml,
                                                                               damaged_cache, xdist):
    """Under -n 2 both pytest processes find the library broken; one sets the entry aside
    and builds, the other finds the entry replaced (set_aside compares the library it
    found with the one there) and loads the fresh build: one build, one entry set aside."""
    cache, entry = damaged_cache
    result = gate(pytester, default_ggml, *(["-n", "2"] if xdist else ["-p", "no:xdist"]))
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    result.assert_outcomes(passed=3)
    aside = sorted((cache / "builds" / "broken").iterdir())
    assert len(aside) == 1 and aside[0].name.startswith(entry.name + "-"), aside
    assert (aside[0] / "libgradgate.so").stat().st_size == 4096    # the damaged one, kept for a look
    if not xdist:   # an xdist worker has no terminal: its facts carry the news to the summary
        said = [line for line in result.stdout.lines if "cannot be loaded (" in line]
        # (SIGBUS here; how dlopen fails on a cut library is the platform's)
        assert len(said) == 1, said
        assert said[0].startswith(f"gradgate: the cached build {entry} cannot be loaded (the worker ")
        assert said[0].endswith(f"cannot load {entry}/libgradgate.so); moved it to {aside[0]}, building it again")
    result.stdout.fnmatch_lines(["gradgate: ggml 0.15.3 from *",
                                 "gradgate: Release build for cpu (rebuilt *, the cached one could not be loaded*): "
                                 f"{entry}/libgradgate.so"])


@pytest.mark.slow
def test_a_library_still_unloadable_after_its_rebuild_stops_the_run(pytester, default_ggml, damaged_cache,
                                                                    tmp_path, monkeypatch):
    """The fresh build is made unloadable for real: LDFLAGS link it against a library that
    exists when it links and is not on the loader's path when it loads (compile lines are
    unchanged, so ccache still holds every object). The gate rebuilds once, then the first
    case reports the broken build and the run stops there with the message it had before
    the rebuild existed, instead of failing every case alike."""
    cache, entry = damaged_cache
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "gone.c").write_text("int gradgate_test_gone(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(gone / "libgradgate_test_gone.so"), str(gone / "gone.c")],
                   check=True)
    monkeypatch.setenv("LDFLAGS", f"-L{gone} -Wl,--no-as-needed -lgradgate_test_gone")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    result = gate(pytester, default_ggml, "-p", "no:xdist")
    assert result.ret != 0
    result.assert_outcomes(failed=1)
    assert len(list((cache / "builds" / "broken").iterdir())) == 1       # rebuilt once, not again
    result.stdout.fnmatch_lines([f"gradgate: the cached build {entry} cannot be loaded (*); moved it to *, "
                                 "building it again",
                                 "gradgate: ggml ? (the library cannot be loaded) from *",
                                 "*Interrupted: gradgate: stopped early: the library cannot be loaded; "
                                 f"the build looks broken (remove {entry} so that it is rebuilt)*"
                                 "libgradgate_test_gone.so: cannot open shared object file*"])
