"""Benchmark against ggml's test-backend-ops, on the same ggml tree and the same cases.

    python bench/bench_reference.py [--ops SQR,SUM,...] [--max-cases 6] [--repeat 3] [--jobs N]
                                    [--ggml-src DIR] [--no-suite] [--cold]

Per op: test-backend-ops' grad mode is run on CPU (one op per process: a whole run aborts at
the first op without a backward), its cases that ran are translated into our Cases
(reference.to_case: same op, shapes, init, eps, stencil, SUM loss, no consumer), and both
sides run exactly those cases: test-backend-ops filtered with -p to them, we through the
Runner with fork-per-case isolation in a child process (--jobs workers in parallel, as
test-backend-ops uses every core for each graph; each case's analytic backward on its
threads axis, 3 threads by default; its finite differences on one thread per forward, a big
case's over lanes, copies of its graph: check/lanes.py). Per evaluation, a case on lanes
counts its lanes' CPU seconds, not the wall time they share.

Printed: a table per op (cases, wall, cases/s, ratio ours/theirs in cases/s, > 1 means we are
faster); then per case, medians over --repeat: the ratio with both sides' start-ups (theirs:
process start and constructing its cases, once per op; ours: worker start and the first
case, once per op), without them (theirs: its wall minus its start-up, measured with a filter
that matches no case just before and just after each timed run of the op; ours: the Runner's
wall after its workers are up), and per op
without them (geometric mean, worst op). The HEADLINE is the least flattering of the two
"without" figures. Then per evaluation, on the full-mode cases: a bare ggml_graph_compute of
the same forward graph (the shim's gg_bare_compute_seconds: plan made once, one thread,
nothing written or read) against our numeric loop (the engine's numeric phase over its
evaluations) and against the whole engine (everything the case did inside its child over the
same evaluations), one case at a time with each case's bare compute measured right before and
right after its own run; the HEADLINE per evaluation is the whole engine's. Then start-up times,
isolation overhead per case, peak memory (wait4 of each side's process tree), build times,
and our whole built-in suite (cases.yaml + cases_fast.yaml).
"""

import argparse
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import reference
import pytest_gradgate
from pytest_gradgate.library.cmake import BuildOptions, ensure_build
from pytest_gradgate.declare.case import DEFAULT_THREADS, Case
from pytest_gradgate.errors import GradgateError
from pytest_gradgate.isolation.parent import Runner
from pytest_gradgate.declare.loader import load_file
try:
    from pytest_gradgate.gate.order import long_first
except ImportError:     # an older pytest-gradgate (before-and-after figures) runs its cases as collected
    def long_first(cases):
        return list(cases)
from pytest_gradgate.gate.selection import BUILTIN_FILES
from pytest_gradgate.library.source import resolve_source

DEFAULT_OPS = ("SQR", "SQRT", "LOG", "SIN", "COS", "SUM", "MEAN", "SUM_ROWS", "REPEAT", "SCALE", "CONT", "DUP",
               "ADD", "NEG", "SOFTPLUS", "EXPM1", "SILU", "SWIGLU", "GEGLU", "SOFT_MAX", "MUL_MAT")
# narrows what the discovery run of an op executes (MUL_MAT alone has >1000 grad cases, minutes)
DISCOVERY_FILTER = {"MUL_MAT": r"type_a=f32,type_b=f32,m=16,n=[0-9]+,k=256,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\]"}
DISCOVERY_TIMEOUT_S = 60
SUITE_FILES = BUILTIN_FILES    # every built-in file, as `pytest --gradgate` collects them
params_regex = reference.params_regex


