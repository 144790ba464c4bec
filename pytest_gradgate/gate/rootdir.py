"""Keep the ggml tree under test from becoming pytest's rootdir and config.

pytest picks its rootdir and ini file from the command line's paths before any plugin is
loaded, so in `pytest --gradgate --gradgate-ggml-src ../llama.cpp` the option's value counts
as a test path. Its pyproject.toml then becomes the run's config (ini options, addopts), and
node ids are made relative to it. Written `--gradgate-ggml-src=PATH` it cannot happen.

Here, in the first hook that runs after our options are known, the choice is made again
from the arguments with our options' values taken out; when it differs, the run's rootdir,
ini file, ini values and addopts are replaced by those of that choice. pytest has no public
API for this: the attributes are set by name for each pytest version we support (7.4 to 9),
and if they cannot be, the user is told to write the option with `=`.
"""

import copy
import inspect

import pytest
from _pytest.config.findpaths import determine_setup


def without_option_values(config, parser, args):
    old_addopts = _ini_addopts(config)
    # pytest put the (wrong) ini file's addopts in front of the arguments
    base = args[len(old_addopts):] if old_addopts and args[:len(old_addopts)] == old_addopts else list(args)
    ns, unknown = parser.parse_known_and_unknown_args(list(base), namespace=copy.copy(config.option))
    chosen = _determine(config, ns, list(ns.file_or_dir) + list(unknown))
    rootpath, inipath, inicfg = chosen[:3]
    if rootpath == config.rootpath and inipath == config.inipath:
        return
    try:
        config._rootpath = rootpath
        config._inipath = inipath
        if hasattr(config, "_inicfg"):
            config._inicfg = inicfg
        else:
            config.inicfg = inicfg
        if len(chosen) > 3 and hasattr(config, "_ignored_config_files"):
            config._ignored_config_files = chosen[3]
        config._inicache.clear()
        parser.extra_info["rootdir"] = str(rootpath)
        parser.extra_info["inifile"] = str(inipath)
    except AttributeError as exc:
        raise pytest.UsageError(
            f"gradgate: pytest took the value of a --gradgate-* path option for a test path and chose its rootdir "
            f"from it, and this pytest does not let that be undone ({exc}); write the option with '=', e.g. "
            "--gradgate-ggml-src=PATH") from None
    args[:] = (_ini_addopts(config) if old_addopts is not None else []) + base
    known = parser.parse_known_args(list(args), namespace=copy.copy(config.option))
    if ns.confcutdir is None:
        known.confcutdir = str(inipath.parent if inipath is not None else rootpath)
    config.known_args_namespace = known


def _ini_addopts(config):
    try:
        return list(config.getini("addopts"))
    except (ValueError, KeyError):
        return None


def _determine(config, ns, positional):
    wanted = {"inifile": ns.inifilename, "args": positional, "rootdir_cmd_arg": ns.rootdir or None,
              "invocation_dir": config.invocation_params.dir, "override_ini": ns.override_ini, "config": config}
    accepted = inspect.signature(determine_setup).parameters
    return determine_setup(**{k: v for k, v in wanted.items() if k in accepted})
