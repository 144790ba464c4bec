"""The GitHub workflows cannot run here, so their YAML is checked for the keys that matter:
the project's CI runs the one entry script with caches; the reusable gate is callable,
installs the gate at the commit the caller pinned, has its jobs, a timeout on every job and
step, and one aggregate job for branch protection that runs even when a job it needs failed;
the release builds, checks, smoke-tests and publishes with trusted publishing. Shell steps
that decide something are run here for real."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pytest_gradgate

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def load(name):
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True
    data["on"] = data.pop(True, data.get("on"))
    return data


def all_steps(workflow):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


@pytest.mark.parametrize("name", ["ci.yml", "gradgate.yml", "release.yml"])
def test_every_job_and_step_has_a_timeout(name):
    workflow = load(name)
    for job_name, job in workflow["jobs"].items():
        assert "timeout-minutes" in job, f"{name}: job {job_name} has no timeout-minutes"
    for job_name, step in all_steps(workflow):
        assert "timeout-minutes" in step, f"{name}: a step of job {job_name} has no timeout-minutes: {step}"


def test_ci_lints_with_ruff_and_runs_the_entry_script_with_caches():
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    lint = " ".join(s.get("run", "") for s in ci["jobs"]["lint"]["steps"])
    assert "pip install" in lint and "ruff check" in lint
    tests = ci["jobs"]["tests"]
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in tests["steps"])
    assert (WORKFLOWS.parent.parent / ".ci" / "run").is_file()
    uses = [s for s in tests["steps"] if "uses" in s]
    assert any(s["uses"].startswith("actions/setup-python") and s["with"].get("cache") == "pip" for s in uses)
    caches = [s["with"]["path"] for s in uses if s["uses"].startswith("actions/cache")]
    assert ".ccache" in caches and tests["env"]["CCACHE_DIR"].endswith(".ccache")
    assert "ccache" in " ".join(s.get("run", "") for s in tests["steps"])


def test_gradgate_is_a_reusable_workflow_with_its_inputs():
    gate = load("gradgate.yml")
    assert set(gate["on"]) == {"workflow_call"}
    inputs = gate["on"]["workflow_call"]["inputs"]
    assert {"ggml-path", "cases", "baseline", "backend", "gpu", "cuda-arch"} <= set(inputs)
    assert inputs["gpu"]["type"] == "boolean" and inputs["gpu"]["default"] is False
    for name, spec in inputs.items():
        assert spec["type"] in ("string", "boolean", "number"), name


def test_gradgate_jobs_cpu_cuda_build_gpu_and_the_aggregate_gate():
    jobs = load("gradgate.yml")["jobs"]
    assert set(jobs) == {"cpu", "cuda-build", "gpu", "mutate", "gate"}

    cpu_run = " ".join(s.get("run", "") for s in jobs["cpu"]["steps"])
    assert "pytest" in cpu_run and "--gradgate " in cpu_run and "--gradgate-json" in cpu_run
    assert "--gradgate-html" in cpu_run
    uploads = [s for s in jobs["cpu"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()" and "gradgate-cpu.json" in uploads[0]["with"]["path"]

    cuda = jobs["cuda-build"]
    assert cuda["container"]["image"] == "${{ inputs.cuda-image }}"
    assert "nvidia/cuda:" in load("gradgate.yml")["on"]["workflow_call"]["inputs"]["cuda-image"]["default"]
    cuda_run = " ".join(s.get("run", "") for s in cuda["steps"])
    assert "gradgate build" in cuda_run and "--backend cuda" in cuda_run and "--cuda-arch" in cuda_run

    gpu = jobs["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"] and gpu["if"] == "inputs.gpu"
    assert "--gradgate-backend cuda" in " ".join(s.get("run", "") for s in gpu["steps"])

    mutate = jobs["mutate"]
    assert mutate["if"] == "inputs.mutate-since != ''"
    assert load("gradgate.yml")["on"]["workflow_call"]["inputs"]["mutate-since"]["default"] == ""
    mutate_run = " ".join(s.get("run", "") for s in mutate["steps"])
    assert "gradgate mutate" in mutate_run and '--since "$MUTATE_SINCE"' in mutate_run and "[mutate]" in mutate_run
    assert mutate["steps"][0]["with"]["fetch-depth"] == 0     # --since needs the history

    gate = jobs["gate"]
    assert gate["if"] == "always()" and set(gate["needs"]) == {"cpu", "cuda-build", "gpu", "mutate"}
    assert "exit 1" in " ".join(s.get("run", "") for s in gate["steps"])


def test_readme_documents_the_one_line_uses():
    readme = (WORKFLOWS.parent.parent / "docs" / "ci.md").read_text()   # the README links to it
    uses = re.search(r"uses: ([\w.-]+/[\w.-]+)/\.github/workflows/gradgate\.yml@v([\w.]+)", readme)
    assert uses, "docs/ci.md shows no `uses:` line of the reusable workflow"
    assert uses.group(2) == pytest_gradgate.__version__   # the tag a user pins is the release's


def test_gradgate_installs_the_gate_from_its_own_commit_unless_a_package_is_given():
    """Before: every job ran `pip install "$PACKAGE"` with PACKAGE defaulting to pytest-gradgate,
    which is not on PyPI, so the README's `uses:` line could not work."""
    gate = load("gradgate.yml")
    assert gate["on"]["workflow_call"]["inputs"]["package"]["default"] == ""
    for name in ("cpu", "cuda-build", "gpu"):
        steps = gate["jobs"][name]["steps"]
        own = [s for s in steps if s.get("with", {}).get("repository") == "${{ job.workflow_repository }}"]
        assert own and own[0]["uses"].startswith("actions/checkout") and own[0]["if"] == "inputs.package == ''", name
        assert own[0]["with"]["ref"] == "${{ job.workflow_sha }}", name
        path = own[0]["with"]["path"]
        install = next(s for s in steps if s.get("name") == "install pytest-gradgate")
        assert steps.index(own[0]) < steps.index(install)
        assert f'"${{PACKAGE:-./{path}}}"' in install["run"], name


