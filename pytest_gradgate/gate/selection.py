"""Which case files a `pytest --gradgate` run collects, and how built-in items are named.

The built-in suite lives inside the installed package, outside the user's rootdir. Its items
get the stable ids `pytest_gradgate/cases.yaml::name[variant]`, and such an id, pasted back on
the command line, is mapped to the installed file, so that it selects exactly that item.
"""

import re
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# full mode; fast mode; equivalence (formulations against each other)
BUILTIN_FILES = tuple(PACKAGE_DIR / n for n in ("cases.yaml", "cases_fast.yaml", "cases_equivalence.yaml"))
BUILTIN_PREFIX = "pytest_gradgate/"
# users' case files, found under the paths collected; DOTALL and fullmatch: a name holding a
# newline is a case file too (the gate refuses it by name, never skips it in silence)
CASE_FILE_RE = re.compile(r"gradgate_.*\.ya?ml", re.DOTALL)


def is_builtin(path):
    return Path(path).resolve() in BUILTIN_FILES


def builtin_nodeid(path):
    return BUILTIN_PREFIX + Path(path).name


# what marks the top of a project: pytest's own config files, or a git work tree
PROJECT_MARKERS = (".git", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def project_nodeid(path, rootpath):
    """The node id of a case file outside the rootdir, or None for one inside it (pytest's own
    id is then rootdir-relative). pytest would give such a file given by path the id `""`, so
    its items were `::case[variant]` and never matched a baseline recorded in the project
    (`tests/gradgate_cases.yaml::case[...]`): here it is relative to its project's top, the
    nearest folder above it that holds a pytest config or .git, as if pytest ran there."""
    path = Path(path).resolve()
    try:
        path.relative_to(Path(rootpath).resolve())
        return None
    except ValueError:
        pass
    return _project_relative(path)


def _project_relative(path):
    for folder in path.parents:
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return path.relative_to(folder).as_posix()
    return path.as_posix()


def _case_file_named_by(arg, invocation_dir, case_files):
    """The --gradgate-cases file a node id's path part names by its project-relative path (the
    id a run printed: `tests/gradgate_cases.yaml::x[...]`), when that path is no file from where
    pytest runs now; else None. So the id pastes back from any folder the same command runs in."""
    path = arg.split("::", 1)[0]
    if "::" not in arg or (Path(invocation_dir) / path).exists():
        return None
    return next((f for f in case_files if _project_relative(Path(f).resolve()) == path.replace("\\", "/")), None)


def _builtin_named_by(arg, invocation_dir):
    """The installed built-in file an argument's path part names (its node id prefix), or None."""
    path = arg.split("::", 1)[0]
    if not path.replace("\\", "/").endswith(tuple(builtin_nodeid(f) for f in BUILTIN_FILES)):
        return None
    if (Path(invocation_dir) / path).exists() and not is_builtin(Path(invocation_dir) / path):
        return None   # a file of the user's that happens to have that name
    return next(f for f in BUILTIN_FILES if arg.split("::", 1)[0].replace("\\", "/").endswith(builtin_nodeid(f)))


def gate_args(config, no_builtin, extra_files):
    """(args to collect, yaml_only) for a run with --gradgate.

    - built-in ids (`pytest_gradgate/cases.yaml::x[...]`) are mapped to the installed files;
    - node ids (`file.yaml::case[...]`) select those items only: no built-in suite is added;
    - without explicit paths, the gate's cases alone run (`yaml_only`): the built-in suite,
      gradgate_*.yaml under testpaths, --gradgate-cases files; the project's Python tests do not.
    """
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    invocation_dir = config.invocation_params.dir
    args = []
    names_builtin = selects_items = False
    for arg in config.args:
        builtin = _builtin_named_by(arg, invocation_dir)
        if builtin is not None:
            names_builtin = True
            rest = arg.split("::", 1)[1:]
            arg = "::".join([str(builtin)] + rest)
        case_file = _case_file_named_by(arg, invocation_dir, extra_files)
        if case_file is not None:
            arg = "::".join([str(case_file)] + arg.split("::", 1)[1:])
        selects_items = selects_items or "::" in arg
        args.append(arg)
    # keep paths the user named or the project's testpaths (gradgate_*.yaml are discovered
    # there); drop the bare invocation directory unless a project config says it is one,
    # so that `cd /tmp && pytest --gradgate` checks the built-in suite and nothing else
    keep = explicit or config.args_source == pytest.Config.ArgsSource.TESTPATHS or config.inipath is not None
    args = args if keep else []
    wanted = list(extra_files)
    if not (no_builtin or names_builtin or selects_items):
        wanted = [str(f) for f in BUILTIN_FILES if f.is_file()] + wanted
    named = {str((Path(invocation_dir) / a.split("::", 1)[0]).resolve()) for a in args}
    return args + [p for p in wanted if p not in named], not explicit
