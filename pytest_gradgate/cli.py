"""The `gradgate` console script. Each subcommand lives in its own module; this only
dispatches, so that `gradgate build` does not import what `gradgate verify` needs."""

import importlib
import sys

# subcommand -> (module, one-line help); each module has main(argv) -> exit code
SUBCOMMANDS = {
    "build": ("pytest_gradgate.cli_build", "build ggml + the shim for a source and print where the library is"),
    "verify": ("pytest_gradgate.verify", "does a case fail with a fix reverted? (gradgate verify --revert REF|PATCH)"),
    "bench": ("pytest_gradgate.bench", "benchmark against ggml's test-backend-ops"),
    "ops": ("pytest_gradgate.cli_ops", "list the ops, consumers and losses a case may use"),
}


def usage():
    lines = ["usage: gradgate COMMAND [options]", "", "commands:"]
    lines += [f"  {name:8s} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name = argv[0]
    if name not in SUBCOMMANDS:
        print(f"gradgate: unknown command '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
