"""pytest-gradgate as a user gets it: the sdist and the wheel built from this tree, the wheel
installed into a fresh venv (with nothing but its own dependencies), and used from folders
that have nothing to do with this checkout.

Before the package data moved into the package, the wheel had no native/ sources: loading
the plugin failed, and every pytest run in such an environment exited 3.
"""

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import pytest_gradgate
from pytest_gradgate.library.cache import cache_root

REPO = Path(__file__).resolve().parents[1]
# what the plugin reads at run time, relative to the package
RUNTIME_FILES = ["cases.yaml", "cases_fast.yaml", "cases_equivalence.yaml", "library/native/CMakeLists.txt", "library/native/gradgate.h",
                 "library/native/gradgate_shim.c", "library/cdefs/ggml_types.h", "library/cdefs/ggml_ops.h",
                 "declare/cases.schema.json", "report/report.schema.json", "gate/baseline_default.json",
                 "gate/baseline_ggml-0.26.0.json"]
# test and benchmark tooling: C that segfaults and spins on purpose stays out of the wheel
NOT_SHIPPED = ["ggml_variants", "reference", "bench_reference", "variants"]


def run(cmd, **kwargs):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel, built from a copy of the tracked files (as a fresh clone has them)."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, stdout=subprocess.PIPE, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    # PyPA's build: the sdist first, then the wheel from the unpacked sdist, each in an
    # isolated env with the build requirements of pyproject.toml
    code, text = run([sys.executable, "-m", "build", "--outdir", str(out), str(src)])
    assert code == 0, text
    wheel, = out.glob("*.whl")
    sdist, = out.glob("*.tar.gz")
    return wheel, sdist


def test_the_wheel_ships_what_the_plugin_reads_and_no_test_tooling(dist):
    wheel, _ = dist
    names = zipfile.ZipFile(wheel).namelist()
    for rel in RUNTIME_FILES:
        assert f"pytest_gradgate/{rel}" in names, rel
    assert not [n for n in names if Path(n).stem in NOT_SHIPPED], names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    assert wheel.name.startswith(f"pytest_gradgate-{pytest_gradgate.__version__}-")


def test_the_sdist_can_build_and_test(dist):
    _, sdist = dist
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert {"pyproject.toml", "LICENSE", "README.md", "tests/conftest.py", "tests/ggml_variants.py",
            "bench/reference.py", ".ci/run", "mkdocs.yml", "docs/index.md", "docs/images/html-report.png"} <= names
    assert {f"pytest_gradgate/{rel}" for rel in RUNTIME_FILES} <= names


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh venv with the wheel and its dependencies, nothing else."""
    wheel, _ = dist
    where = tmp_path_factory.mktemp("venv") / "venv"
    code, text = run([sys.executable, "-m", "venv", str(where)])
    assert code == 0, text
    code, text = run([str(where / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", str(wheel)])
    assert code == 0, text
    return where


def clean_env(**extra):
    """The environment of a user's shell: none of this checkout's paths, the user cache kept
    (so the build of the default ggml is a cache hit, as on a second run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "GRADGATE_", "PYTHON", "VIRTUAL_ENV"))}
    env["GRADGATE_CACHE_DIR"] = str(cache_root())
    env.update(extra)
    return env


def test_plain_pytest_in_the_venv_is_unaffected_and_loads_nothing_heavy(venv, tmp_path):
    """Without --gradgate the plugin stays out of the way: the run passes and neither numpy,
    cffi, yaml nor the engine is imported."""
    (tmp_path / "test_unrelated.py").write_text(
        "import sys\n\n"
        "def test_unrelated():\n"
        "    heavy = {'numpy', 'cffi', 'yaml', 'pytest_gradgate.check.engine', 'pytest_gradgate.declare.loader'}\n"
        "    assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "    assert 'pytest_gradgate.plugin' in sys.modules\n")
    code, text = run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                     cwd=tmp_path, env=clean_env())
    assert code == 0, text
    assert "1 passed" in text


def test_pytest_gradgate_from_an_empty_folder(venv, tmp_path, default_build):
    code, text = run([str(venv / "bin" / "python"), "-m", "pytest", "--gradgate", "-k", "dup and none and not get_rows",
                      "-p", "no:cacheprovider"], cwd=tmp_path, env=clean_env())
    assert code == 0, text
    assert "gradgate: ggml 0.15.3 from default" in text and " passed" in text
    code, text = run([str(venv / "bin" / "gradgate"), "--version"], cwd=tmp_path, env=clean_env())
    assert code == 0 and text.strip() == f"gradgate (pytest-gradgate) {pytest_gradgate.__version__}", text