# -- test-backend-ops side --------------------------------------------------------------------
def run_measured(cmd, cwd=None, env=None, stderr=None):
    """(wall s, rusage of the process and every process under it, exit code, its stdout) of
    one command; `stderr` as subprocess takes it (subprocess.STDOUT: into the output)."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode(errors="replace")
    return wall, usage, os.waitstatus_to_exitcode(status), text


def run_tbo(binary, op, params=None):
    """(RefRun, peak RSS in KiB) of one test-backend-ops grad run, timed with its start-up."""
    cmd = [str(binary), "grad", "-b", "CPU", "-o", op] + (["-p", params] if params else [])
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    env.pop(reference.REPORT_ENV, None)
    wall, usage, code, text = run_measured(cmd, env=env, stderr=subprocess.DEVNULL)
    return reference.RefRun(op, reference.parse_grad_output(text), code, None, wall), usage.ru_maxrss


# -- our side, in a child process (its own process tree, for peak memory) ---------------------
def _run_ours_child(spec_path):
    spec = json.loads(Path(spec_path).read_text())
    cases = [Case.from_dict(c) for c in spec["cases"]]
    jobs = max(1, min(spec["jobs"], len(cases) or 1))
    runners = [Runner(spec["library"], isolate=spec["isolate"]) for _ in range(jobs)]
    out = {"startup_s": 0.0, "wall_s": 0.0, "statuses": {}, "per_case": []}
    # the case that starts the workers: the first, or (bench_gate) the smallest, since a long
    # case that the gate runs first would otherwise be run once per worker more, one at a time
    warm = cases[spec.get("warm", 0)] if cases else None
    fresh = set(spec.get("fresh", ()))     # known failures: see known_failure_indexes
    if "fresh" not in inspect.signature(Runner.run).parameters:
        fresh = set()                       # an older package: a fresh child for every case anyway
    try:
        started = time.perf_counter()
        if cases:
            runners[0].run(warm)              # start-up to the first case: worker start + one case
        out["startup_s"] = time.perf_counter() - started
        for r in runners[1:]:
            r.run(warm)                       # warm the other workers too (not timed)
        results = [None] * len(cases)
        # bare_between: each full-mode case's bare compute, in this process, right before and
        # right after its run (see per_evaluation_alone)
        bare_lib = None
        if spec.get("bare_between"):
            from pytest_gradgate.library import binding
            bare_lib = binding.load(spec["library"])
            if not hasattr(bare_lib, "gg_bare_compute_seconds"):
                bare_lib = None
        bare = [[] for _ in cases]
        # each worker takes the next case when it is free, as the gate's threads and xdist's
        # scheduler do (a fixed split left one worker idle at the end while the other ran long cases)
        upcoming = iter(range(len(cases)))
        take = threading.Lock()

        def work(k):
            while True:
                with take:
                    i = next(upcoming, None)
                if i is None:
                    return
                run = runners[k].run
                measure_bare = bare_lib is not None and cases[i].mode == "full"
                if measure_bare:    # one worker: nothing else runs while it is measured
                    bare[i].append(bare_forward_seconds(cases[i], bare_lib, budget_s=BARE_BETWEEN_BUDGET_S))
                results[i] = run(cases[i], fresh=True) if i in fresh else run(cases[i])
                if measure_bare:
                    bare[i].append(bare_forward_seconds(cases[i], bare_lib, budget_s=BARE_BETWEEN_BUDGET_S))
        started = time.perf_counter()
        threads = [threading.Thread(target=work, args=(k,)) for k in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["wall_s"] = time.perf_counter() - started
        for i, r in enumerate(results):
            out["statuses"][r.status] = out["statuses"].get(r.status, 0) + 1
            # what the engine's own clock says (inside the child): for the per-evaluation figures
            # (getattr: the bench also times an older engine, for before-and-after figures)
            timings = getattr(r, "timings", {})
            out["per_case"].append({"duration": r.duration, "numeric_s": timings.get("numeric", 0.0),
                                    "numeric_lane_s": timings.get("numeric-lane-cpu-seconds"), "lanes": getattr(r, "lanes", 1),
                                    "evaluations": getattr(r, "evaluations", 0),
                                    "evaluations_halved": getattr(r, "evaluations_halved", 0), "status": str(r.status)})
            measured = [b for b in bare[i] if b is not None]
            if len(measured) == 2:
                out["per_case"][-1]["bare_s"] = sum(measured) / 2
    finally:
        for r in runners:
            r.close()
    print(json.dumps(out))
    return 0


def run_ours(cases, library, jobs, isolate="case", env=None, warm=0, fresh=(), bare_between=False):
    """(timings dict, peak RSS in KiB of the child's tree) for our Runner on these cases;
    `env`: more environment for the bench child (and so for its workers); `warm`: the index of
    the case that starts each worker (run once more, untimed, on every worker but the first);
    `fresh`: indexes of the cases expected red (Runner.run's fresh); `bare_between` (one job):
    each full-mode case's bare compute measured in the child right before and after its run,
    their mean in its per_case entry's "bare_s".
    timings["cpu_s"]: the CPU seconds of the bench child and every process under it (its
    start included)."""
    if bare_between and jobs != 1:
        raise ValueError("bare_between needs one worker: the bare computes must run alone")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"cases": [c.to_dict() for c in cases], "library": str(library), "jobs": jobs,
                   "isolate": isolate, "warm": warm, "fresh": list(fresh), "bare_between": bare_between}, spec)
    try:
        _, usage, code, text = run_measured([sys.executable, str(Path(__file__).resolve()), "--run-ours", spec.name],
                                            env=dict(os.environ, **(env or {})))
        if code != 0:
            raise RuntimeError(f"our bench child failed:\n{text[-2000:]}")
        timings = json.loads(text.strip().splitlines()[-1])
        timings["cpu_s"] = usage.ru_utime + usage.ru_stime
        return timings, usage.ru_maxrss
    finally:
        os.unlink(spec.name)


# -- the pieces of the report -----------------------------------------------------------------
def select_cases(binary, op, max_cases):
    """The cases of `op` that test-backend-ops runs to a verdict and that we can reproduce."""
    run = reference.run_grad(binary, op, params=DISCOVERY_FILTER.get(op), report_maa=False,
                             timeout=DISCOVERY_TIMEOUT_S)
    picked = [c for c in run.cases if c.status in ("ok", "fail") and reference.to_case(c) is not None]
    return picked[:max_cases]


def isolation_overhead(library, n=40):
    """ms per case of isolate=case over running the engine in-process, on one small case."""
    from pytest_gradgate.library import binding
    from pytest_gradgate.check.engine import run_case
    case = Case(name="iso", graph="mul(a, b)", params={"a": [4, 3], "b": [4, 3]})
    lib = binding.load(library)
    run_case(case, lib)
    started = time.perf_counter()
    for _ in range(n):
        run_case(case, lib)
    inproc = (time.perf_counter() - started) / n
    runner = Runner(library, isolate="case")
    try:
        runner.run(case)
        started = time.perf_counter()
        for _ in range(n):
            runner.run(case)
        isolated = (time.perf_counter() - started) / n
    finally:
        runner.close()
    return inproc * 1e3, isolated * 1e3


# each side of a case's run (bare_between): 3 batches this long before it and 3 after
BARE_BETWEEN_BUDGET_S = 0.05


def bare_forward_seconds(case, lib, budget_s=0.05):
    """Seconds per bare ggml_graph_compute of `case`'s forward graph (the graph the numeric
    loop runs), one thread, values as the engine writes them: the median of 3 batches, each
    the mean of as many runs as fit in `budget_s`."""
    from pytest_gradgate.library import binding
    from pytest_gradgate.check import engine
    from pytest_gradgate.check.ggml_graph import GraphBuilder, build_forward, graph_tensors, write_tensor
    from pytest_gradgate.declare.expr import parse_graph
    lines = parse_graph(case.graph)
    g = GraphBuilder(lib, case, n_tensors=graph_tensors(case, lines))
    session = binding.ffi.NULL
    try:
        _, _, _, loss = build_forward(g, case, lines)
        # (hasattr: the bench also times the engine from before graphs had a context of their own)
        gf = g.forward_graph(loss) if hasattr(g, "forward_graph") else lib.gg_graph_forward(g.ctx, loss, engine.GRAPH_SIZE)
        err = binding.ffi.new("char[256]")
        session = lib.gg_session_new(b"cpu", 1, err, 256)
        if session == binding.ffi.NULL or not lib.gg_session_alloc(session, g.ctx):
            return None
        for t, values in g.values:
            write_tensor(g, t, values)
        once = lib.gg_bare_compute_seconds(gf, 1, 3)
        if once < 0:
            return None
        runs = int(min(5000, max(5, budget_s / max(once, 1e-7))))
        batches = [lib.gg_bare_compute_seconds(gf, 1, runs) for _ in range(3)]
        return None if min(batches) < 0 else statistics.median(batches)
    finally:
        if session != binding.ffi.NULL:
            lib.gg_session_free(session)
        if hasattr(g, "free"):
            g.free()
        else:
            lib.gg_ctx_free(g.ctx)


def per_evaluation(cases, per_case, library):
    """{numeric, engine, bare: seconds per evaluation of the numeric loop, of the whole engine,
    of a bare compute; counted: cases; halved: the halved step's evaluations; engine_all_ratio:
    the whole engine's time against a bare compute of every evaluation, the halved step's too},
    summed over the full-mode cases that got through their numeric phase, each case's bare time
    weighted by its evaluations (per evaluation: those the stencil needs)."""
    from pytest_gradgate.library import binding
    lib = binding.load(library)
    if not hasattr(lib, "gg_bare_compute_seconds"):
        return None
    numeric = engine = bare = bare_halved = 0.0
    evaluations = halved = counted = 0
    for case, timing in zip(cases, per_case):
        if case.mode != "full" or not timing["evaluations"] or not timing["numeric_s"]:
            continue
        # measured around the case's own run where the bench child did (bare_between), else now
        per_eval = timing["bare_s"] if "bare_s" in timing else bare_forward_seconds(case, lib)
        if per_eval is None:
            continue
        # per evaluation, time is each evaluation's own: over lanes (check/lanes.py), the
        # lanes' CPU seconds, not the phase's wall time, which they share
        lane_s = timing.get("numeric_lane_s")
        numeric += lane_s if lane_s is not None else timing["numeric_s"]
        engine += timing["duration"] + (lane_s - timing["numeric_s"] if lane_s is not None else 0.0)
        bare += per_eval * timing["evaluations"]
        bare_halved += per_eval * timing.get("evaluations_halved", 0)
        evaluations += timing["evaluations"]
        halved += timing.get("evaluations_halved", 0)
        counted += 1
    if not evaluations:
        return None
    return {"numeric": numeric / evaluations, "engine": engine / evaluations, "bare": bare / evaluations,
            "counted": counted, "halved": halved, "engine_all_ratio": engine / (bare + bare_halved)}


def per_evaluation_alone(cases, library, repeat, isolate="case"):
    """per_evaluation's figures with both sides alone on the machine: one case at a time, its
    finite differences on one lane, and each case's bare compute measured right before and
    right after its own run, in the bench child, their mean against it: the machine's speed
    drifts within a run of the suite by more than the gap measured (one bare measurement
    after the whole run left the numeric loop at 0.75-1.25x of it, faster than a bare compute
    in some repetitions). Returns the repetitions' figures, in order."""
    reps = []
    for _ in range(repeat):
        ours, _ = run_ours(cases, library, 1, isolate=isolate, env={"GRADGATE_FD_LANES": "1"}, bare_between=True)
        figures = per_evaluation(cases, ours["per_case"], library)
        if figures is None:
            return None
        reps.append(figures)
    return reps


# blocks Hypothesis's pytest plugin: what pytest loads in a default install, where
# Hypothesis is only the explore extra (bench_gate.py, the one-case start below)
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")


def _pytest_plugin_entry_points():
    """The entry points of the pytest11 group: the plugins every pytest process here loads."""
    from importlib.metadata import entry_points
    found = entry_points()
    group = found.select(group="pytest11") if hasattr(found, "select") else found.get("pytest11", [])
    return list(group)


def hypothesis_plugin_installed():
    return any(ep.name == "hypothesispytest" for ep in _pytest_plugin_entry_points())


def install_description():
    """Which pytest-gradgate the bench measures. pytest rewrites the asserts of an installed
    plugin's modules, not of an editable install's (pytest_gradgate/__init__.py takes the
    package off that list, but a tree from before that did not): say which this is."""
    from importlib.metadata import PackageNotFoundError, distribution
    where = Path(pytest_gradgate.__file__).resolve().parent
    try:
        dist = distribution("pytest-gradgate")
    except PackageNotFoundError:
        dist = None
    if dist is not None:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if direct.get("dir_info", {}).get("editable"):
            checkout = Path(direct.get("url", "").removeprefix("file://")).resolve()
            if where.parent == checkout:
                return f"pytest-gradgate {pytest_gradgate.__version__}, an editable install of {checkout}" + _plugins_note()
        elif Path(dist.locate_file("pytest_gradgate/__init__.py")).resolve().parent == where:
            return f"pytest-gradgate {pytest_gradgate.__version__}, installed at {where}" + _plugins_note()
    return f"pytest-gradgate {pytest_gradgate.__version__} from {where} (on the path, not the installed one)"


def _plugins_note():
    plugins = installed_pytest_plugins()
    return f"; other pytest plugins installed: {', '.join(plugins)}" if plugins else "; no other pytest plugin installed"


def installed_pytest_plugins():
    """'name (distribution version)' of each pytest plugin an entry point loads here, this
    package's own left out: what 'as installed' carries beyond a default install, which has
    none (pytest-xdist is only the test extra's)."""
    out = set()
    for ep in _pytest_plugin_entry_points():
        dist = getattr(ep, "dist", None)
        if dist is not None and dist.metadata["Name"].lower().replace("_", "-") == "pytest-gradgate":
            continue
        out.add(f"{ep.name} ({dist.metadata['Name']} {dist.version})" if dist is not None else ep.name)
    return sorted(out)


def plugin_variants():
    """The pytest arguments each timed pytest run is repeated with: as installed, and with
    Hypothesis's plugin blocked where it is installed."""
    return [(), NO_HYPOTHESIS] if hypothesis_plugin_installed() else [()]


def pytest_start_to_first_case(tmp, extra=()):
    """Seconds from starting `pytest --gradgate` (warm cache) to its end, with one case run."""
    (Path(tmp) / "gradgate_one.yaml").write_text("cases:\n  - name: one\n    params: {a: [4, 3]}\n"
                                                 "    graph: sqr(a)\n    consumers: [none]\n")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--gradgate", "--gradgate-no-builtin", "-q",
                           "-p", "no:cacheprovider", *extra, "gradgate_one.yaml"], cwd=tmp, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    return wall, proc.returncode


