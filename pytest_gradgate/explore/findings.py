"""Findings: what a drawn case's Result means for the search, and how findings are written.

A Result is one of:
- a finding: a wrong gradient (failed), a ggml abort or death (crashed), a hang (timeout), or
  a consumer or producer that cannot carry a gradient in this ggml (consumer-failed,
  producer-failed);
- discarded: the finite differences are no evidence here (numeric-unreliable, inconclusive),
  the forward is out of its domain (a non-finite loss: nothing to blame; or an infinite gradient
  of sqrt, log or div at its singular point, reached as another op's output), ggml refused to build
  the forward graph (an abort in phase build-forward: an op's own assert on its inputs, before
  any backward exists), or the backend does not run the graph (skipped); never reported;
- not searched: ggml has no backward for an op of the graph (no-backward); not a finding, since
  nothing of a backward ran, but the summary names the ops so that the user knows what the
  search could not reach;
- a harness error (the worker could not run the case): counted and shown, never a finding,
  since it says nothing about ggml;
- passed.

A finding's key is (op, class, site), chosen so that one root cause is one key however the
draw shows it (and so that a baseline entry recorded from one draw matches the next):
- op: the case's main op (the outermost call; the consumer's or producer's name for
  consumer-failed and producer-failed), named by the ggml op it builds where several table ops
  build the same one (rope_ext and rope_multi are both ROPE, with one backward: `rope`);
- class: the diagnosis kind, with the kinds that one misreading backward shows depending on the
  values drawn (disagree, wrong-positions, concentrated) taken as one, `misread`;
- site: for a death, the source location in ggml's message (ggml.c:6892), so one assert is one
  finding however many shapes reach it; for a wrong gradient, the layout it arrived through
  (`contiguous`, or `laid-out` through a consumer or producer other than none), since a
  backward wrong on every layout and one wrong only on a transposed gradient are two bugs.
- a memory fault (out-of-bounds-write, unwritten-elements) is keyed by the ggml op the run
  verified at fault (the node a replay found writing, or the first node whose output holds
  unwritten elements), whatever op the case's graph ends in, and site `memory`: rope's odd
  head_dim is one finding through rope_ext, rope_multi or a chain around either.
Each key is reported once, with the smallest case seen for it.
"""

import json
import re

from pytest_gradgate.check.outcome import Diagnosis, Phase, Status, kind_family

FINDING, DISCARD, UNSEARCHED, ERROR, PASSED = "finding", "discard", "unsearched", "error", "passed"
CONTIGUOUS, LAID_OUT = "contiguous", "laid-out"     # a wrong gradient's site: the layout it came through
_SITE = re.compile(r"([\w.-]+\.(?:c|cc|cpp|cu|h|m)):(\d+)")
_DISCARD_STATUSES = {Status.NUMERIC_UNRELIABLE, Status.INCONCLUSIVE, Status.SKIPPED}
JSON_SCHEMA = 1


def crash_site(result):
    """Where ggml died, as file:line from its message, else how (no-backward, a signal)."""
    if result.kind == Diagnosis.NO_BACKWARD:
        return "no-backward"
    m = _SITE.search(result.message or "") or _SITE.search(result.stderr_tail or "")
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    return result.signal or str(result.kind) or "died"


# ops with a singular point (a pole, or an infinite derivative) inside the reals
DOMAIN_OPS = frozenset({"sqrt", "log", "div"})


def op_family(op):
    """The name a finding's key gives op: the op itself, or, where several table ops build the
    same ggml op (and so share its backward), that ggml op's (rope_ext, rope_multi -> rope)."""
    from pytest_gradgate.ops.table import OPS
    spec = OPS.get(op)
    if spec is None:
        return op
    if sum(1 for other in OPS.values() if other.ggml_op == spec.ggml_op) == 1:
        return op
    name = spec.ggml_op.lower()         # GLU(SWIGLU) -> swiglu
    return name[name.index("(") + 1:name.rindex(")")] if "(" in name else name


def class_family(kind):
    """A wrong gradient's class in the key: disagree, wrong-positions and a few wrong elements
    (concentrated) are one (misread): one misreading backward shows as any of them, by the draw."""
    return kind_family(kind)