@pytest.mark.parametrize("package, expected", [("", "./.gradgate-src"), ("pytest-gradgate==0.1.0", "pytest-gradgate==0.1.0")])
def test_the_install_line_takes_the_checkout_or_the_package(package, expected):
    step = next(s for s in load("gradgate.yml")["jobs"]["cpu"]["steps"] if s.get("name") == "install pytest-gradgate")
    # the same line, with pip replaced by echo: what would be installed
    line = step["run"].replace("python -m pip install", "echo")
    out = subprocess.run(["bash", "-c", line], env={"PATH": "/usr/bin:/bin", "PACKAGE": package},
                         capture_output=True, text=True).stdout
    assert out.split()[1] == expected


def test_release_builds_checks_smoke_tests_and_publishes_with_trusted_publishing():
    release = load("release.yml")
    assert release["on"]["push"]["tags"] == ["v*"]
    build, publish = release["jobs"]["build"], release["jobs"]["publish"]
    run = " ".join(s.get("run", "") for s in build["steps"])
    assert "python -m build" in run and "twine check" in run
    assert "pip install" in run and "dist/*.whl" in run and "pytest --gradgate" in run and "gradgate --version" in run
    smoke = next(s for s in build["steps"] if "dist/*.whl" in s.get("run", ""))
    assert smoke["working-directory"] == "${{ runner.temp }}"   # outside the checkout
    assert publish["needs"] == "build" and publish["permissions"] == {"id-token": "write"}
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish") for s in publish["steps"])
    assert all("password" not in s.get("with", {}) for s in publish["steps"])   # no token: trusted publishing


@pytest.mark.parametrize("tag, code", [(f"v{pytest_gradgate.__version__}", 0), ("v99.0.0", 1)])
def test_the_release_refuses_a_tag_that_is_not_the_version(tag, code):
    step = next(s for s in load("release.yml")["jobs"]["build"]["steps"] if "GITHUB_REF_NAME" in s.get("run", ""))
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=WORKFLOWS.parent.parent, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin:" + str(Path(__import__("sys").executable).parent),
                                          "GITHUB_REF_NAME": tag})
    assert proc.returncode == code, proc.stdout + proc.stderr


@pytest.mark.parametrize("results, code", [
    ({"cpu": "success", "cuda-build": "success", "gpu": "skipped"}, 0),
    ({"cpu": "failure", "cuda-build": "success", "gpu": "skipped"}, 1),
    ({"cpu": "success", "cuda-build": "cancelled", "gpu": "skipped"}, 1),
])
def test_the_aggregate_gate_script_fails_when_a_needed_job_failed(results, code, tmp_path):
    """Runs the gate job's own shell step with the `needs` JSON GitHub would give it."""
    step = load("gradgate.yml")["jobs"]["gate"]["steps"][0]
    env = {"PATH": "/usr/bin:/bin", "RESULTS": json.dumps({k: {"result": v, "outputs": {}} for k, v in results.items()})}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        assert "::error title=gradgate::failed or cancelled:" in proc.stdout