def test_the_html_report_needs_no_extra(dist, venv, tmp_path):
    """--gradgate-html draws its own pictures: the [report] extra is still there (existing install
    commands keep working) and brings nothing, and in the venv with the wheel alone (no
    matplotlib) a failed case's report has its heatmaps."""
    wheel, _ = dist
    metadata = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    lines = zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
    assert "Provides-Extra: report" in lines
    assert not [line for line in lines if line.startswith("Requires-Dist:") and 'extra == "report"' in line]
    code, text = run([str(venv / "bin" / "python"), "-c",
                      "import importlib.util, sys\n"
                      "assert importlib.util.find_spec('matplotlib') is None, 'matplotlib is installed'\n"
                      "from pytest_gradgate.report import html\n"
                      "param = {'name': 'a', 'shape': [3, 2], 'passed': False, 'maa': 1.0,\n"
                      "         'analytic_values': [1, 2, 3, 4, 5, 6], 'numeric_values': [1, 2, 3, 4, 6, 5]}\n"
                      "page = html.render([{'case_id': 'c', 'status': 'failed', 'params': [param]}])\n"
                      "print(page.count('<img alt=\"a[:, :, 0, 0]\" src=\"data:image/png;base64,iVBORw0KGgo'))\n"
                      "print('matplotlib' in sys.modules)\n"],
                     cwd=tmp_path, env=clean_env())
    assert code == 0, text
    assert text.split() == ["1", "False"], text


def test_pytest_loads_the_installed_plugin_without_rewriting_it(venv, tmp_path):
    """pytest rewrites the asserts of an installed plugin's modules, recompiling each in every
    process where bytecode is not written (the package takes itself off that list, see
    pytest_gradgate/__init__.py). Only the package's own __init__, imported by the entry
    point before it can say so, goes through the rewriter; and pytest says nothing of it."""
    (tmp_path / "conftest.py").write_text(
        "import json, sys\n\n"
        "def pytest_unconfigure(config):\n"
        "    rewritten = sorted(n for n, m in sys.modules.items() if n.startswith('pytest_gradgate') and\n"
        "                       type(getattr(m, '__loader__', None)).__name__ == 'AssertionRewritingHook')\n"
        "    loaded = sorted(n for n in sys.modules if n.startswith('pytest_gradgate'))\n"
        "    open('modules.json', 'w').write(json.dumps({'rewritten': rewritten, 'loaded': loaded}))\n")
    code, text = run([str(venv / "bin" / "python"), "-m", "pytest", "--gradgate", "--collect-only", "-q",
                      "-p", "no:cacheprovider", "-W", "error::pytest.PytestAssertRewriteWarning"],
                     cwd=tmp_path, env=clean_env(PYTHONDONTWRITEBYTECODE="1"))
    assert code == 0, text
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert "pytest_gradgate.declare.collection_memo" in modules["loaded"], modules   # the collection ran
    assert modules["rewritten"] == ["pytest_gradgate"], modules
    assert "PytestAssertRewriteWarning" not in text, text


def test_hypothesis_is_the_explore_extra_and_explore_without_it_says_so(dist, venv, tmp_path):
    """Hypothesis comes with the explore extra only: installed, its pytest plugin imports all of
    Hypothesis at the end of every pytest run, explore or not. Without it, both of explore's
    front ends stop at once with a usage error that names the extra (nothing built or run)."""
    wheel, _ = dist
    metadata = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:") and "hypothesis" in line]
    assert requires and all('extra == "explore"' in line or 'extra == "test"' in line for line in requires), requires
    python = str(venv / "bin" / "python")
    code, text = run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('hypothesis') is not None)"],
                     env=clean_env())
    assert code == 0, "the wheel's own dependencies brought Hypothesis into the venv"
    code, text = run([str(venv / "bin" / "gradgate"), "explore", "--budget", "1s"], cwd=tmp_path, env=clean_env())
    assert code == 2, text
    assert "gradgate explore needs Hypothesis" in text and "pip install 'pytest-gradgate[explore]'" in text, text
    code, text = run([python, "-m", "pytest", "--gradgate-explore=1s", "-p", "no:cacheprovider"], cwd=tmp_path,
                     env=clean_env())
    assert code == 4, text
    assert "--gradgate-explore needs Hypothesis" in text and "pytest-gradgate[explore]" in text, text
    assert not list(tmp_path.iterdir()), "explore wrote something before it refused"


def test_one_version_source():
    """pyproject.toml takes the version from pytest_gradgate.__version__; the CLI prints it."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'attr = "pytest_gradgate.__version__"' in text
    code, out = run([sys.executable, "-m", "pytest_gradgate.cli", "--version"])
    assert code == 0 and out.strip() == f"gradgate (pytest-gradgate) {pytest_gradgate.__version__}"


def test_every_subcommand_exits_2_on_a_usage_error():
    for args in (["build", "--no-such-option"], ["verify"], ["ops", "--nope"], ["no-such-command"], []):
        code, out = run([sys.executable, "-m", "pytest_gradgate.cli", *args])
        assert code == 2, (args, out)