MEMORY = "memory"       # a memory fault's site: the run named the node, not a layout
MEMORY_FAULTS = frozenset({Diagnosis.OUT_OF_BOUNDS_WRITE, Diagnosis.UNWRITTEN, Diagnosis.ALIAS})


def culprit_family(ggml_op):
    """A memory fault's op in the key: the ggml op the run named (ROPE -> rope, ROPE_BACK -> rope,
    SILU_BACK -> silu), so the forward's and the backward's kernel of one op are one family."""
    name = ggml_op.lower()
    return name[:-len("_back")] if name.endswith("_back") else name


def layout_site(consumer, producer):
    return CONTIGUOUS if (consumer or "none") == "none" and (producer or "none") == "none" else LAID_OUT


def classify(result, ops=(), declared=()):
    """-> (FINDING, key) | (DISCARD, why) | (UNSEARCHED, ops) | (ERROR, message) | (PASSED, None).
    `ops`: the ops of the case's graph; `declared`: the names of declared ops (explore/declared.py)."""
    status = result.status
    if status == Status.PASSED:
        return PASSED, None
    if status == Status.ERROR and result.phase == Phase.BUILD_FORWARD and set(ops) & set(declared):
        # a declared op's output shape is known only once ggml built it, so the drawn consumer
        # may not fit it (view_gap needs ne0 >= 2): the engine's error before any backward, the
        # draw's fault and not the harness's, as a shape the forward refuses is
        return DISCARD, "consumer-cannot-read-output"
    if status in _DISCARD_STATUSES:
        return DISCARD, str(status)
    if status == Status.FAILED:
        if result.kind == Diagnosis.NONFINITE_LOSS:
            return DISCARD, "nonfinite-loss"
        if result.kind == Diagnosis.NONFINITE_BACKWARD and set(ops) & DOMAIN_OPS:
            # an infinite gradient at a singular point of sqrt, log or div (0 reached as another
            # op's output, where no init range keeps the input away): right, not a finding
            return DISCARD, "nonfinite-at-singular-point"
        if result.kind in MEMORY_FAULTS and result.culprit:
            return FINDING, (culprit_family(result.culprit), str(result.kind), MEMORY)
        return FINDING, (op_family(result.op), class_family(result.kind), layout_site(result.consumer,
                                                                                        result.producer))
    if status == Status.CRASHED:
        if result.phase == Phase.BUILD_FORWARD:
            # ggml refused the forward graph (an op's own shape or layout assert): nothing about
            # the backward, and a hand-written case would be refused the same way
            return DISCARD, "forward-refused"
        if result.kind == Diagnosis.NO_BACKWARD:
            # no backward ran: nothing was checked, so nothing is wrong or known; the summary says
            # which ops the search could not reach
            return UNSEARCHED, tuple(ops)
        return FINDING, (op_family(result.op), str(result.kind), crash_site(result))
    if status == Status.TIMEOUT:
        return FINDING, (result.op, str(Diagnosis.HUNG), str(result.phase))
    if status in (Status.CONSUMER_FAILED, Status.PRODUCER_FAILED):
        side, name, kind = (("consumer", result.consumer, Diagnosis.CONSUMER_FAILS) if status == Status.CONSUMER_FAILED
                            else ("producer", result.producer, Diagnosis.PRODUCER_FAILS))
        return FINDING, (f"{side}:{name}", str(kind), crash_site(result)
                         if result.signal or "aborted" in (result.diagnosis or "") else "")
    return ERROR, result.message or str(status)


def size_of(mapping):
    """How big a case is, for keeping the smallest one per key: ops, then elements, then text."""
    from pytest_gradgate.declare.expr import ops_used, parse_graph
    n_ops = len(ops_used(parse_graph(mapping["graph"])))
    elements = 0
    for shape in mapping["params"].values():
        n = 1
        for x in shape:
            n *= x
        elements += n
    return (n_ops, elements, len(json.dumps(mapping, sort_keys=True)))


def key_text(key):
    op, kind, site = key
    return " ".join(part for part in (op, kind, site) if part)