def test_ci_runs_the_gate_on_windows_and_macos():
    """Fork-per-case does not exist on Windows and is discouraged on macOS: the project's
    CI runs the gate there too (it cannot run here; these keys are what it needs)."""
    job = load("ci.yml")["jobs"]["platforms"]
    assert {"windows-latest", "macos-latest"} <= set(job["strategy"]["matrix"]["os"])
    assert job["runs-on"] == "${{ matrix.os }}" and job["strategy"]["fail-fast"] is False
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "pytest --gradgate" in runs and "pip install" in runs


FORK_CASES = """\
cases:
  - name: my_silu
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [none, transpose]
"""
# a second case that fails on the default ggml (SILU_BACK reads a permuted x as contiguous)
NEW_FAILURE = """\
  - name: my_silu_permuted
    params: {a: [4, 3, 2]}
    graph: silu(a)
    consumers: [none]
    producers: [permute_0213]
"""


def _gate_step_script(job="cpu", inputs=None):
    """The shell script of a job's `pytest --gradgate` step, its ${{ inputs.* }} filled in
    as GitHub would (the caller's values over the defaults)."""
    gate = load("gradgate.yml")
    values = {k: v.get("default") for k, v in gate["on"]["workflow_call"]["inputs"].items()} | (inputs or {})
    step = next(s for s in gate["jobs"][job]["steps"] if s.get("name", "").startswith("pytest --gradgate"))
    script = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: str(values[m.group(1)]), step["run"])
    assert "${{" not in script, script
    return script, step["working-directory"], gate["env"]


@pytest.mark.slow
def test_the_cpu_jobs_own_command_line_on_a_fork_with_a_baseline(tmp_path, ggml_variant):
    """The reusable workflow runs pytest from the runner's temporary folder. A fork's baseline,
    recorded in its checkout as docs/ci.md says, must match there: the run is green with the
    recorded failure (xfail) and red on a new one, whose id pasted back in the checkout selects
    its item. Before: a case file outside the rootdir got ids without their file part
    (`::my_silu[transpose-sqr-cpu]`); seen failing so, with `FAILED ::my_silu[transpose-sqr-cpu]`
    for the recorded failure."""
    workspace, runner_temp = tmp_path / "fork", tmp_path / "runner-temp"
    (workspace / "tests").mkdir(parents=True)
    (workspace / ".git").mkdir()     # what actions/checkout leaves
    # a fork of 0.15.3 (a byte-identical copy of the pinned tree would be that pinned source), built
    # once by content, in llama.cpp's layout
    (workspace / "ggml").symlink_to(ggml_variant("concat-fixed")[0])
    runner_temp.mkdir()
    cases = workspace / "tests" / "gradgate_cases.yaml"
    cases.write_text(FORK_CASES)
    python_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": python_dir + os.pathsep + os.environ["PATH"],
           # the fork's own cases only, and one xdist worker for `-n auto` on a small machine
           "PYTEST_ADDOPTS": "--gradgate-no-builtin", "PYTEST_XDIST_AUTO_NUM_WORKERS": "1"}
    # recorded in the fork's checkout (docs/ci.md)
    record = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "-p", "no:cacheprovider",
                             "--gradgate-ggml-src", "ggml", "--gradgate-cases", "tests/gradgate_cases.yaml",
                             "--gradgate-baseline", "gradgate-baseline.json", "--gradgate-update-baseline"],
                            cwd=workspace, env=env, capture_output=True, text=True, timeout=600)
    assert record.returncode == 0, record.stdout + record.stderr
    recorded = json.loads((workspace / "gradgate-baseline.json").read_text())
    assert set(recorded["entries"]) == {"tests/gradgate_cases.yaml::my_silu[transpose-sqr-cpu]"}
    # a fork of 0.15.3: its own case's failure is the fork's own, known only once accepted (docs/fork.md)
    for entry in recorded["entries"].values():
        assert entry["own"] == "ggml-0.15.3"
        entry["accepted"] = "SILU's backward misreads a transposed gradient; fixed upstream later"
    (workspace / "gradgate-baseline.json").write_text(json.dumps(recorded))

    script, workdir, workflow_env = _gate_step_script()
    assert workdir == "${{ runner.temp }}"
    job_env = {**env, "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(runner_temp), "GGML_PATH": "ggml",
               "CASES": "tests/gradgate_cases.yaml", "BASELINE": "gradgate-baseline.json", "PACKAGE": ""}
    assert set(workflow_env) <= set(job_env)

    def run_job():
        return subprocess.run(["bash", "-e", "-c", script], cwd=runner_temp, env=job_env, capture_output=True,
                              text=True, timeout=600)
    green = run_job()
    assert green.returncode == 0, green.stdout + green.stderr
    assert "XFAIL tests/gradgate_cases.yaml::my_silu[transpose-sqr-cpu]" in green.stdout, green.stdout

    cases.write_text(FORK_CASES + NEW_FAILURE)
    red = run_job()
    assert red.returncode == 1, red.stdout + red.stderr
    new_id = "tests/gradgate_cases.yaml::my_silu_permuted[from_permute_0213-none-sqr-cpu]"
    assert f"FAILED {new_id}" in red.stdout, red.stdout
    assert "XFAIL tests/gradgate_cases.yaml::my_silu[transpose-sqr-cpu]" in red.stdout
    assert "FAILED ::" not in red.stdout
    report = json.loads((runner_temp / "gradgate-cpu.json").read_text())
    assert new_id in json.dumps(report)

    # the failed id, pasted back in the checkout, selects that item alone
    again = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "-p", "no:cacheprovider", "-rA",
                            "--gradgate-ggml-src", "ggml", new_id], cwd=workspace, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 1 and f"FAILED {new_id}" in again.stdout and "1 failed in" in again.stdout, again.stdout


