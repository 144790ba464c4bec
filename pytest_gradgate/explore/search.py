"""The search: draw cases with Hypothesis, run each in the isolated worker, shrink failures.

One job is one warm Runner (a worker that forks a child per case, isolation/parent.py) and a
sequence of Hypothesis rounds. A round runs Hypothesis's @given over space.cases() until the
first failure whose key (findings.classify) is new, lets Hypothesis shrink it, and ends; the
next round starts from another seed with that key (and every key seen so far) treated as a
pass, so each round can only find something new. A crash is a Result like any other: the
worker survives its child, and the run goes on. A wrong gradient is confirmed before it counts:
the same case with a ten times smaller step must fail too (the 10-minute run on the clean
ggml had one rms_norm case, eps = 0.1 on one element, that failed at h = 0.1 only).

Each failure raises an exception class of its own (class, site): Hypothesis tells failures
apart by the exception's type and place (its "interesting origin"), so shrinking one never
slips into another kind; the op is left out of that, so that a chain whose inner op fails
shrinks to the inner op alone (its main op, the outer one, would otherwise pin the chain). The smallest case seen per key is kept here too, so a shrink cut short by the budget
still yields the smallest case found so far.

The first round replays Hypothesis's example database first: the failures earlier runs found
and saved run again before anything new is drawn. Later rounds skip that phase, because a
replayed failure that is now ignored would pass and Hypothesis would delete it.

Time: new cases are drawn until the budget is spent; a shrink under way may run on for at
most SHRINK_S seconds past the point where its failure was found (and never past the budget
plus SHRINK_S). An op without a backward in this ggml is no finding (findings.UNSEARCHED):
the summary names it, and its draws are spent like those of a known failure. Only what is
new is shrunk: a failure the baseline already records, a consumer or producer that fails on its own, a chain that fails as one of
its ops already did alone, and another wrong-gradient class of an op already shrunk are kept as
first seen (then the smallest seen), and pass from then on (_not_worth_a_shrink). Shrinking
them cost a 60-second search over every op of the uncaught variant 21 s of its 42 s of case
time, against 13 s of drawing; an op whose runs almost all fail as already found (no backward,
a known assert) is skipped nine draws in ten (_spent_op).
"""

import dataclasses
import json
import time

from pytest_gradgate.check.outcome import Diagnosis, Status
from pytest_gradgate.errors import GradgateError
from pytest_gradgate.explore import findings, reproduce, space
from pytest_gradgate.library import kernel_steps

SHRINK_S = 20.0             # the most one shrink may take
SPENT_AFTER = 6             # an op is spent after this many runs ...
SPENT_SHARE = 0.9           # ... of which this share failed as something already found
SPENT_KEEP = 10             # one draw in this many of a spent op still runs
CASE_TIMEOUT_S = 10.0       # a drawn case is small: past this it hangs
MAX_EXAMPLES = 10 ** 9      # the budget ends a round, not a count
CONFIRM_EPS_FACTOR = 10     # a wrong gradient must still be wrong with eps / 10


class _BudgetSpent(BaseException):
    """Ends a round from inside the test function. A BaseException: Hypothesis would take an
    Exception for a failure and shrink it."""


class _FindingFailure(Exception):
    pass


