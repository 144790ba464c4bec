"""Do two JSON reports of the gate agree on every case's verdict? For restructurings that must
not change behaviour: run the suite before and after, compare.

    python bench/compare_reports.py before.json after.json

    # e.g. the built-in suite on two checkouts, each from an empty folder:
    (cd "$(mktemp -d)" && PYTHONPATH=/path/to/old pytest --gradgate -q -n 2 --gradgate-json /tmp/before.json)
    (cd "$(mktemp -d)" && pytest --gradgate -q -n 2 --gradgate-json /tmp/after.json)

Compares, per case id, the status, the outcome and the phase (what a verdict is), and prints the
cases only one side has. Exit 0 when they agree, 1 when any differ.
"""

import argparse
import json
import sys

FIELDS = ("status", "outcome", "phase")


def verdicts(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return {case["id"]: tuple(case.get(k) for k in FIELDS) for case in doc["cases"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    before, after = verdicts(args.before), verdicts(args.after)
    only_before = sorted(before.keys() - after.keys())
    only_after = sorted(after.keys() - before.keys())
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    for k in changed:
        print(f"changed {k}: {dict(zip(FIELDS, before[k]))} -> {dict(zip(FIELDS, after[k]))}")
    for k in only_before:
        print(f"only before: {k}")
    for k in only_after:
        print(f"only after: {k}")
    print(f"{len(before)} cases before, {len(after)} after; {len(changed)} changed ({', '.join(FIELDS)}), "
          f"{len(only_before)} only before, {len(only_after)} only after")
    return 1 if changed or only_before or only_after else 0


if __name__ == "__main__":
    sys.exit(main())