def cold_build_seconds(root):
    """A real cold build of ggml + shim into an empty cache (ccache as configured)."""
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-cache-") as cache:
        env = dict(os.environ, GRADGATE_CACHE_DIR=cache)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", str(root)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return time.perf_counter() - started, proc.returncode


def fast_mode_figures(default_root, progress=print):
    """Fast mode on one-million-element parameters: a correct op on the ggml under test, and the
    story's CONCAT (KV cache of 4096 tokens) on the concat-fixed and concat-buggy variants."""
    from pytest_gradgate.library.cache import cache_root
    from ggml_variants import make_variant
    million = Case(name="silu_1m", graph="silu(a)", params={"a": [1024, 1024]}, mode="fast")
    kv = next(c for c in suite_cases() if c.name == "kv_cache_concat_1m")
    runs = [("default", million, ensure_build(default_root, BuildOptions()).library)]
    for name in ("concat-fixed", "concat-buggy"):
        dest = cache_root() / "bench-variants" / name / "ggml"
        if not (dest / "src" / "ggml.c").is_file():
            make_variant(default_root, dest, name)
        runs.append((name, kv, ensure_build(dest, BuildOptions(), progress=None).library))
    for label, case, library in runs:
        runner = Runner(library, isolate="case")
        try:
            started = time.perf_counter()
            r = runner.run(case)
            wall = time.perf_counter() - started
        finally:
            runner.close()
        directions = sum(p.get("fast", {}).get("forward_passes", 0) * p.get("fast", {}).get("forward_ms", 0)
                         for p in r.params) / 1e3
        sizes = "+".join(str(Case(name="x", graph="", params={k: v}).n_param_elements()) for k, v in case.params.items())
        progress(f"  {label:13s} {case.name:20s} {sizes:>15s} elements: {r.status:7s} MAA {r.maa:.3g} "
                 f"in {r.duration:.2f} s (directions {directions:.2f} s; wall with worker start {wall:.2f} s)"
                 + (f"\n{'':16s}{r.diagnosis}" if r.status == "failed" else ""))