class Job:
    """One sequential search on one warm worker."""

    def __init__(self, library, seed, budget_s, ops, consumers=None, database=None, progress=None,
                 shrink_s=SHRINK_S, case_timeout=CASE_TIMEOUT_S, baseline=None, declared=None):
        from pytest_gradgate.isolation.parent import Runner
        self.runner = Runner(library, isolate="case", timeout=case_timeout)
        self.library = library
        self.seed, self.budget_s, self.ops, self.consumers = seed, budget_s, tuple(ops), consumers
        self.database, self.progress, self.shrink_s = database, progress, shrink_s
        self.declared = declared or {}  # declared ops among ops: name -> {c, ranges} (explore/declared.py)
        self.known = findings.KnownFailures(baseline)
        self.findings = {}              # key -> findings.Finding
        self.counts = {"cases": 0, "passed": 0, "findings": 0, "discarded": 0, "errors": 0, "invalid": 0}
        self.discarded = {}             # why -> count
        self.no_backward = set()        # ops whose graph alone had no backward: not searched
        self.errors = []                # harness errors: (message, case mapping), a few
        self._types = {}                # (class, site) -> its exception class
        self.shrunk = set()             # keys some round shrank, or that none will
        self.unshrunk = set()           # keys not worth a shrink (see _not_worth_a_shrink)
        self._wrong_shrunk = set()      # shrunk keys of wrong gradients
        self.op_draws = {}              # op -> [draws run that hold it, of them failing as already found]
        self._spent_skips = {}          # op -> draws considered for skipping (see _spent_op)
        self.case_seconds = 0.0

    def close(self):
        self.runner.close()

    def _exception_for(self, key):
        if key not in self._types:
            self._types[key] = type(f"Finding{len(self._types)}", (_FindingFailure,), {"key": key})
        return self._types[key]

    def _spent_op(self, ops):
        """Whether to skip a draw, unrun, for an op that it holds whose draws almost all fail the
        way something already found does (an op without a backward, an op that dies at a known
        assert whatever its input): each such run is a fork and a crash that says nothing new.
        One draw in SPENT_KEEP of them still runs, so that such an op's other failures can surface."""
        for op in set(ops):
            runs, dead = self.op_draws.get(op, (0, 0))
            if runs >= SPENT_AFTER and dead >= SPENT_SHARE * runs:
                self._spent_skips[op] = self._spent_skips.get(op, 0) + 1
                if self._spent_skips[op] % SPENT_KEEP:
                    return True
        return False

    def _not_worth_a_shrink(self, key, status, mapping):
        """A failure the baseline records, an op without a backward, a consumer or producer that
        fails on its own (their smallest case is in the suite, or any shape shows it), and a
        chain that fails the way one of its own ops already failed alone (sqr(clamp(a)) dying
        at clamp's assert: clamp's finding, which findings.without_subsumed keeps)."""
        if key[1] in (str(Diagnosis.NO_BACKWARD), str(Diagnosis.CONSUMER_FAILS), str(Diagnosis.PRODUCER_FAILS)):
            return True
        if self.known.match_finding(key, status, mapping):
            return True
        if status == str(Status.FAILED) and any(other[0] == key[0] and other != key
                                                  for other in self._wrong_shrunk):
            # another wrong-gradient class of an op whose wrong gradient is shrunk already: one
            # wrong backward shows as disagree, dropped or wrong-scale depending on the draw
            return True
        ops = set(findings.ops_of(mapping))
        return any(other != key and other[1:] == key[1:] and other[0] in ops for other in self.findings)

    def _confirmed(self, case):
        """A wrong gradient is reported only if it is still wrong with a step CONFIRM_EPS_FACTOR
        times smaller: a truncation error that the reliability check let through moves with the
        step, a wrong backward does not."""
        result = self.runner.run(dataclasses.replace(case, eps=case.eps / CONFIRM_EPS_FACTOR))
        self.counts["confirmations"] = self.counts.get("confirmations", 0) + 1
        return result.status == Status.FAILED

    def run(self):
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hypothesis_seed
        from pytest_gradgate.errors import CaseError

        self.runner.ggml_version()      # start the worker before the clock runs
        start = time.monotonic()
        deadline = start + self.budget_s
        strategy = space.cases(self.ops, self.consumers, declared=self.declared,
                               row_lengths=kernel_steps.for_library(self.library))
        state = {}

        def probe(mapping):
            now = time.monotonic()
            shrink_until = state.get("shrink_until")
            if shrink_until is None and now >= deadline:
                raise _BudgetSpent
            if shrink_until is not None and now >= shrink_until:
                raise _BudgetSpent
            try:
                (case,) = space.to_cases(mapping)
            except CaseError:
                from hypothesis import reject
                self.counts["invalid"] += 1
                reject()
            ops = findings.ops_of(mapping)
            if state.get("shrink_until") is None and self._spent_op(ops):
                from hypothesis import reject
                self.counts["skipped-spent-op"] = self.counts.get("skipped-spent-op", 0) + 1
                reject()
            began = time.perf_counter()
            result = self.runner.run(case)
            self.case_seconds += time.perf_counter() - began
            self.counts["cases"] += 1
            outcome, detail = findings.classify(result, ops, self.declared)
            for op in set(ops):
                seen = self.op_draws.setdefault(op, [0, 0])
                seen[0] += 1
            if outcome == findings.PASSED:
                self.counts["passed"] += 1
                return
            if outcome == findings.DISCARD:
                self.counts["discarded"] += 1
                self.discarded[detail] = self.discarded.get(detail, 0) + 1
                return
            if outcome == findings.UNSEARCHED:
                # no backward in this ggml: not a finding, but a line of the summary
                self.counts["no-backward"] = self.counts.get("no-backward", 0) + 1
                if len(set(detail)) == 1:
                    self.no_backward.add(detail[0])
                for op in set(ops) & self.no_backward:
                    self.op_draws[op][1] += 1       # its draws say nothing: spent, see _spent_op
                return
            if outcome == findings.ERROR:
                self.counts["errors"] += 1
                if len(self.errors) < 5:
                    self.errors.append({"message": detail, "case": mapping})
                return
            if result.status == Status.FAILED and not self._confirmed(case):
                self.counts["discarded"] += 1
                self.discarded["unconfirmed"] = self.discarded.get("unconfirmed", 0) + 1
                return
            self.counts["findings"] += 1
            key = detail
            held = self.findings.get(key)
            if held is None:
                self.findings[key] = findings.Finding(key, mapping, result.to_dict(), self.seed,
                                                      time.monotonic() - start)
                if self.progress:
                    self.progress(f"found {findings.key_text(key)} after {time.monotonic() - start:.1f} s")
            else:
                held.offer(mapping, result.to_dict())
            if key in state["ignored"]:
                for op in set(ops):
                    self.op_draws[op][1] += 1
                return          # found in an earlier round, or not worth a shrink: a pass here
            if key != state.get("target") and self._not_worth_a_shrink(key, str(result.status), mapping):
                # kept as first found (and the smallest seen after), never shrunk, and a pass from
                # now on: shrinking it would only end the round and restart Hypothesis for a case
                # whose small form is plain; the budget goes into drawing what is new
                self.unshrunk.add(key)
                for op in set(ops):
                    self.op_draws[op][1] += 1
                self.shrunk.add(key)
                state["ignored"].add(key)
                return
            if state.get("shrink_until") is None:
                state["target"] = key
                self.shrunk.add(key)
                if result.status == Status.FAILED:
                    self._wrong_shrunk.add(key)
                state["shrink_until"] = min(time.monotonic() + self.shrink_s, deadline + self.shrink_s)
            # Hypothesis tells failures apart by (class, site), not by op: the shrinker may then
            # take a chain that fails in its inner op down to that op alone
            raise self._exception_for(key[1:])(findings.key_text(key))

        round_no = 0
        while time.monotonic() < deadline:
            state.clear()
            # what earlier rounds shrank, and what was seen on the way and is one op already;
            # a chain seen on the way may still shrink, so it can be a round's target
            state["ignored"] = self.shrunk | {k for k, f in self.findings.items() if findings.size_of(f.mapping)[0] == 1}
            phases = [Phase.generate, Phase.shrink]
            if round_no == 0 and self.database is not None:
                phases.insert(0, Phase.reuse)
            test = settings(database=self.database, deadline=None, max_examples=MAX_EXAMPLES,
                            suppress_health_check=list(HealthCheck), phases=phases, verbosity=Verbosity.quiet,
                            report_multiple_bugs=False, print_blob=False)(given(strategy)(probe))
            test = hypothesis_seed(self.seed * 1000 + round_no)(test)
            try:
                test()
            except _BudgetSpent:
                pass
            except KeyboardInterrupt:
                raise
            except BaseException:   # the round's failure (shrunk), or Hypothesis's Flaky about one: recorded above
                pass
            round_no += 1
        self.rounds = round_no
        return self.report(time.monotonic() - start)

    def report(self, wall_s):
        return {"seed": self.seed, "wall_s": wall_s, "case_s": self.case_seconds, "counts": dict(self.counts),
                "discarded": dict(self.discarded), "errors": self.errors, "rounds": getattr(self, "rounds", 0),
                "no_backward": sorted(self.no_backward),
                "findings": [f.to_dict() for f in self.findings.values()]}


