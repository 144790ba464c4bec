"""Print which axes the built-in suite's cases reach, op by op, as a Markdown table (gate/coverage.py).

    gradgate coverage [--cases FILE ...]

--cases adds your case files to the built-in suite's (as `pytest --gradgate --gradgate-cases` would).
"""

from pathlib import Path

from pytest_gradgate.errors import UsageError


def add_arguments(p):
    p.add_argument("--cases", nargs="+", metavar="FILE", help="case files of yours to count with the built-in suite")


def run(args):
    from pytest_gradgate.declare.loader import load_file
    from pytest_gradgate.gate import coverage
    cases = coverage.builtin_cases()
    for f in args.cases or ():
        if not Path(f).is_file():
            raise UsageError(f"--cases {f}: not a file")
        loaded, errors = load_file(f, ("cpu",))
        if errors:
            raise UsageError(f"--cases {f}: {errors[0]}")
        cases += [c for entry in loaded for c in entry.cases]
    print(coverage.markdown(coverage.table(cases)), end="")
    return 0
