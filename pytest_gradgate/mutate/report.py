"""The mutation run's results: a JSON file written after every mutant, and the terminal table.

The file is the run's memory: a run started again with the same tree and selection skips the
mutants it holds (an interrupted run resumes); one made for another tree or selection is not
reused (its `key` differs) and is set aside, not overwritten.
"""

import json
from pathlib import Path

from pytest_gradgate.atomic_file import write_atomically

SCHEMA = 1


class Report:
    def __init__(self, path, key, header):
        self.path = Path(path)
        self.key = key                  # the tree's digest and the selection: what results hold for
        self.header = header            # tree, selection, jobs, ...: shown, not compared
        self.results = {}               # mutant id -> {mutant fields..., verdict, detail, seconds, diff}
        self.resumed = 0

    @classmethod
    def open(cls, path, key, header):
        report = cls(path, key, header)
        path = Path(path)
        if path.is_file():
            try:
                doc = json.loads(path.read_text())
            except ValueError:
                doc = None
            if isinstance(doc, dict) and doc.get("schema") == SCHEMA and doc.get("key") == key:
                report.results = dict(doc.get("results", {}))
                report.resumed = len(report.results)
            else:
                path.replace(path.with_suffix(path.suffix + ".old"))
        return report

    def add(self, mutant, result):
        self.results[mutant.id] = dict(mutant.to_dict(), **result)
        self.save()

    def _of(self, ids):
        return [r for key, r in self.results.items() if ids is None or key in ids]

    def counts(self, ids=None):
        """verdict -> how many, over the mutants `ids` (all the report holds by default)."""
        out = {}
        for r in self._of(ids):
            out[r["verdict"]] = out.get(r["verdict"], 0) + 1
        return out

    def score(self, ids=None):
        """killed (timeouts included) / (killed + survived); None before any of either."""
        c = self.counts(ids)
        killed = c.get("killed", 0) + c.get("timeout", 0)
        judged = killed + c.get("survived", 0)
        return killed / judged if judged else None

    def survivors(self, ids=None):
        return sorted((r for r in self._of(ids) if r["verdict"] == "survived"),
                      key=lambda r: (r["path"], r["line"], r["start"]))

    def save(self):
        doc = {"schema": SCHEMA, "key": self.key, **self.header, "counts": self.counts(), "score": self.score(),
               "results": self.results}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True))

    def table(self, ids):
        """The run's table over this command's mutants (ids): a report may hold more (--at)."""
        ids = set(ids)
        total = len(ids)
        c = self.counts(ids)
        score = self.score(ids)
        lines = [f"mutants: {total}; killed {c.get('killed', 0)}, timeout {c.get('timeout', 0)}, survived "
                 f"{c.get('survived', 0)}, not compiled {c.get('not-compiled', 0)}, unreached "
                 f"{c.get('unreached', 0)}; not run {total - sum(c.values())}",
                 "mutation score: " + (f"{score:.1%} (killed and timeouts over killed, timeouts and survivors)"
                                       if score is not None else "none yet")]
        survivors = self.survivors(ids)
        if survivors:
            lines.append("")
            lines.append(f"survivors ({len(survivors)}): no selected case turned red")
            for r in survivors:
                lines.append(f"  {r['path']}:{r['line']} in {r['function']} ({', '.join(r['ops'])}): {r['description']}")
                lines.extend("      " + d for d in r["diff"].splitlines())
                explored = r.get("explored")
                if explored:
                    lines.append(f"    {explored['verdict']}: {explored['detail']}")
                    if explored.get("case"):
                        lines.extend("      " + d for d in explored["case"].splitlines())
        return "\n".join(lines)