def run_job(spec, progress=None):
    """One job from plain data (see explore())."""
    database = None
    if spec.get("database"):
        from hypothesis.database import DirectoryBasedExampleDatabase
        database = DirectoryBasedExampleDatabase(spec["database"])
    baseline = None
    if spec.get("baseline"):
        from pytest_gradgate.gate.baseline import Baseline
        baseline = Baseline.load(spec["baseline"])
    job = Job(spec["library"], spec["seed"], spec["budget_s"], spec["ops"], spec.get("consumers"), database,
              progress=progress, baseline=baseline, declared=spec.get("declared"))
    try:
        return job.run()
    finally:
        job.close()


def job_environment(environ):
    """The environment of a job process when several share the cores. A case's backward runs on
    up to 4 threads, and ggml's CPU backend (built with OpenMP where the compiler has it, as
    CMake finds it by default) waits at each node's barrier in an OpenMP barrier, whose threads
    spin before they sleep: spinning while the thread they wait for is off its core cost 2 jobs
    on 2 cores 43 CPU ms a case against 30 with waiting threads asleep (46 against 67 cases/s,
    bench/bench_explore.py). The thread split, and so what a case checks, is the same. A wait
    policy of the user's own is kept."""
    env = dict(environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return env


def _job_process(spec):
    """A job in a process of its own: spec as JSON on stdin, its report as JSON on stdout."""
    import os
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "pytest_gradgate.explore.search"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=job_environment(os.environ))
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    return proc