class Finding:
    """One distinct failure: its key, the smallest case seen, its Result, how it was found."""

    def __init__(self, key, mapping, result, seed, found_after_s):
        self.key = tuple(key)
        self.mapping = mapping
        self.result = result              # a Result's to_dict()
        self.seed = seed                  # the explore --seed of the run that found it
        self.found_after_s = found_after_s
        self.known = None                 # the baseline entry that records it, see mark_known
        self.reproduced = None            # {runs, failed, verdicts} of its case run again (reproduce.py)
        self.not_upstream = None          # on a fork: how upstream differs on its case (upstream_check.py)

    @property
    def flaky(self):
        """Run again, its case did not fail the same way every time: no case to paste."""
        return self.reproduced is not None and self.reproduced["failed"] < self.reproduced["runs"]

    def offer(self, mapping, result):
        """Keep `mapping` if it is smaller than the case held so far."""
        if size_of(mapping) < size_of(self.mapping):
            self.mapping, self.result = mapping, result

    def to_dict(self):
        from pytest_gradgate.gate.baseline import normalise_reason
        return {"key": list(self.key), "op": self.key[0], "class": self.key[1], "site": self.key[2],
                "case": self.mapping, "status": self.result["status"],
                "diagnosis": normalise_reason(self.result.get("diagnosis")),
                "message": normalise_reason(self.result.get("message")), "seed": self.seed,
                "kind": self.result.get("kind"), "found_after_s": round(self.found_after_s, 2), "known": self.known,
                "reproduced": self.reproduced, "flaky": self.flaky, "node": node_name(self.mapping),
                "not_upstream": self.not_upstream}

    @classmethod
    def from_dict(cls, data):
        from pytest_gradgate.check.result import Result  # noqa: F401  (the dict is a Result's)
        f = cls(data["key"], data["case"], {"status": data["status"], "diagnosis": data["diagnosis"],
                                            "message": data["message"], "kind": data.get("kind")},
                data["seed"], data["found_after_s"])
        f.known = data.get("known")
        f.reproduced = data.get("reproduced")
        f.not_upstream = data.get("not_upstream")
        return f


def node_name(mapping):
    """The item id the case gets in a case file, made by Case.id itself (name[from_<producer>-
    consumer-loss-backend]): an id written here by hand lost the producer part, and pasted back
    it selected nothing."""
    from pytest_gradgate.declare.case import Case
    return Case(name=mapping["name"], graph="", params={}, consumer=(mapping.get("consumers") or ["none"])[0],
                producer=(mapping.get("producers") or ["none"])[0], loss=mapping.get("loss", "sqr")).id


def merge(findings_lists):
    """One Finding per key over several jobs: the earliest found, with the smallest case."""
    merged = {}
    for findings in findings_lists:
        for f in findings:
            held = merged.get(f.key)
            if held is None:
                merged[f.key] = f
                continue
            if f.found_after_s < held.found_after_s:
                held.found_after_s, held.seed = f.found_after_s, f.seed
            held.offer(f.mapping, f.result)
    return sorted(merged.values(), key=lambda f: f.found_after_s)


def ops_of(mapping):
    """The op calls of a case mapping's graph, outer before inner."""
    return _ops(mapping)


def _ops(mapping):
    from pytest_gradgate.declare.expr import ops_used, parse_graph
    return ops_used(parse_graph(mapping["graph"]))


def without_subsumed(findings):
    """Drop a chain's finding when a case of fewer of its own ops fails the same way (class
    and site): sqr(div(a, b)) dying at div's assert is div's finding, reported once. Drop a
    wrong gradient through a layout when the same op is wrong the same way on contiguous
    tensors: a backward wrong everywhere is wrong behind a transpose too, one bug (rope's odd
    head_dim shows through every consumer)."""
    kept = []
    keys = {f.key for f in findings}
    for f in findings:
        mine = _ops(f.mapping)
        if any(g is not f and g.key[1] == f.key[1] and _covers(g.key[2], f.key[2]) and len(_ops(g.mapping)) < len(mine)
               and set(_ops(g.mapping)) <= set(mine) for g in findings):
            continue
        op, kind, site = f.key
        if site == LAID_OUT and (op, kind, CONTIGUOUS) in keys:
            continue
        kept.append(f)
    return kept


def _covers(site, other):
    """A failure at `site` accounts for one at `other`: the same site, or a wrong gradient on
    contiguous tensors for the same one behind a layout."""
    return site == other or (site == CONTIGUOUS and other == LAID_OUT)