def suite_cases(backends=("cpu",)):
    """The built-in suite's cases, in the order `pytest --gradgate` runs them (gate/order.py),
    so that the Runner alone gets the same long-cases-first schedule as the gate."""
    cases = []
    for path in SUITE_FILES:
        if path.is_file():
            loaded, _ = load_file(path, backends, builtin=True)
            cases += [c for entry in loaded for c in entry.cases]
    return long_first(cases)


def known_failure_indexes(cases, baseline_path=None):
    """Indexes of `cases` (built-in ones) that the default ggml's shipped baseline lists: the
    gate starts those in a fresh child at once (isolation/worker.py), and so does the Runner
    alone, or it would run each twice and look slower than it is."""
    try:
        from pytest_gradgate.gate.baseline import Baseline
        from pytest_gradgate.gate.selection import builtin_nodeid
    except ImportError:     # an older package
        return []
    path = baseline_path or Path(pytest_gradgate.__file__).resolve().parent / "gate" / "baseline_default.json"
    if not path.is_file():
        return []
    entries = Baseline.load(path).entries
    return [i for i, c in enumerate(cases) if f"{builtin_nodeid(c.origin['path'])}::{c.id}" in entries]


def fmt_rate(n, seconds):
    return f"{n / seconds:8.1f}" if seconds > 0 else "     inf"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-ours"]:
        return _run_ours_child(argv[1])
    parser = argparse.ArgumentParser(prog="bench/bench_reference.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help="ops, as test-backend-ops names them")
    parser.add_argument("--max-cases", type=int, default=6, help="cases per op (default 6)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="our parallel workers (default: the cores; test-backend-ops uses them all)")
    parser.add_argument("--ggml-src", help="ggml tree (default: as the plugin resolves it)")
    parser.add_argument("--no-suite", action="store_true", help="skip timing our whole built-in suite")
    parser.add_argument("--cold", action="store_true", help="also time a cold build into an empty cache")
    parser.add_argument("--no-fast", action="store_true", help="skip the fast-mode figures (10^6 elements)")
    args = parser.parse_args(argv)
    try:
        return _bench(args)
    except GradgateError as exc:
        print(f"bench_reference: {exc}", file=sys.stderr)
        return 2


def _bench(args):
    source = resolve_source(args.ggml_src)
    load = os.getloadavg()[0]
    print(f"bench_reference: ggml {source.version} from {source.label}; {os.cpu_count()} cores, "
          f"load average {load:.1f} (figures are noisy on a shared machine); {install_description()}")

    # builds: warm = what every run pays; cold = what the first run paid (recorded) or --cold
    started = time.perf_counter()
    build = ensure_build(source.root, BuildOptions())
    warm_build = time.perf_counter() - started
    started = time.perf_counter()
    ref = reference.ensure_reference(source.root, progress=lambda s: None)
    warm_ref = time.perf_counter() - started
    print(f"build ggml+shim: warm (cache hit) {warm_build:.2f} s; cold {build.info.get('build_seconds', '?')} s "
          f"(recorded when built){'' if build.cached else ' (built now)'}")
    print(f"build test-backend-ops: warm {warm_ref:.2f} s; cold {ref.build_seconds} s (recorded when built)")
    if args.cold:
        seconds, rc = cold_build_seconds(source.root)
        print(f"build ggml+shim cold into an empty cache now: {seconds:.1f} s (exit {rc})")

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    selected = {}
    for op in ops:
        picked = select_cases(ref.binary, op, args.max_cases)
        if picked:
            selected[op] = picked
    if not selected:
        raise GradgateError(f"--ops {args.ops}: no comparable test-backend-ops grad case for these ops "
                            "(names as test-backend-ops writes them, e.g. SQR,MUL_MAT)")
    rows = {op: [] for op in selected}
    peaks = {"tbo": 0, "ours": 0}
    startups = []
    startups_by_op = {op: [] for op in selected}
    timings_by_op = {}
    # test-backend-ops' start-up per op (process start, constructing its cases, none run), taken
    # with a filter that matches no case right before and right after each of its timed runs,
    # and their mean subtracted from that run's wall for "without": the machine's load drifts,
    # and a start-up measured once up front swung the per-case figure by 1.7x between runs
    tbo_startups = {op: [] for op in selected}
    for rep in range(args.repeat):
        for op, picked in selected.items():
            before = run_tbo(ref.binary, op, params="^$")[0].wall_s
            tbo_run, tbo_peak = run_tbo(ref.binary, op, params=params_regex([c.vars for c in picked]))
            tbo_startups[op].append((before + run_tbo(ref.binary, op, params="^$")[0].wall_s) / 2)
            ran = [c for c in tbo_run.cases if c.status in ("ok", "fail", "crashed")]
            cases = [reference.to_case(c) for c in ran if reference.to_case(c) is not None]
            ours, ours_peak = run_ours(cases, build.library, args.jobs)
            peaks["tbo"], peaks["ours"] = max(peaks["tbo"], tbo_peak), max(peaks["ours"], ours_peak)
            startups.append(ours["startup_s"])
            startups_by_op[op].append(ours["startup_s"])
            if rep == 0:
                timings_by_op[op] = (cases, ours["per_case"])
            rows[op].append({"tbo_n": len(ran), "tbo_s": tbo_run.wall_s, "ours_n": len(cases),
                             "ours_s": ours["wall_s"], "statuses": ours["statuses"]})

    every_startup = [v for values in tbo_startups.values() for v in values]
    tbo_startup_mean = statistics.fmean(every_startup)
    print(f"test-backend-ops start-up per op (constructing its cases, no case run; the mean of one run just before "
          f"and one just after each timed run): median {statistics.median(every_startup):.2f} s (from "
          f"{min(every_startup):.2f} to {max(every_startup):.2f} s)")
    print()
    print(f"{'op':10s} {'cases':>5s} | {'tbo s':>7s} {'cases/s':>8s} | {'ours s':>7s} {'cases/s':>8s} | "
          f"{'ratio':>6s} {'median':>6s}")
    total = {"tbo_n": 0, "tbo_s": 0.0, "ours_n": 0, "ours_s": 0.0}
    ratios_by_rep = [[] for _ in range(args.repeat)]
    for op, reps in rows.items():
        first = reps[0]
        ratios = [_ratio(r) for r in reps]
        for k, r in enumerate(reps):
            ratios_by_rep[k].append(r)
        print(f"{op:10s} {first['tbo_n']:5d} | {first['tbo_s']:7.2f} {fmt_rate(first['tbo_n'], first['tbo_s'])} | "
              f"{first['ours_s']:7.2f} {fmt_rate(first['ours_n'], first['ours_s'])} | "
              f"{ratios[0]:6.2f} {statistics.median(ratios):6.2f}")
        for key in total:
            total[key] += first[key]
    overall = [_ratio(_sum_rows(rep)) for rep in ratios_by_rep if rep]
    print(f"{'all':10s} {total['tbo_n']:5d} | {total['tbo_s']:7.2f} {fmt_rate(total['tbo_n'], total['tbo_s'])} | "
          f"{total['ours_s']:7.2f} {fmt_rate(total['ours_n'], total['ours_s'])} | "
          f"{overall[0]:6.2f} {statistics.median(overall):6.2f}")
    print(f"(this table: test-backend-ops' wall includes its start-up, {tbo_startup_mean:.2f} s per op on average; "
          f"ours excludes our worker start)")
    figures = speed_ratios(rows, tbo_startups, startups_by_op)
    print()
    print("per case against test-backend-ops, same cases, medians over the repetitions (> 1: we are faster):")
    print(f"  with both start-ups: {figures['with']:.2f}x  (test-backend-ops: process start and constructing its "
          f"cases, once per op; ours: worker start and the first case, once per op)")
    print(f"  without start-ups:   {figures['without']:.2f}x  (test-backend-ops {figures['tbo_ms']:.1f} ms per case, "
          f"its wall minus its start-up per op; ours {figures['ours_ms']:.1f} ms per case, "
          f"the Runner's wall after its workers are up)")
    print(f"  per op, without start-ups: geometric mean {figures['geomean']:.2f}x, worst {figures['worst']:.2f}x "
          f"({figures['worst_op']}); {figures['unresolved']} op(s) left out, their wall within {RESOLVABLE_S * 1e3:.0f} ms "
          f"of their start-up (counted as taking no time in 'without')")
    print(f"  what each side runs: test-backend-ops grad on CPU, {os.cpu_count()} threads per graph, one op per "
          f"process; ours: isolate=case (forked children that take case after case; red verdicts from fresh ones), {args.jobs} worker(s) in parallel, each case's "
          f"analytic backward on its threads axis ({DEFAULT_THREADS} threads), the finite-difference forwards on 1 "
          f"thread each, a big case's over 2 lanes (copies of its graph) when a core is idle, power probe and checks "
          f"included")
    headline, which = min(((figures["without"], "all cases, without start-ups"),
                           (figures["geomean"], "geometric mean over ops, without start-ups")),
                          key=lambda f: f[0] if math.isfinite(f[0]) else math.inf)
    print(f"HEADLINE per case: {headline:.2f}x test-backend-ops ({which}: the least flattering of the figures above; "
          f"goal: at least 1x)")
    ours_cases = [c for cases, _ in timings_by_op.values() for c in cases]
    ours_timing = [t for _, timing in timings_by_op.values() for t in timing]
    evals = per_evaluation(ours_cases, ours_timing, build.library)
    alone = per_evaluation_alone(ours_cases, build.library, args.repeat) if evals is not None else None
    # each case in a fresh child: what every red verdict of the default costs, and what every
    # case cost before children took case after case (an older package has no isolate=fresh)
    from pytest_gradgate.isolation.protocol import ISOLATE_MODES
    alone_fresh = (per_evaluation_alone(ours_cases, build.library, args.repeat, isolate="fresh")
                   if alone is not None and "fresh" in ISOLATE_MODES else None)
    if evals is None or alone is None:
        print("per evaluation: not measured (this engine reports no evaluations, or its library has no "
              "gg_bare_compute_seconds)")
    else:
        counted = evals["counted"]
        print(f"per evaluation (forward graph with its loss, {counted} full-mode cases, weighted by their evaluations; "
              f"bare: ggml_graph_compute of the same graph, plan made once, 1 thread, nothing written or read; the "
              f"numeric loop: perturb, compute, read the loss, its Python call; the whole engine: graphs, allocation, "
              f"backward, power probe, self-check, compare, everything inside the forked child):")
        ratios = {k: [r[k] / r["bare"] for r in alone] for k in ("numeric", "engine")}
        print(f"  both alone (one case at a time, one lane; each case's bare right before and after its run), "
              f"{len(alone)} repetitions: bare {statistics.median(r['bare'] for r in alone) * 1e6:.1f} us; numeric loop "
              f"{spread(ratios['numeric'])}; whole engine {spread(ratios['engine'])}")
        fresh_ratios = None
        if alone_fresh is not None:
            fresh_ratios = {k: [r[k] / r["bare"] for r in alone_fresh] for k in ("numeric", "engine")}
            print(f"  the same with a fresh child for every case (--gradgate-isolate fresh; under the default, "
                  f"every red verdict's child): numeric loop {spread(fresh_ratios['numeric'])}; whole engine "
                  f"{spread(fresh_ratios['engine'])}")
        numeric_s, engine_s, bare_s = evals["numeric"], evals["engine"], evals["bare"]
        print(f"  ours {args.jobs} case(s) at once as in the table above (lanes on idle cores, counted in their CPU "
              f"time), the bare compute alone after every run: bare {bare_s * 1e6:.1f} us; numeric loop "
              f"{numeric_s / bare_s:.2f}x; whole engine {engine_s / bare_s:.2f}x; over every evaluation taken, the "
              f"halved step's on failures too ({evals['halved']} of them): {evals['engine_all_ratio']:.2f}x. Ours "
              f"shares the cores here and the bare compute does not: this includes what the cases cost each other")
        fresh_text = "" if fresh_ratios is None else (
            f"; {statistics.median(fresh_ratios['engine']):.2f}x with a fresh child for every case")
        print(f"HEADLINE per evaluation: {statistics.median(ratios['engine']):.2f}x a bare ggml_graph_compute (the "
              f"whole engine's time over the evaluations its stencil needs, both sides alone, the median of "
              f"{len(alone)}, isolation as the default runs these cases{fresh_text}; the numeric loop alone "
              f"{statistics.median(ratios['numeric']):.2f}x; goal: at most 1.2x)")
    tbo_per_case = total["tbo_s"] / max(total["tbo_n"], 1)
    print(f"peak memory (max RSS of the process tree): test-backend-ops {peaks['tbo'] / 1024:.0f} MiB, "
          f"ours {peaks['ours'] / 1024:.0f} MiB (bench child + workers + forked cases)")
    if startups:
        print(f"our start-up to the first case (worker start + one case): median {statistics.median(startups):.2f} s")

    inproc_ms, isolated_ms = isolation_overhead(build.library)
    print(f"isolation overhead per case (isolate=case vs in-process, small case): "
          f"{isolated_ms - inproc_ms:.1f} ms ({inproc_ms:.1f} ms in-process, {isolated_ms:.1f} ms isolated)")
    with tempfile.TemporaryDirectory(prefix="gradgate-bench-start-") as tmp:
        # as installed here, and with Hypothesis's plugin blocked (a default install, where
        # Hypothesis is only the explore extra), alternating
        variants = plugin_variants()
        times = {v: [] for v in variants}
        for _ in range(3):
            for v in variants:
                times[v].append(pytest_start_to_first_case(tmp, v)[0])
    print(f"warm start, `pytest --gradgate` with one case, process start to exit: median "
          f"{statistics.median(times[()]):.2f} s (target < 2 s)"
          + (f"; default install ({' '.join(variants[1])}): {statistics.median(times[variants[1]]):.2f} s"
             if len(variants) > 1 else ""))

    if not args.no_fast:
        print("fast mode, one million elements (target: < 2 s per parameter, and the CONCAT bug flagged):")
        fast_mode_figures(source.root)

    if not args.no_suite:
        cases = suite_cases()
        ours, peak = run_ours(cases, build.library, args.jobs)
        n = len(cases)
        print(f"our built-in suite: {n} cases in {ours['wall_s']:.1f} s with {args.jobs} worker(s) = "
              f"{ours['wall_s'] / max(n, 1) * 1e3:.1f} ms per case (test-backend-ops above: "
              f"{tbo_per_case * 1e3:.1f} ms per case); statuses {ours['statuses']}; peak {peak / 1024:.0f} MiB")
    return 0


def spread(values):
    """'1.21x (1.15-1.30x)': the median and the range of ratios."""
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)"


# below this, an op's wall minus its start-up is noise (the start-up itself varies by more)
RESOLVABLE_S = 0.005


def speed_ratios(rows, tbo_startups, startups_by_op):
    """The per-case ratios (ours / theirs in cases per second; > 1: we are faster), each the
    median over the repetitions: 'with' both sides' start-ups once per op, 'without' neither;
    per op without start-ups, their geometric mean and the worst op. An op whose wall is within
    RESOLVABLE_S of its start-up counts as no time at all in 'without' (the least flattering
    reading) and is left out of the per-op figures ('unresolved' counts them). tbo_startups and
    startups_by_op: per op, one start-up per repetition."""
    n_reps = min(len(r) for r in rows.values())
    with_s, without_s, tbo_ms, ours_ms = [], [], [], []
    per_op = {op: [] for op in rows}
    for k in range(n_reps):
        tbo_n = sum(r[k]["tbo_n"] for r in rows.values())
        ours_n = sum(r[k]["ours_n"] for r in rows.values())
        tbo_s = sum(r[k]["tbo_s"] for r in rows.values())
        ours_s = sum(r[k]["ours_s"] for r in rows.values())
        tbo_net = sum(max(r[k]["tbo_s"] - tbo_startups[op][k], 0.0) for op, r in rows.items())
        ours_start = sum(startups_by_op[op][k] for op in rows)
        with_s.append((ours_n / (ours_s + ours_start)) / (tbo_n / tbo_s))
        without_s.append((ours_n / ours_s) / (tbo_n / tbo_net) if tbo_net > 0 else 0.0)
        tbo_ms.append(tbo_net / tbo_n * 1e3)
        ours_ms.append(ours_s / ours_n * 1e3)
        for op, r in rows.items():
            net = r[k]["tbo_s"] - tbo_startups[op][k]
            per_op[op].append((r[k]["ours_n"] / r[k]["ours_s"]) / (r[k]["tbo_n"] / net)
                              if net > RESOLVABLE_S and r[k]["ours_s"] > 0 else None)
    op_median = {op: statistics.median(v) for op, v in per_op.items() if None not in v}
    out = {"with": statistics.median(with_s), "without": statistics.median(without_s),
           "tbo_ms": statistics.median(tbo_ms), "ours_ms": statistics.median(ours_ms),
           "unresolved": len(rows) - len(op_median), "geomean": math.nan, "worst": math.nan, "worst_op": "none"}
    if op_median:
        out["worst_op"] = min(op_median, key=op_median.get)
        out["worst"] = op_median[out["worst_op"]]
        out["geomean"] = math.exp(statistics.fmean(math.log(v) for v in op_median.values()))
    return out


def _ratio(r):
    ours = r["ours_n"] / r["ours_s"] if r["ours_s"] > 0 else float("inf")
    theirs = r["tbo_n"] / r["tbo_s"] if r["tbo_s"] > 0 else float("inf")
    return ours / theirs if theirs > 0 else float("inf")


def _sum_rows(rows):
    return {k: sum(r[k] for r in rows) for k in ("tbo_n", "tbo_s", "ours_n", "ours_s")}


if __name__ == "__main__":
    sys.exit(main())
