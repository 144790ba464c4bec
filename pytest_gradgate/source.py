"""Where the ggml under test comes from.

Order of precedence: --gradgate-ggml-src, then $GRADGATE_GGML_SRC, then the ini key
gradgate_ggml_src, then the pinned default: ggml 0.15.3 as vendored by the PyPI sdist
ggml-python==0.0.45, fetched once with pip into the user cache and checked by sha256.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_root, file_lock, new_staging_dir, publish, sweep_stale_staging
from .errors import SourceError

DEFAULT_DIST = "ggml-python"
DEFAULT_DIST_VERSION = "0.0.45"
DEFAULT_SDIST = "ggml_python-0.0.45.tar.gz"
DEFAULT_SDIST_SHA256 = "10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05"
DEFAULT_GGML_SUBDIR = "vendor/ggml"
DEFAULT_LABEL = f"default (ggml vendored by {DEFAULT_DIST}=={DEFAULT_DIST_VERSION})"


@dataclass(frozen=True)
class GgmlSource:
    root: Path      # the folder holding ggml's CMakeLists.txt, include/ggml.h and src/ggml.c
    label: str      # how the user named it, for headers and reports
    origin: str     # "option", "env", "ini" or "default"

    @property
    def version(self):
        return read_ggml_version(self.root)


def is_ggml_root(path):
    path = Path(path)
    return (path / "CMakeLists.txt").is_file() and (path / "include" / "ggml.h").is_file() \
        and (path / "src" / "ggml.c").is_file()


def ggml_root_of(path, named_by):
    """The ggml root inside a ggml checkout or a llama.cpp checkout, else a one-line error."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SourceError(f"{named_by}: ggml source '{path}' does not exist "
                          "(expected a ggml checkout or a llama.cpp checkout)")
    if is_ggml_root(path):
        return path.resolve()
    if is_ggml_root(path / "ggml"):
        return (path / "ggml").resolve()
    raise SourceError(f"{named_by}: '{path}' is neither a ggml checkout (include/ggml.h, src/ggml.c, "
                      "CMakeLists.txt) nor a llama.cpp checkout (ggml/ inside it)")


def read_ggml_version(root):
    """ggml's version as its CMakeLists.txt declares it, or 'unknown'."""
    try:
        text = (Path(root) / "CMakeLists.txt").read_text(errors="replace")
    except OSError:
        return "unknown"
    parts = [re.search(rf"set\(GGML_VERSION_{p}\s+(\d+)\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        return ".".join(m.group(1) for m in parts)
    return "unknown"


def resolve_source(option_value=None, ini_value=None, env=None):
    env = os.environ if env is None else env
    if option_value:
        return GgmlSource(ggml_root_of(option_value, "--gradgate-ggml-src"), str(option_value), "option")
    if env.get("GRADGATE_GGML_SRC"):
        value = env["GRADGATE_GGML_SRC"]
        return GgmlSource(ggml_root_of(value, "GRADGATE_GGML_SRC"), value, "env")
    if ini_value:
        return GgmlSource(ggml_root_of(ini_value, "ini gradgate_ggml_src"), str(ini_value), "ini")
    return GgmlSource(default_ggml_root(), DEFAULT_LABEL, "default")


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_ggml_root(progress=None):
    """The pinned default ggml tree, fetched and extracted on first use."""
    sources = cache_root() / "sources"
    final = sources / f"{DEFAULT_DIST}-{DEFAULT_DIST_VERSION}"
    root = final / "ggml"
    if is_ggml_root(root):
        return root
    with file_lock(sources / f"{final.name}.lock"):
        if is_ggml_root(root):
            return root
        sweep_stale_staging(sources, final.name)
        staging = new_staging_dir(final)
        try:
            if progress:
                progress(f"fetching {DEFAULT_DIST}=={DEFAULT_DIST_VERSION} (sdist) with pip")
            sdist = _pip_download_sdist(staging)
            actual = sha256_of(sdist)
            if actual != DEFAULT_SDIST_SHA256:
                raise SourceError(f"{sdist.name}: sha256 {actual} does not match the pinned "
                                  f"{DEFAULT_SDIST_SHA256}; refusing to build an unknown ggml")
            _extract_vendored_ggml(sdist, staging / "ggml")
            sdist.unlink()
            if final.exists():
                shutil.rmtree(final)
            publish(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return root


def _pip_download_sdist(dest):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), f"{DEFAULT_DIST}=={DEFAULT_DIST_VERSION}"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sdist = Path(dest) / DEFAULT_SDIST
    if proc.returncode != 0 or not sdist.is_file():
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        raise SourceError(f"could not fetch the default ggml ({' '.join(cmd[2:])}):\n{tail}\n"
                          "Give a local ggml or llama.cpp checkout with --gradgate-ggml-src PATH instead.")
    return sdist


def _extract_vendored_ggml(sdist, dest):
    prefix = f"{DEFAULT_SDIST[:-len('.tar.gz')]}/{DEFAULT_GGML_SUBDIR}/"
    dest = Path(dest)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix):]
            if not rel or rel.startswith("/") or ".." in Path(rel).parts:
                continue
            target = dest / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    if not is_ggml_root(dest):
        raise SourceError(f"{sdist.name} has no ggml tree under {DEFAULT_GGML_SUBDIR}/")
