"""Baseline: the known failures of a ggml tree, so that a gate can be green on a tree
that already has some and still block every NEW failure.

File format (JSON, versioned):
    {"schema": 1, "ggml_version": "0.15.3",
     "entries": {"<case id>": {"status": "crashed", "reason": "..."}}}

A known failure is reported as xfail with its recorded reason; a baseline entry whose case
now passes fails the gate like a strict xfail, so that the baseline only ever shrinks.
Skips (e.g. an op without a backward in the built-in suite) are not failures and never
become entries.
"""

import json
import re
from pathlib import Path

from pytest_gradgate.errors import GradgateError

SCHEMA = 1
DEFAULT_BASELINE = Path(__file__).parent / "baseline_default.json"
FAILURE_STATUSES = ("failed", "crashed", "timeout", "error", "consumer-failed")
STALE_TEXT = "fixed: remove it from the baseline"


def shipped_baseline(pinned):
    """The known failures shipped for a pinned source (build/source.py PINNED)."""
    return Path(__file__).parent / pinned.baseline

# ggml's abort lines carry the absolute path it was compiled from; keep only the part
# inside the ggml tree (ggml-cpu/ops.cpp:1841) so a recorded reason is the same everywhere
_ABS_SOURCE_PATH = re.compile(r"(?:/[^\s:/]+)+/src/((?:[\w.-]+/)*[\w.-]+\.(?:c|cc|cpp|cu|h|m):\d+)")


class BaselineError(GradgateError):
    pass


def normalise_reason(text):
    return _ABS_SOURCE_PATH.sub(r"\1", (text or "").strip())


def reason_of(result):
    """What a baseline records about a failure: its diagnosis, else its message."""
    r = result if isinstance(result, dict) else result.to_dict()
    return normalise_reason(r.get("diagnosis") or r.get("message") or r.get("status"))


class Baseline:
    def __init__(self, path, entries=None, ggml_version=None):
        self.path = Path(path)
        self.entries = dict(entries or {})
        self.ggml_version = ggml_version

    @classmethod
    def load(cls, path):
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BaselineError(f"baseline {path}: no such file (write one with --gradgate-update-baseline)") from None
        except (OSError, ValueError) as exc:
            raise BaselineError(f"baseline {path}: not a readable JSON file: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
            raise BaselineError(f"baseline {path}: expected {{\"schema\": {SCHEMA}, \"entries\": {{case id: "
                                "{\"status\", \"reason\"}}}}; regenerate it with --gradgate-update-baseline")
        for case_id, entry in data["entries"].items():
            if not isinstance(entry, dict) or entry.get("status") not in FAILURE_STATUSES:
                raise BaselineError(f"baseline {path}: entry {case_id!r} needs a status, one of "
                                    f"{', '.join(FAILURE_STATUSES)}")
        return cls(path, data["entries"], data.get("ggml_version"))

    def get(self, case_id):
        return self.entries.get(case_id)

    def __len__(self):
        return len(self.entries)

    def updated(self, results, ggml_version):
        """A new baseline from this run's results: every case that ran is re-recorded (its
        failure kept, its pass dropped); entries for cases this run did not select stay."""
        ran = {r["case_id"] for r in results}
        entries = {cid: e for cid, e in self.entries.items() if cid not in ran}
        for r in results:
            # a skip (no backward in a built-in case) is not a failure, whatever the child's status
            if r["status"] in FAILURE_STATUSES and r.get("outcome") != "skipped":
                entries[r["case_id"]] = {"status": r["status"], "reason": reason_of(r)}
        return Baseline(self.path, entries, ggml_version)

    def save(self):
        data = {"schema": SCHEMA, "ggml_version": self.ggml_version,
                "entries": {k: self.entries[k] for k in sorted(self.entries)}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.path)


def xfail_reason(entry, result):
    """The xfail text of a known failure: the recorded reason, plus what changed if anything."""
    text = f"known failure (baseline): {entry['status']}: {entry.get('reason') or '-'}"
    now = reason_of(result)
    if result.status != entry["status"] or (now and now != entry.get("reason")):
        text += f"; this run: {result.status}: {now}"
    return text


def stale_text(case_id, entry, baseline_path):
    return (f"{case_id}: passes now, but the baseline {baseline_path} records it as a known failure "
            f"({entry['status']}: {entry.get('reason') or '-'}); {STALE_TEXT}")