def name_findings(findings):
    """Unique, -k-able case names from the key: explore_<ops>_<class>[_<site>], numbered
    where two findings still share one."""
    seen = {}
    for f in findings:
        op, kind, site = f.key
        if site in (CONTIGUOUS, LAID_OUT):
            # a wrong gradient: named by what its case shows (wrong-positions, not the family)
            kind, site = f.result.get("kind") or kind, ""
        # inner op first, as the chain runs; a consumer's or producer's own failure is named after it
        ops = op.split(":", 1)[1] if op.startswith(("consumer:", "producer:")) else \
            "_".join(dict.fromkeys(reversed(_ops(f.mapping))))
        base = "_".join(part for part in ("explore", ops, kind, site.replace(":", "-").replace("/", "-")) if part)
        seen[base] = seen.get(base, 0) + 1
        f.mapping = dict(f.mapping, name=base if seen[base] == 1 else f"{base}_{seen[base]}")
    return findings


# --- known failures: the baseline's entries of the same op (and, for a death, the same site) ---
def builtin_ops():
    """node id of every built-in case -> its main op (to match baseline entries to findings)."""
    from pytest_gradgate.declare.expr import main_op, parse_graph
    from pytest_gradgate.declare.loader import load_file
    from pytest_gradgate.gate.selection import BUILTIN_FILES, builtin_nodeid
    out = {}
    for path in BUILTIN_FILES:
        loaded, _ = load_file(path)
        for entry in loaded:
            for case in entry.cases:
                out[f"{builtin_nodeid(path)}::{case.id}"] = (main_op(parse_graph(case.graph)), case.consumer,
                                                             case.producer)
    return out


class KnownFailures:
    """The baseline's failures, to match findings against: first the explore findings it
    records, by their key (gate/baseline.py, `explore`); then its suite entries: a death at the
    same site of the same op, a wrong gradient of the same op, a consumer that fails on its own."""

    def __init__(self, baseline):
        from pytest_gradgate.gate.baseline import _unaccepted, normalise_reason
        # a fork's own failure that nobody accepted is no known failure: not for the suite
        # (gate/baseline.py, Baseline.known), and not for a search either
        self.explore = {k: e for k, e in (baseline.explore if baseline is not None else {}).items()
                        if not _unaccepted(e)}
        ops = builtin_ops() if baseline is not None and len(baseline) else {}
        self.entries = []
        for node, entry in sorted((baseline.entries if baseline is not None else {}).items()):
            if _unaccepted(entry):
                continue
            op, consumer, producer = ops.get(node, (None, None, None))
            self.entries.append((node, op, consumer, producer, entry["status"], normalise_reason(entry.get("reason")),
                                 entry))

    def match_finding(self, key, status, mapping):
        """match(), and also what the finding is an instance of: a wrong gradient behind a layout
        is known when the same op's contiguous one is (wrong everywhere), and a chain's failure
        is known when one of its own ops fails that way and is known (sqr(rope_multi(a)) with an
        odd head_dim is rope's recorded misread; permute(get_rows(a)) dying at get_rows's assert
        is get_rows's known death)."""
        op, kind, site = key
        ops = [op] + [op_family(inner) for inner in (_ops(mapping) if mapping else ())
                      if op_family(inner) != op and not op.startswith(("consumer:", "producer:"))]
        for candidate in dict.fromkeys(ops):
            found = self.match((candidate, kind, site), status, mapping)
            if found is None and site == LAID_OUT:
                flat = {k: v for k, v in mapping.items() if k != "producers"} if mapping else None
                found = self.match((candidate, kind, CONTIGUOUS), status, flat and dict(flat, consumers=["none"]))
            if found is not None:
                return found
        return None

    def match(self, key, status, mapping=None):
        """The baseline entry that records this failure, as {node, status, reason}, or None.
        A wrong gradient (`mapping`: the finding's case) is known only where the baseline has the
        same op wrong through the same kind of layout (all contiguous, or not) and in the same
        family of diagnosis: ADD1's known wrong scale does not make a wrong sign of
        add1(scale(a, s=-2)) known, nor does SILU's misread of a transposed gradient make a
        wrong SILU on contiguous tensors known."""
        op, kind, site = key
        recorded = self.explore.get(key_text(key))
        if recorded is not None:
            return {"node": f"explore: {key_text(key)}", "status": recorded["status"], "reason": recorded.get("reason"),
                    "accepted": recorded.get("accepted")}
        for node, entry_op, consumer, producer, entry_status, reason, entry in self.entries:
            if op.startswith("consumer:"):
                same = entry_status == "consumer-failed" and consumer == op.split(":", 1)[1]
            elif op.startswith("producer:"):
                same = entry_status == "producer-failed" and producer == op.split(":", 1)[1]
            elif entry_op is None or op_family(entry_op) != op:
                same = False
            elif status == "crashed":
                same = entry_status == "crashed" and (site in reason if ":" in site else True)
            else:
                same = entry_status == status
                if same and status == "failed" and mapping is not None:
                    same = _family(kind) == _reason_family(reason) and \
                        _contiguous(consumer, producer) == _contiguous(*_layout_of(mapping))
            if same:
                return {"node": node, "status": entry_status, "reason": entry.get("reason"),
                        "accepted": entry.get("accepted")}
        return None


