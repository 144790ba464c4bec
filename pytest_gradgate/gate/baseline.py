"""Baseline: the known failures of a ggml tree, so that a gate can be green on a tree
that already has some and still block every NEW failure.

File format (JSON, versioned):
    {"schema": 2, "ggml_version": "0.15.3",
     "entries": {"<case key>": {"status": "crashed", "reason": "..."}}}

A case key is the case's pytest node id: its file (`pytest_gradgate/cases.yaml` for the
built-in suite, else the path relative to the rootdir) and its case id, e.g.
`tests/gradgate_ops.yaml::concat_dim1[transpose-sqr-cpu]`. The name alone is not enough:
a same-named case of another file, or a user's case named like a built-in, would inherit
the entry (a new failure shown as known) or make it stale forever. Schema 1 files were
keyed by the case id alone; they are refused with the command that rewrites them.

A known failure is reported as xfail with its recorded reason; a baseline entry whose case
now passes fails the gate like a strict xfail, so that the baseline only ever shrinks.

Explore's known findings sit beside the entries, under `explore`, keyed by the finding's key
(explore/findings.py: op, class and site, e.g. `clamp ggml-abort ggml.c:7074` or
`rope misread contiguous`), so that a finding recorded from one draw matches the same failure
in another draw of another seed:
    "explore": {"<op> <class> <site>": {"status": "crashed", "reason": "...", "case": {...}}}
The case is the smallest one that run found, for a reader to rerun. Recording adds and
replaces explore entries, never drops one: a random search that did not meet a failure this
time is no evidence that it is gone. Files without `explore` stay valid.
Runs that record into one baseline at once (a CI matrix, `-n`, several explore runs) each
re-read the file and write their changes over it under a lock on its folder (`record`), so that
each adds its own entries and none loses another's.
Skips (e.g. an op without a backward in the built-in suite) are not failures and never
become entries.
"""

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:      # not POSIX: recording is not guarded against concurrent writers
    fcntl = None

from pytest_gradgate.check.outcome import Diagnosis, kind_family
from pytest_gradgate.errors import GradgateError

SCHEMA = 2
FAILURE_STATUSES = ("failed", "crashed", "timeout", "error", "consumer-failed", "producer-failed")
STALE_TEXT = "fixed: remove it from the baseline"


def shipped_baseline(pinned):
    """The known failures shipped for a pinned source (library/source.py PINNED)."""
    return Path(__file__).parent / pinned.baseline


def upstream_of(version):
    """The pinned source of ggml `version` (a fork's upstream, when the fork says it is that
    version), or None: its shipped baseline is upstream's known failures."""
    from pytest_gradgate.library.source import PINNED
    return PINNED.get(f"ggml-{version}")


def upstream_baseline(source):
    """For a fork (a tree that is no pinned source, of a version whose baseline is shipped):
    upstream's shipped baseline, its `upstream` the pin's name; else None."""
    pin = upstream_of(source.version) if source.pinned is None else None
    if pin is None:
        return None
    upstream = Baseline.load(shipped_baseline(pin))
    upstream.upstream = pin.name
    return upstream

# ggml's abort lines carry the path it was compiled from: absolute, ggml/src/... where the build
# shares objects between copies of one tree (library/cmake.py, SOURCE_LINK), or ../ggml-source/src/...
# from a compiler without the prefix map (library/native/CMakeLists.txt); keep only the part inside the
# tree's src (ggml-cpu/ops.cpp:1841) so a recorded reason is the same everywhere
_ABS_SOURCE_PATH = re.compile(r"(?<![\w./-])(?:(?:\.\./)+|/)?(?:[^\s:/]+/)*src/((?:[\w.-]+/)*[\w.-]+\.(?:c|cc|cpp|cu|h|m):\d+)")


class BaselineError(GradgateError):
    pass


def normalise_reason(text):
    return _ABS_SOURCE_PATH.sub(r"\1", (text or "").strip())


# what drifts between two runs of one failure on trees a few edits apart: a source line number, an
# address, and a measured figure (a cosine, a norm ratio, a share: a backward that reads memory it
# does not own measures other figures on every run, and the same words are the same failure)
_DRIFT = re.compile(r"(\.(?:c|cc|cpp|cu|h|m)):\d+|0x[0-9a-fA-F]+|-?\d+\.\d+(?:e[+-]?\d+)?|\d+e[+-]?\d+|\d+%")
# ggml's own abort text (ggml.c's GGML_ASSERT and GGML_ABORT), not ours
_GGML_ABORT = re.compile(r"GGML_ASSERT\(.*\) failed|GGML_ABORT\(.*\)|fatal error")


def without_drift(text):
    return _DRIFT.sub(lambda m: m.group(1) or "", text or "")