def _floor(requirement_name):
    pyproject = (WORKFLOWS.parent.parent / "pyproject.toml").read_text()
    return re.search(rf'"{requirement_name}>=([\d.]+)"', pyproject).group(1)


def test_ci_runs_the_suite_on_the_oldest_and_the_newest_pytest():
    """pytest 9.2 broke --lf/--ff/--sw (a structured node id) while every test passed on 9.0.3:
    the suite runs on the oldest pytest and pluggy pyproject allows, and on the newest."""
    tests = load("ci.yml")["jobs"]["tests"]
    cells = {c["pytest"]: c["requirement"].split() for c in tests["strategy"]["matrix"]["include"]}
    assert tests["strategy"]["fail-fast"] is False
    assert sorted(cells["oldest"]) == sorted([f"pytest=={_floor('pytest')}.0", f"pluggy=={_floor('pluggy')}.0"])
    assert sorted(cells["newest"]) == ["pluggy", "pytest"]     # unpinned, upgraded: the newest
    assert tests["env"]["PYTEST_REQUIREMENT"] == "${{ matrix.requirement }}"
    # .ci/run's own lines install it after the package, with --upgrade (pip replaced by echo)
    script = (WORKFLOWS.parent.parent / ".ci" / "run").read_text()
    block = script[script.index('if [ -n "${PYTEST_REQUIREMENT'):]
    block = block[:block.index("\nfi\n") + 4].replace("python3 -m pip install", "echo")
    for cell, requirement in cells.items():
        out = subprocess.run(["bash", "-e", "-c", block], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "PYTEST_REQUIREMENT": " ".join(requirement)}).stdout
        assert out.split() == ["-q", "--disable-pip-version-check", "--upgrade", *requirement], (cell, out)


# -- the job conditions, evaluated as GitHub does ---------------------------------------------
_TOKEN = re.compile(r"\s*(?:(inputs\.[\w-]+)|'((?:[^']|'')*)'|(true|false)\b|(==|!=|&&|\|\||!|\(|\)))")