# one wrong backward shows as disagree, wrong positions or a few wrong elements depending on the draw; a wrong scale,
# a wrong sign and a dropped gradient are other bugs
_FAMILIES = {"wrong-positions": "misread", "disagree": "misread", "concentrated": "misread", "batch-misplaced": "misread"}
_REASON_FAMILIES = (("the forward mishandles this layout", "forward-wrong-on-layout"),
                    ("right values at wrong positions", "misread"), ("a batch at another batch's place", "misread"), ("values disagree", "misread"), ("elements wrong:", "misread"),
                    ("wrong scale", "wrong-scale"), ("wrong sign", "wrong-sign"), ("drops this gradient", "dropped"))


def _family(kind):
    return _FAMILIES.get(kind, kind)


def _reason_family(reason):
    for phrase, family in _REASON_FAMILIES:
        if phrase in (reason or ""):
            return family
    return None


def _contiguous(consumer, producer):
    return (consumer or "none") == "none" and (producer or "none") == "none"


def _layout_of(mapping):
    """(consumer, producer) of a drawn case mapping."""
    return (mapping.get("consumers") or ["none"])[0], (mapping.get("producers") or ["none"])[0]


def baseline_entries(findings, upstream_keys=(), upstream=None):
    """The baseline's explore entries that record these findings as known (gate/baseline.py).
    upstream: the shipped baseline of a fork's upstream version (its `upstream` the pin's name),
    and upstream_keys the keys of the findings whose cases upstream fails the same way
    (upstream_check.to_record): any other finding is recorded as the fork's own, which stays a
    new finding until its entry is given an "accepted" reason, as the suite's own entries do."""
    from pytest_gradgate.gate.baseline import reason_of
    entries = {}
    for f in findings:
        entry = {"status": f.result["status"], "reason": reason_of(f.result), "case": f.mapping}
        if upstream is not None:
            entry["upstream" if f.key in upstream_keys else "own"] = upstream.upstream
        entries[key_text(f.key)] = entry
    return entries


def mark_known(findings, baseline):
    """Set each finding's `known` to the baseline entry that records the same failure, if any."""
    known = KnownFailures(baseline)
    for f in findings:
        f.known = known.match_finding(f.key, f.result["status"], f.mapping)
    return findings


# --- output: a case file and JSON ---
def case_file_text(findings, header=""):
    """A case file of the findings' shrunk cases (a comment above each says what it found)."""
    import yaml
    parts = [f"# {line}".rstrip() for line in header.splitlines()] + ["cases:"]
    for f in findings:
        parts.append(f"  # {describe(f)}")
        body = yaml.safe_dump([f.mapping], sort_keys=False, default_flow_style=None, width=110)
        parts.extend("  " + line for line in body.splitlines())
    return "\n".join(parts) + "\n"


def describe(f):
    from pytest_gradgate.gate.baseline import normalise_reason
    known = f" (known: {f.known['node']})" if f.known else ""
    flaky = f" (flaky: {flaky_text(f)})" if f.flaky else ""
    return f"{key_text(f.key)}{known}{flaky}: {' '.join(normalise_reason(f.result.get('message')).split())[:160]}"


def flaky_text(f):
    r = f.reproduced
    return f"failed {r['failed']} of {r['runs']} identical runs"


def json_report(findings, stats):
    return {"schema": JSON_SCHEMA, "stats": stats, "findings": [f.to_dict() for f in findings]}