def _main():
    import sys
    spec = json.loads(sys.stdin.read())
    prefix = f"gradgate explore: job {spec['job']}: "
    report = run_job(spec, progress=(lambda text: print(prefix + text, file=sys.stderr, flush=True))
                     if spec.get("progress") else None)
    sys.stdout.write(json.dumps(report))
    return 0


def explore(library, budget_s, seed=0, ops=None, consumers=None, jobs=1, database=None, progress=None,
            baseline=None, declared=None):
    """Search with `jobs` parallel jobs (seeds seed, seed+1, ...); -> (findings, stats).

    Each job runs in a process of its own, each with its own warm worker. The findings are
    merged by key (findings.merge), a chain's finding that one of its ops alone shows is
    dropped (findings.without_subsumed), and each new one's case is run again (reproduce.py)."""
    ops = space.explorable_ops(ops, declared)
    declared = {name: spec for name, spec in (declared or {}).items() if name in ops}
    # a job reads the baseline from its file (one not written yet, for --update-baseline, is empty)
    specs = [{"library": str(library), "seed": seed + i, "budget_s": budget_s, "ops": list(ops),
              "consumers": consumers, "database": str(database) if database else None, "declared": declared,
              "baseline": str(baseline.path) if baseline is not None and baseline.path.exists() else None} for i in range(jobs)]
    started = time.monotonic()
    if jobs == 1:
        reports = [run_job(specs[0], progress)]
    else:
        # a process per job: Hypothesis keeps per-process state, and each job has its own worker
        procs = [_job_process(dict(spec, job=i, progress=progress is not None)) for i, spec in enumerate(specs)]
        reports = []
        for i, proc in enumerate(procs):
            out = proc.stdout.read()
            if proc.wait() != 0 or not out:
                raise GradgateError(f"explore job {i} (seed {specs[i]['seed']}) died with exit code "
                                    f"{proc.returncode}; its error is above")
            reports.append(json.loads(out))
    wall = time.monotonic() - started
    merged = findings.merge([[findings.Finding.from_dict(f) for f in r["findings"]] for r in reports])
    counts = {}
    discarded = {}
    for r in reports:
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in r["discarded"].items():
            discarded[k] = discarded.get(k, 0) + v
    search_s = max(r["wall_s"] for r in reports)
    stats = {"budget_s": budget_s, "seed": seed, "jobs": jobs, "ops": list(ops), "wall_s": round(wall, 2),
             "search_s": round(search_s, 2), "counts": counts, "discarded": discarded,
             "cases_per_s": round(counts.get("cases", 0) / search_s, 1) if search_s else 0.0,
             "rounds": sum(r["rounds"] for r in reports),
             "errors": [e for r in reports for e in r["errors"]][:5],
             "no_backward": sorted({op for r in reports for op in r.get("no_backward", ())})}
    found = findings.mark_known(findings.name_findings(findings.without_subsumed(merged)), baseline)
    # only what is new is printed as a case to paste: a known finding is an xfail, its case recorded
    new = [f for f in found if f.known is None]
    if progress and new:
        progress(f"running the case of each of {len(new)} new finding(s) {reproduce.RUNS} more times")
    stats["recheck_s"] = round(reproduce.recheck(library, new), 2)
    return found, stats


if __name__ == "__main__":
    raise SystemExit(_main())