def kind_of(result):
    """What a failure is, for matching it to a known one: its status and kind family (the misread
    kinds are one), and for a ggml abort the assert it hit (line numbers left out), e.g.
    `crashed ggml-abort GGML_ASSERT(ggml_is_padded_1d(a)) failed` or `failed misread`."""
    r = result if isinstance(result, dict) else result.to_dict()
    kind = kind_family(r.get("kind"))
    text = f"{r['status']} {kind}"
    if kind == str(Diagnosis.GGML_ABORT):
        found = _GGML_ABORT.search(r.get("diagnosis") or r.get("message") or "")
        if found:
            text += " " + without_drift(found.group(0))
    return text


def reason_of(result):
    """What a baseline records about a failure: its diagnosis, else its message."""
    r = result if isinstance(result, dict) else result.to_dict()
    return normalise_reason(r.get("diagnosis") or r.get("message") or r.get("status"))


class Baseline:
    def __init__(self, path, entries=None, ggml_version=None, explore=None):
        self.path = Path(path)
        self.entries = dict(entries or {})
        self.ggml_version = ggml_version
        self.explore = dict(explore or {})      # explore's known findings, see the module's docstring
        self.explore_added = {}                 # those this run recorded, for record() to merge
        # the pinned source's name when this is upstream's shipped baseline standing in for a fork's
        # (read only: a failure it lacks is the fork's own)
        self.upstream = None

    @classmethod
    def load(cls, path):
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BaselineError(f"baseline {path}: no such file (write one with --gradgate-update-baseline)") from None
        except (OSError, ValueError) as exc:
            raise BaselineError(f"baseline {path}: not a readable JSON file: {exc}") from None
        if isinstance(data, dict) and data.get("schema") == 1:
            raise BaselineError(f"baseline {path}: schema 1 keys entries by case name alone, which a same-named "
                                "case of another file would match; rewrite it with --gradgate-update-baseline "
                                f"--gradgate-baseline {path}")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
            raise BaselineError(f"baseline {path}: expected {{\"schema\": {SCHEMA}, \"entries\": {{file::case id: "
                                "{\"status\", \"reason\"}}}}; regenerate it with --gradgate-update-baseline")
        for case_id, entry in data["entries"].items():
            if not isinstance(entry, dict) or entry.get("status") not in FAILURE_STATUSES:
                raise BaselineError(f"baseline {path}: entry {case_id!r} needs a status, one of "
                                    f"{', '.join(FAILURE_STATUSES)}")
        explore = data.get("explore", {})
        if not isinstance(explore, dict) or not all(isinstance(e, dict) and e.get("status") in FAILURE_STATUSES
                                                    for e in explore.values()):
            raise BaselineError(f"baseline {path}: \"explore\" must map a finding's key (op class site) to "
                                f"{{\"status\", \"reason\"}}, the status one of {', '.join(FAILURE_STATUSES)}; "
                                "record it again with gradgate explore --update-baseline --baseline "
                                f"{path}")
        return cls(path, data["entries"], data.get("ggml_version"), explore)

    def get(self, key):
        """The entry of a case, by its key (key_of)."""
        return self.entries.get(key)

    def __len__(self):
        return len(self.entries)

    def known(self, key):
        """The entry that makes a failure known: not a fork's own failure recorded without an
        'accepted' reason (see updated)."""
        entry = self.entries.get(key)
        return None if entry is None or _unaccepted(entry) else entry

    def own_unaccepted(self):
        return sorted(k for k, e in self.entries.items() if _unaccepted(e))

    def updated(self, results, ggml_version, upstream=None):
        """A new baseline from this run's results: every case that ran is re-recorded (its
        failure kept, its pass dropped); entries for cases this run did not select stay.
        `upstream`: the shipped baseline of the fork's upstream version: a failure it records
        (same id, same kind) is recorded as upstream's, any other as the fork's own, which stays
        red until its entry is given an "accepted" reason (kept across recordings of one kind)."""
        # only the gate's case items have a key: a fixture check is never looked up, so never recorded
        gated = [r for r in results if r.get("baseline_key")]
        ran = {r["baseline_key"] for r in gated}
        entries = {key: e for key, e in self.entries.items() if key not in ran}
        for r in gated:
            # a skip (no backward in a built-in case) is not a failure, whatever the child's status
            if r["status"] in FAILURE_STATUSES and r.get("outcome") != "skipped":
                entries[r["baseline_key"]] = {"status": r["status"], "reason": reason_of(r), "kind": kind_of(r)}
                if r.get("phase") in ("allocation", "ggml-opt"):
                    # seen only in an allocation regime: a run that leaves the regimes out cannot see it
                    entries[r["baseline_key"]]["phase"] = r["phase"]
                if upstream is not None:
                    entry, theirs = entries[r["baseline_key"]], upstream.entries.get(r["baseline_key"])
                    if theirs is not None and theirs.get("kind", entry["kind"]) == entry["kind"]:
                        entry["upstream"] = upstream.upstream
                    else:
                        entry["own"] = upstream.upstream
                        before = self.entries.get(r["baseline_key"]) or {}
                        if before.get("accepted") and before.get("kind") == entry["kind"]:
                            entry["accepted"] = before["accepted"]
        new = Baseline(self.path, entries, ggml_version, self.explore)
        new.explore_added = dict(self.explore_added)
        return new

    def record_explore(self, recorded, ggml_version=None):
        """Record explore's findings as known, `recorded` as explore/findings.py
        baseline_entries gives them (added or replaced, none dropped: see the module's
        docstring); -> how many were not recorded before."""
        new = sum(1 for key in recorded if key not in self.explore)
        self.explore.update(recorded)
        self.explore_added.update(recorded)
        if ggml_version and not self.ggml_version:
            self.ggml_version = ggml_version
        return new

    def save(self):
        data = {"schema": SCHEMA, "ggml_version": self.ggml_version,
                "entries": {k: self.entries[k] for k in sorted(self.entries)}}
        if self.explore:
            data["explore"] = {k: self.explore[k] for k in sorted(self.explore)}
        from pytest_gradgate.atomic_file import write_atomically
        write_atomically(self.path, json.dumps(data, indent=1) + "\n")