def github_condition(expression, inputs):
    """Evaluate a job's `if:` the way GitHub's expression syntax does, for the subset the
    reusable workflow uses: inputs.*, string and boolean literals, == != && || ! and parentheses.
    `==` between strings ignores case; between a string and a boolean both become numbers
    ('true' is NaN, so it equals nothing); `a || b` is a if a is truthy, else b; '' is falsy and
    'false' (a non-empty string) is truthy, which is why string inputs must be compared."""
    tokens, pos = [], 0
    while pos < len(expression.rstrip()):
        m = _TOKEN.match(expression, pos)
        assert m, f"cannot read {expression[pos:]!r}"
        name, string, boolean, op = m.groups()
        tokens.append(("value", inputs[name[len("inputs."):]]) if name else ("value", string.replace("''", "'"))
                      if string is not None else ("value", boolean == "true") if boolean else ("op", op))
        pos = m.end()

    def number(v):
        if isinstance(v, bool):
            return float(v)
        try:
            return float(v) if str(v).strip() else 0.0
        except ValueError:
            return float("nan")

    def equal(a, b):
        if isinstance(a, str) and isinstance(b, str):
            return a.casefold() == b.casefold()
        if isinstance(a, bool) and isinstance(b, bool):
            return a == b
        return number(a) == number(b)

    def parse(i, level):
        # level 0: ||, 1: &&, 2: == !=, 3: ! and atoms
        if level == 3:
            kind, v = tokens[i]
            if (kind, v) == ("op", "!"):
                value, i = parse(i + 1, 3)
                return not value, i
            if (kind, v) == ("op", "("):
                value, i = parse(i + 1, 0)
                assert tokens[i] == ("op", ")")
                return value, i + 1
            assert kind == "value", tokens[i]
            return v, i + 1
        value, i = parse(i, level + 1)
        ops = {0: ("||",), 1: ("&&",), 2: ("==", "!=")}[level]
        while i < len(tokens) and tokens[i][0] == "op" and tokens[i][1] in ops:
            op = tokens[i][1]
            right, i = parse(i + 1, level + 1)
            value = (value or right if op == "||" else value and right if op == "&&"
                     else equal(value, right) if op == "==" else not equal(value, right))
        return value, i

    value, end = parse(0, 0)
    assert end == len(tokens), expression
    return bool(value)


def _caller_inputs(given):
    """The inputs context a caller's `with:` gives the called workflow: the defaults, overridden
    by the caller's values converted to the declared type (a YAML boolean given to a string
    input arrives as 'true' or 'false')."""
    declared = load("gradgate.yml")["on"]["workflow_call"]["inputs"]
    values = {k: v.get("default", {"boolean": False, "number": 0}.get(v["type"], "")) for k, v in declared.items()}
    for name, value in given.items():
        if declared[name]["type"] == "string" and isinstance(value, bool):
            value = "true" if value else "false"
        values[name] = value
    return values


def test_the_expression_evaluator_reads_github_semantics():
    """The evaluator itself: a non-empty string is truthy, even 'false'; strings compare without case."""
    assert github_condition("inputs.x", {"x": "false"}) is True
    assert github_condition("inputs.x", {"x": ""}) is False
    assert github_condition("inputs.x == 'TRUE'", {"x": "true"}) is True
    assert github_condition("inputs.x == 'true'", {"x": True}) is False     # 'true' as a number is NaN
    assert github_condition("!inputs.g && (inputs.x == '' || inputs.x != 'a')", {"g": False, "x": "b"}) is True


@pytest.mark.parametrize("given, builds_cuda", [
    ({}, False),                                      # a CPU-only fork: no CUDA compile unless asked
    ({"gpu": False}, False),
    ({"gpu": True}, True),                            # a GPU run: its CUDA build is compiled first
    ({"gpu": False, "cuda-build": True}, True),       # asked for, without a GPU runner
    ({"gpu": True, "cuda-build": False}, False),      # switched off, though the GPU job runs
    ({"cuda-build": "true"}, True),
])
def test_cuda_build_follows_gpu_unless_given(given, builds_cuda):
    """Before: `cuda-build` was a boolean defaulting to true, so `gpu: false` (the default)
    still compiled CUDA in a container on every pull request: the first two rows failed."""
    job = load("gradgate.yml")["jobs"]["cuda-build"]
    assert github_condition(job["if"], _caller_inputs(given)) is builds_cuda


@pytest.mark.parametrize("value, code", [("", 0), ("true", 0), ("false", 0), ("yes", 1), ("gpu", 1)])
def test_a_cuda_build_value_other_than_true_false_or_empty_fails_the_run(value, code):
    """A string input takes anything; a typo must not quietly mean "same as gpu"."""
    step = next(s for s in load("gradgate.yml")["jobs"]["cpu"]["steps"] if s.get("name") == "check the inputs")
    env = {"PATH": "/usr/bin:/bin", **{k: re.sub(r"\$\{\{\s*inputs\.cuda-build\s*\}\}", value, v)
                                         for k, v in step["env"].items()}}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        assert f"::error title=gradgate::input cuda-build is '{value}'" in proc.stdout
