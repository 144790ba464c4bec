"""The parsed C declarations kept between processes (library/declarations.py), for real: fresh
Python processes with their own cache folder, the session's built library, a real Runner."""

import json
import os
import subprocess
import sys
import time

from pytest_gradgate.library import binding
from pytest_gradgate.library.declarations import module_path
from pytest_gradgate.isolation.parent import Runner

# load the library in a new process; say whether the declarations were parsed here (cffi's
# parser imported) and what the library answers through the ffi it got
LOAD = """
import json, sys
from pytest_gradgate.library import binding
lib = binding.load(sys.argv[1])
print(json.dumps({"parsed_here": "pycparser" in sys.modules, "version": binding.ggml_version(lib),
                  "abi": lib.gg_abi_version()}))
"""


def load_in_new_process(library, cache):
    out = subprocess.run([sys.executable, "-c", LOAD, str(library)], capture_output=True, text=True,
                         env={**os.environ, "GRADGATE_CACHE_DIR": str(cache)}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def kept_module(cache):
    """Where a process whose cache folder is `cache` keeps the module."""
    return cache / "ffi" / module_path(binding.declarations()).name


def test_the_first_process_parses_and_keeps_them_later_ones_do_not_parse(default_build, tmp_path):
    first = load_in_new_process(default_build.library, tmp_path)
    assert first["parsed_here"] and first["abi"] == binding.EXPECTED_ABI
    assert kept_module(tmp_path).is_file()
    later = load_in_new_process(default_build.library, tmp_path)
    assert not later["parsed_here"]
    assert later["version"] == first["version"] and later["abi"] == binding.EXPECTED_ABI


def test_a_truncated_module_is_parsed_again_and_rewritten(default_build, tmp_path):
    load_in_new_process(default_build.library, tmp_path)
    module = kept_module(tmp_path)
    module.write_text(module.read_text()[:200])
    again = load_in_new_process(default_build.library, tmp_path)
    assert again["parsed_here"] and again["abi"] == binding.EXPECTED_ABI
    assert not load_in_new_process(default_build.library, tmp_path)["parsed_here"]     # whole again


def test_a_cache_that_cannot_be_written_costs_only_the_parse(default_build, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")      # a folder under a file cannot be made, even by root
    for _ in range(2):
        run = load_in_new_process(default_build.library, blocker / "cache")
        assert run["parsed_here"] and run["abi"] == binding.EXPECTED_ABI


def test_a_worker_that_writes_the_module_still_starts(default_build, tmp_path, monkeypatch):
    # the module is written inside the case worker, whose stdout is its pipe to the parent:
    # what cffi prints while writing must not reach it
    monkeypatch.setenv("GRADGATE_CACHE_DIR", str(tmp_path))
    runner = Runner(default_build.library)
    try:
        assert runner.ggml_version()    # None: the worker did not start
    finally:
        runner.close()
    assert kept_module(tmp_path).is_file()


def test_modules_no_process_used_for_a_month_go_when_a_new_one_is_written(default_build, tmp_path):
    folder = tmp_path / "ffi"
    folder.mkdir()
    days = 86400
    old, recent = folder / "gradgate_ffi_0ld.py", folder / "gradgate_ffi_recent.py"
    for path, age in ((old, 40 * days), (recent, 10 * days)):
        path.write_text("ffi = None\n")
        os.utime(path, (time.time() - age, time.time() - age))
    load_in_new_process(default_build.library, tmp_path)        # writes this version's module
    assert kept_module(tmp_path).is_file()
    assert not old.exists() and recent.exists()


def test_a_module_in_use_is_marked_as_used(default_build, tmp_path):
    load_in_new_process(default_build.library, tmp_path)
    module = kept_module(tmp_path)
    stale = time.time() - 40 * 86400
    os.utime(module, (stale, stale))
    assert not load_in_new_process(default_build.library, tmp_path)["parsed_here"]
    assert module.stat().st_mtime > time.time() - 3600    # so another version's write keeps it