@contextmanager
def _folder_locked(folder):
    """An exclusive lock on the folder (not on the file: the file is replaced by a rename, and a
    lock on the old one would not hold a second writer back), released when the block ends."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # closing the descriptor releases the lock


def record(path, change):
    """Read the baseline at `path` as it is now, apply `change` (Baseline -> Baseline) and
    write the result, all under a lock: another run's entries written since this run loaded
    the file are kept. A file that is missing or unreadable now starts empty (the user asked
    for it to be rewritten). -> the Baseline written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_locked(path.parent):
        try:
            current = Baseline.load(path)
        except BaselineError:
            current = Baseline(path)
        written = change(current)
        written.save()
    return written


def xfail_reason(entry, result):
    """The xfail text of a known failure: the recorded reason, plus what changed if anything
    (moved source lines and addresses are not a change)."""
    text = f"known failure (baseline): {entry['status']}: {entry.get('reason') or '-'}"
    now = reason_of(result)
    if result.status != entry["status"] or (now and without_drift(now) != without_drift(entry.get("reason"))):
        text += f"; this run: {result.status}: {now}"
    return text


def _unaccepted(entry):
    """A fork's own failure recorded without an "accepted" reason: not known, still red."""
    return bool(entry.get("own")) and not entry.get("accepted")


def own_text(entry, baseline):
    """Why a failure of a fork is red although its tree's upstream has known failures: it is not
    one of them (entry None: not recorded at all; else recorded as the fork's own, unaccepted)."""
    if entry is None and baseline.upstream:
        return (f"not in upstream {baseline.upstream}'s known failures (the shipped baseline this tree, which says "
                f"it is ggml {baseline.upstream[len('ggml-'):]}, starts from): the fork's own failure")
    if entry is not None and _unaccepted(entry):
        return (f"the fork's own failure (not in upstream {entry['own']}'s known failures), recorded in "
                f"{baseline.path} without an \"accepted\" reason: fix it, or accept it by giving its entry "
                "\"accepted\": \"<why>\"")
    return None


def changed_kind(key, entry, result, baseline_path):
    """None when this failure is the recorded one's kind, else the text of a failure: a known id
    that now fails another way is a new bug (an abort 'fixed' into a wrong gradient), not a known
    one. An entry recorded before kinds were is matched by its status."""
    now = kind_of(result)
    if result.status == entry["status"] and (not entry.get("kind") or entry["kind"] == now):
        return None
    was = entry.get("kind") or entry["status"]
    return (f"{key}: a known failure that now fails another way: the baseline {baseline_path} records {was} "
            f"({entry.get('reason') or '-'}); this run {now}: {reason_of(result)}. A new bug under a known id: "
            "fix it, or record it again with --gradgate-update-baseline once it is understood")


def key_of(item):
    """A case item's baseline key: its node id (file and case id), see the module's docstring."""
    return item.nodeid


def stale_text(key, entry, baseline_path):
    return (f"{key}: passes now, but the baseline {baseline_path} records it as a known failure "
            f"({entry['status']}: {entry.get('reason') or '-'}); {STALE_TEXT}")


DEFAULT_FILE = "gradgate-baseline.json"     # the file name the first-run note proposes


def first_run_text(source_label, record_command, what="failure"):
    """What a run on a tree with no baseline says, once: a tree that is not a pinned source
    has none shipped, so upstream's own failures show as new; how to record them."""
    return (f"ggml from {source_label} is not a pinned source, so no baseline of known failures comes with it: "
            f"every {what} above counts as new, upstream ggml's own included. To accept this tree's current "
            f"failures as known, record them once: {record_command} . Recording writes each failure (its case, "
            "status and reason) into that file; give it to later runs with the same option and they show the "
            "recorded failures as xfail and fail only on a new failure (or on a recorded one that now passes). "
            "Commit the file, and review what it records: each entry is a bug you accept.")
