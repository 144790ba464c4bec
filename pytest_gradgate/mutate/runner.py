"""Plant each mutant in a copy of the tree, build it, run the cases that reach its code.

One copy of the tree per parallel slot (-j N), each with a build cache of its own (so that a
mutant's build never lands in the user's cache; ccache, which the build path tells to treat
every copy alike, compiles the one file that changed). For each mutant: write the mutated file,
`gradgate build` (a build that fails is a mutant that does not compile: counted, not run),
then `pytest --gradgate -x` over the cases whose graph uses an op whose backward runs the
mutated code (every selected case for the helpers every gradient goes through), stopping at the
first failure, and put the file back. The subprocesses run in sessions of their own: past the
per-mutant time limit the whole group is killed and the mutant is a timeout (a hang the gate
would have turned red), never a stuck run.

Verdicts: killed (some item red, or a timeout), survived (every item green), not compiled. The
unmutated copy runs the same way first and must be green: a red item there would kill every
mutant and mean nothing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pytest_gradgate.errors import GradgateError, UsageError
from pytest_gradgate.library.source import copy_tree
from pytest_gradgate.mutate.sites import ALL_OPS

KILLED, SURVIVED, NOT_COMPILED, TIMEOUT = "killed", "survived", "not-compiled", "timeout"


class Slot:
    """A copy of the tree, and a build cache, that one mutant at a time uses."""

    def __init__(self, workdir, index, ggml_root):
        self.root = Path(workdir) / f"tree-{index}"
        if not (self.root / "src").is_dir():
            copy_tree(ggml_root, self.root)
        self.cache = Path(workdir) / f"cache-{index}"
        self.run_dir = Path(workdir) / f"run-{index}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "pytest.ini").write_text("[pytest]\n")

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADGATE_", "GITHUB_"))}
        env["GRADGATE_CACHE_DIR"] = str(self.cache)
        return env

    def forget_builds(self):
        """A mutant's build is used once: its cache entry goes (ccache keeps the objects)."""
        shutil.rmtree(self.cache / "builds", ignore_errors=True)


_RUNNING = set()             # process groups under way, killed when the run is interrupted
_RUNNING_LOCK = threading.Lock()


def _run(cmd, cwd, env, deadline):
    """Run cmd in a session of its own -> (exit code or None past the deadline, output tail)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with _RUNNING_LOCK:
        _RUNNING.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill(proc.pid)
        out, _ = proc.communicate()
        return None, out
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc.pid)


def _kill(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_running():
    """Kill every build or gate run under way (the run was interrupted)."""
    with _RUNNING_LOCK:
        for pid in list(_RUNNING):
            _kill(pid)


def _tail(text, lines=12):
    return "\n".join((text or "").splitlines()[-lines:])


class Selection:
    """Which cases run for a mutant: pytest arguments, narrowed by the mutant's ops."""

    def __init__(self, keyword=None, cases=(), case_ops=None):
        self.keyword = keyword
        self.cases = [str(Path(c).resolve()) for c in cases]
        self.case_ops = case_ops or {}      # case name (before any vary suffix) -> set of ops

    def args(self, ops=None):
        args = []
        if self.cases:
            args.append("--gradgate-no-builtin")
            for f in self.cases:
                args += ["--gradgate-cases", f]
        names = None
        if ops is not None and ALL_OPS not in ops:
            names = sorted(name for name, used in self.case_ops.items() if used & set(ops))
            if not names:
                return None         # no selected case reaches this code
        expr = None
        if names is not None:
            expr = " or ".join(names)
        if self.keyword:
            expr = f"({self.keyword}) and ({expr})" if expr else self.keyword
        if expr:
            args += ["-k", expr]
        return args


def run_gate(slot, selection_args, deadline, report):
    """pytest --gradgate -x on the slot's tree -> (verdict, detail)."""
    cmd = [sys.executable, "-m", "pytest", "--gradgate", "--gradgate-ggml-src", str(slot.root), "-x", "-q",
           "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--gradgate-json", str(report),
           "--rootdir", str(slot.run_dir), "-c", str(slot.run_dir / "pytest.ini"), *selection_args]
    Path(report).unlink(missing_ok=True)
    code, out = _run(cmd, slot.run_dir, slot.env(), deadline)
    if code is None:
        return TIMEOUT, "the cases ran past the mutant's time limit"
    if code == 0:
        return SURVIVED, ""
    if code == 1 and Path(report).is_file():
        doc = json.loads(Path(report).read_text())
        red = [c for c in doc["cases"] if c.get("outcome") in ("failed", "error")]
        if red:
            first = red[0]
            return KILLED, f"{first['id']}: {(first.get('message') or first.get('diagnosis') or '')[:300]}"
    if code == 5:
        return None, "no case selected"
    raise GradgateError(f"pytest --gradgate did not run on {slot.root} (exit {code}):\n{_tail(out)}")


def build(slot, deadline):
    """gradgate build of the slot's tree as it is now -> (the library's path, "") or (None, why:
    the compiler's words, or the time limit)."""
    cmd = [sys.executable, "-m", "pytest_gradgate.cli", "build", "--ggml-src", str(slot.root)]
    code, out = _run(cmd, slot.run_dir, slot.env(), deadline)
    if code is None:
        return None, "the build ran past the mutant's time limit"
    if code != 0:
        return None, _tail(out, 20)
    # gradgate build prints the library's path on stdout, among stderr's progress lines here
    library = next((line.strip() for line in reversed(out.splitlines()) if Path(line.strip()).is_file()), None)
    return (library, "") if library else (None, f"gradgate build named no library:\n{_tail(out)}")


