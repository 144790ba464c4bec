"""The `gradgate` console script: argparse subcommands, one module each.

Conventions, as in the tools we model on: `--version`; usage errors (a bad argument, a bad
path, a case selection that matches nothing) exit 2 with one line on stderr; failures of
the work itself (a build that fails, cases that do not gate a change) exit 1; what a script
wants is on stdout, progress and details on stderr.
"""

import argparse
import importlib
import sys

from pytest_gradgate import __version__
from pytest_gradgate.errors import GradgateError, UsageError

# subcommand -> (module, one-line help); each module has add_arguments(parser) and run(args) -> exit code
SUBCOMMANDS = {
    "build": ("pytest_gradgate.cli.build", "build ggml + the shim for a source and print the library's path"),
    "verify": ("pytest_gradgate.cli.verify", "does a case fail with a fix reverted? (gradgate verify --revert REF|PATCH)"),
    "ops": ("pytest_gradgate.cli.ops", "list the ops, consumers and losses a case may use"),
    "explore": ("pytest_gradgate.cli.explore", "search random cases for backward bugs and shrink each to a case"),
    "export": ("pytest_gradgate.cli.export", "print a gate item's case as a test-backend-ops test_case (C++)"),
    "coverage": ("pytest_gradgate.cli.coverage", "which axes (layouts, batches, values, params) each op's cases reach"),
    "mutate": ("pytest_gradgate.cli.mutate", "plant mutations in the backward code: which does the suite let through?"),
}
USAGE_EXIT = 2
FAILURE_EXIT = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # one line and exit 2, like every other usage error of the tool
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_EXIT)


def parser():
    p = _Parser(prog="gradgate", description="pytest-gradgate's tools; the gate itself is `pytest --gradgate`.")
    p.add_argument("--version", action="version", version=f"gradgate (pytest-gradgate) {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sp = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).split("\n\n")[0])
        module.add_arguments(sp)
        sp.set_defaults(run=module.run)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        p.print_help(sys.stderr)
        return USAGE_EXIT
    prog = f"gradgate {args.command}"
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except GradgateError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return FAILURE_EXIT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (nothing was published)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