class MutationRun:
    def __init__(self, ggml_root, workdir, mutants, selection, jobs=1, timeout_s=None, progress=print,
                 report=None):
        self.ggml_root = Path(ggml_root)
        self.workdir = Path(workdir)
        self.mutants = mutants
        self.selection = selection
        self.jobs = max(1, jobs)
        self.timeout_s = timeout_s
        self.progress = progress
        self.report = report
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def check_unmutated(self):
        """The selection on the unmutated tree: must be green. -> seconds it took (build + run)."""
        slot = Slot(self.workdir, 0, self.ggml_root)
        started = time.monotonic()
        deadline = started + 3600
        library, why = build(slot, deadline)
        if library is None:
            raise GradgateError(f"the unmutated tree does not build:\n{why}")
        verdict, detail = run_gate(slot, self.selection.args(), deadline, slot.run_dir / "report.json")
        if verdict == KILLED:
            raise UsageError(f"the selected cases are red on the unmutated tree ({detail}): every mutant would be "
                             "'killed' by it. Record its known failures in a baseline (pytest --gradgate "
                             "--gradgate-update-baseline) or narrow the selection (-k, --ops)")
        if verdict is None:
            raise UsageError("the selection matches no case")
        return time.monotonic() - started

    def one(self, slot, mutant):
        path = slot.root / mutant.path
        original = path.read_bytes()
        started = time.monotonic()
        deadline = started + self.timeout_s
        args = self.selection.args(mutant.ops)
        if args is None:
            return {"verdict": "unreached", "detail": f"no selected case uses {', '.join(mutant.ops)}", "seconds": 0.0}
        try:
            path.write_bytes(mutant.apply(original))
            library, why = build(slot, deadline)
            if library is None:
                verdict, detail = (TIMEOUT, why) if "time limit" in why else (NOT_COMPILED, why)
            else:
                verdict, detail = run_gate(slot, args, deadline, slot.run_dir / "report.json")
        finally:
            path.write_bytes(original)
            slot.forget_builds()
        return {"verdict": verdict, "detail": detail, "seconds": round(time.monotonic() - started, 1)}

    def run(self):
        """Run every mutant not in the report yet; the report is saved after each."""
        todo = [m for m in self.mutants if m.id not in self.report.results]
        self.progress(f"gradgate mutate: {len(self.mutants)} mutants, {len(self.mutants) - len(todo)} done before, "
                      f"{len(todo)} to run on {self.jobs} job(s), at most {self.timeout_s:.0f} s each")
        slots = [Slot(self.workdir, i, self.ggml_root) for i in range(self.jobs)]
        free = list(slots)
        texts = {}

        def work(mutant):
            if self.stop.is_set():
                return
            with self.lock:
                slot = free.pop()
            try:
                result = self.one(slot, mutant)
            except GradgateError:
                if self.stop.is_set():
                    return          # killed by the interrupt: no verdict
                raise
            finally:
                with self.lock:
                    free.append(slot)
            if self.stop.is_set():
                return
            with self.lock:
                if mutant.path not in texts:
                    texts[mutant.path] = (self.ggml_root / mutant.path).read_bytes()
                result["diff"] = mutant.diff_line(texts[mutant.path])
                self.report.add(mutant, result)
                done = sum(1 for m in self.mutants if m.id in self.report.results)
                self.progress(f"[{done}/{len(self.mutants)}] {result['verdict']:<12} {mutant.path}:{mutant.line} "
                              f"{mutant.description} ({result['seconds']} s)")

        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = [pool.submit(work, m) for m in todo]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                self.stop.set()
                for f in futures:
                    f.cancel()
                kill_running()      # each mutant's file is put back by its own thread
                raise


def explore_survivors(run, budget_s):
    """For each survivor not searched yet: build the mutant and the unmutated tree, and let
    mutate/survivors.py search for a killing case; the result goes into the survivor's entry."""
    from pytest_gradgate.mutate import survivors
    slot = Slot(run.workdir, 0, run.ggml_root)
    ours = {m.id for m in run.mutants}      # this command's mutants (--at, --ops, --limit)
    todo = [r for r in run.report.survivors() if "explored" not in r and r["id"] in ours]
    if not todo:
        return
    run.progress(f"gradgate mutate: searching {len(todo)} survivor(s) with explore, {budget_s:g} s each")
    deadline = time.monotonic() + 3600
    unmutated, _ = build(slot, deadline)
    if unmutated is None:
        raise GradgateError("the unmutated tree does not build")
    keep = slot.cache / "unmutated"
    shutil.rmtree(keep, ignore_errors=True)
    shutil.copytree(Path(unmutated).parent, keep)      # forget_builds() would take it away
    unmutated = str(keep / Path(unmutated).name)
    for r in todo:
        path = slot.root / r["path"]
        original = path.read_bytes()
        try:
            path.write_bytes(original[:r["start"]] + r["replacement"].encode() + original[r["end"]:])
            library, _ = build(slot, time.monotonic() + 3600)
            result = (survivors.search(library, unmutated, r, budget_s) if library else
                      {"verdict": "not-explored", "detail": "the mutant did not build again"})
        finally:
            path.write_bytes(original)
        # explore's workers load the library from the build folder: it goes only now
        slot.forget_builds()
        r["explored"] = result
        run.report.save()
        run.progress(f"  {r['path']}:{r['line']} {r['description']}: {result['verdict']} ({result['detail']})")
