"""ggml's own gradient checker, test-backend-ops, as a reference to compare against.

Builds tests/test-backend-ops from a ggml tree with CMake (cached by content in the user
cache, like our own builds), runs `test-backend-ops grad -b CPU -o OP` one op at a time
(a whole run aborts at the first op without a backward) and parses its per-case lines.
`to_case` translates the cases we can reproduce exactly (same op, shapes, init range, eps,
stencil, SUM loss, no consumer) into our Cases, so the bench and the tests can run both
on the same work.

test-backend-ops prints an MAA only when a case fails. The copy we build gets one extra
line, printed only when GRADGATE_REPORT_MAA is set: the MAA of every param of every case
(our code, inserted at a one-line anchor, like variants.py does). Without that variable
the binary behaves exactly as upstream's, which is what the bench times.
"""

import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
import sys
from pathlib import Path

from pytest_gradgate.library.cache import cache_root, make_entry
from pytest_gradgate.library.cmake import (GGML_BUILD_INPUTS, build_tool_args, compiler_identity, failed_build,
                                         require_cmake, run_logged)
from pytest_gradgate.library.source import copy_tree
from pytest_gradgate.library.tree_digest import tree_digest
from pytest_gradgate.declare.case import Case
from pytest_gradgate.errors import BuildError
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # ggml_variants: patched ggml copies
from ggml_variants import insert_before  # noqa: E402

BINARY = "test-backend-ops"
SOURCE = Path("tests") / "test-backend-ops.cpp"
REPORT_ENV = "GRADGATE_REPORT_MAA"
MAA_TAG = "gradgate-maa"
# after test-backend-ops computes a param's MAA, before it compares it with the limit
MAA_ANCHOR = "            if (err > max_maa_err()) {\n"
MAA_REPORT = ('            if (getenv("' + REPORT_ENV + '")) { // added by pytest-gradgate: MAA of passing cases too\n'
              '                printf("' + MAA_TAG + ' %s %.9g\\n", t->name, err);\n'
              '            }\n')
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_BUILD_TESTS=ON", "-DGGML_BUILD_EXAMPLES=OFF",
              "-DBUILD_SHARED_LIBS=OFF")


# -- build ------------------------------------------------------------------------------------
def has_reference_source(ggml_root):
    return (Path(ggml_root) / SOURCE).is_file() and (Path(ggml_root) / "tests" / "CMakeLists.txt").is_file()


def reference_key(ggml_root):
    digest = hashlib.sha256()
    digest.update(tree_digest(ggml_root, GGML_BUILD_INPUTS + ("tests/CMakeLists.txt", str(SOURCE))).encode())
    digest.update(MAA_REPORT.encode() + json.dumps(CMAKE_ARGS).encode() + compiler_identity().encode())
    return digest.hexdigest()[:24]


def references_dir():
    return cache_root() / "reference"


@dataclass
class ReferenceBuild:
    binary: Path
    key: str
    cached: bool
    build_seconds: float


def find_reference(ggml_root):
    key = reference_key(ggml_root)
    entry = references_dir() / key
    return ReferenceBuild(entry / BINARY, key, True, _info(entry).get("build_seconds", 0.0)) \
        if (entry / BINARY).is_file() else None


def _info(entry):
    try:
        return json.loads((entry / "build-info.json").read_text())
    except (OSError, ValueError):
        return {}


def ensure_reference(ggml_root, progress=None):
    """test-backend-ops built from ggml_root (a copy of it, with the MAA report added)."""
    ggml_root = Path(ggml_root)
    if not has_reference_source(ggml_root):
        raise BuildError(f"{ggml_root} has no {SOURCE}: test-backend-ops can only be built from a ggml tree "
                         "that keeps its tests/ folder (a ggml or llama.cpp checkout, or the default ggml)")
    found = find_reference(ggml_root)
    if found:
        return found
    key = reference_key(ggml_root)
    entry = references_dir() / key
    started = time.time()

    def produce(staging):
        _build_into(ggml_root, staging, progress)
        info = {"ggml_root": str(ggml_root), "key": key, "build_seconds": round(time.time() - started, 1),
                "compiler": compiler_identity(), "cmake_args": list(CMAKE_ARGS)}
        (staging / "build-info.json").write_text(json.dumps(info, indent=2))

    if not make_entry(entry, lambda e: find_reference(ggml_root) is not None, produce):
        return find_reference(ggml_root)
    return ReferenceBuild(entry / BINARY, key, False, round(time.time() - started, 1))


def _build_into(ggml_root, staging, progress):
    require_cmake()
    src = copy_tree(ggml_root, staging / "src")
    insert_before(src / SOURCE, MAA_ANCHOR, MAA_REPORT)
    work = staging / "work"
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", str(staging))   # ccache hits across staging folders
    log_path = staging / "build.log"
    with open(log_path, "wb") as log:
        cmd = ["cmake", "-S", str(src), "-B", str(work)] + build_tool_args() + list(CMAKE_ARGS)
        if run_logged(cmd, log, progress, "configuring test-backend-ops", env) != 0:
            raise failed_build("configure (test-backend-ops)", log_path, ggml_root)
        cmd = ["cmake", "--build", str(work), "--target", BINARY, "--parallel", str(os.cpu_count() or 2)]
        if run_logged(cmd, log, progress, "building test-backend-ops", env) != 0:
            raise failed_build("build (test-backend-ops)", log_path, ggml_root)
    built = next((p for p in work.rglob(BINARY) if p.is_file() and os.access(p, os.X_OK)), None)
    if built is None:
        raise failed_build("build (no test-backend-ops produced)", log_path, ggml_root)
    shutil.copy2(built, staging / BINARY)
    shutil.rmtree(work)
    shutil.rmtree(src)


# -- run and parse ----------------------------------------------------------------------------
@dataclass
class RefCase:
    """One test-backend-ops grad case as it reported it."""
    op: str                  # op of the graph's output, as its first line names it (SQR, MUL_MAT, SILU, ...)
    vars: str                # its parameter string: type=f32,ne=[10,5,4,3]
    status: str              # ok, fail, not_supported, skipped_large, crashed
    maa: dict = field(default_factory=dict)   # param name -> MAA (all params with the report; failures always)
    detail: str = ""         # not-supported reason, failure text, crash message

    @property
    def id(self):
        return f"{self.op}({self.vars})"

    @property
    def worst_maa(self):
        values = list(self.maa.values())
        if not values:
            return None
        return float("nan") if any(math.isnan(v) for v in values) else max(values)


@dataclass
class RefRun:
    op: str
    cases: list
    returncode: int
    signal: str = None
    wall_s: float = 0.0
    stderr_tail: str = ""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"^  ([A-Z0-9_]+)\((.*)\): (.*)$")
_FAIL_MAA = re.compile(r"\[[A-Z0-9_]+\] MAA = (\S+) > (\S+)")


def parse_grad_output(text):
    """Per-case results from `test-backend-ops grad` console output.

    Each case prints a first line `  OP(vars): OK` when it starts and a last line with the
    same vars when it ends (OK, FAIL, or `skipping large tensors`; the op named there is
    the SUM put behind non-scalar outputs); a case that is not supported prints one line.
    A case left open when the output ends is the one the process died in."""
    cases, pending = [], None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if line.startswith(MAA_TAG + " ") and pending is not None:
            parts = line.split()
            if len(parts) >= 3:
                pending.maa[parts[1]] = float(parts[2])
            continue
        m = _LINE.match(line)
        if not m:
            continue
        op, vars_, rest = m.groups()
        if pending is not None and vars_ == pending.vars:
            fail = _FAIL_MAA.search(rest)
            if rest.startswith("skipping large tensors"):
                pending.status = "skipped_large"
            elif "compare failed" in rest:
                pending.status = "fail"
            elif fail or "nonfinite gradient" in rest:   # a detail line; "compare failed" follows
                pending.status = "fail"
                if fail:
                    pending.maa.setdefault("*", float(fail.group(1)))
                pending.detail = _ANSI.sub("", rest).replace("FAIL", "").strip()
                continue
            else:
                pending.status = "ok" if rest.endswith("OK") else "fail"
            cases.append(pending)
            pending = None
            continue
        if pending is not None:   # a new case started without the last one ending: should not happen
            pending.status, pending.detail = "crashed", "no end line"
            cases.append(pending)
            pending = None
        if rest.startswith("not supported"):
            cases.append(RefCase(op, vars_, "not_supported", detail=rest[len("not supported"):].strip(" []")))
        else:
            pending = RefCase(op, vars_, "running")
    if pending is not None:
        pending.status = "crashed"
        cases.append(pending)
    return cases


def run_grad(binary, op, backend="CPU", params=None, timeout=600, report_maa=True):
    """Run `test-backend-ops grad -b BACKEND -o OP [-p PARAMS]`; never raises for a crash."""
    cmd = [str(binary), "grad", "-b", backend, "-o", op]
    if params:
        cmd += ["-p", params]
    env = dict(os.environ)
    env.setdefault("GGML_NO_BACKTRACE", "1")
    if report_maa:
        env[REPORT_ENV] = "1"
    else:
        env.pop(REPORT_ENV, None)
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace")
        return RefRun(op, parse_grad_output(out), -1, "timeout", time.perf_counter() - started, "")
    wall = time.perf_counter() - started
    cases = parse_grad_output(proc.stdout.decode(errors="replace"))
    stderr = proc.stderr.decode(errors="replace")
    sig = signal.Signals(-proc.returncode).name if proc.returncode < 0 else None
    for c in cases:
        if c.status == "crashed":
            c.detail = _crash_message(stderr) or (sig or f"exit code {proc.returncode}")
    return RefRun(op, cases, proc.returncode, sig, wall, stderr[-2000:])


_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


def params_regex(vars_list):
    """A -p filter (std::regex, ECMAScript) matching exactly these vars strings."""
    return "^(" + "|".join(_REGEX_SPECIAL.sub(r"\\\1", v) for v in vars_list) + ")$"


def rerun_statuses(binary, ref, times, timeout=300):
    """The statuses of `times` fresh test-backend-ops runs of one case. Each run draws new
    inputs (std::random_device), so a verdict that flips between runs depends on the draw,
    not on the op's backward."""
    statuses = []
    for _ in range(times):
        run = run_grad(binary, ref.op, params=params_regex([ref.vars]), timeout=timeout)
        statuses += [c.status for c in run.cases if c.vars == ref.vars]
    return statuses


def _crash_message(stderr):
    for line in stderr.splitlines():
        if "GGML_ASSERT" in line or "GGML_ABORT" in line or ": error:" in line or "fatal error" in line:
            return line.strip()
    return ""


# -- translation into our Cases ---------------------------------------------------------------
def parse_vars(text):
    """`type=f32,ne=[10,5,4,3],v=0` -> {"type": "f32", "ne": [10, 5, 4, 3], "v": 0}."""
    out, depth, key, buf = {}, 0, None, ""
    for ch in text + ",":
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "=" and depth == 0 and key is None:
            key, buf = buf, ""
            continue
        if ch == "," and depth == 0:
            if key is not None:
                out[key] = _value(buf)
            elif buf:
                out[buf] = True      # a bare flag, e.g. GLU's ",split"
            key, buf = None, ""
            continue
        buf += ch
    return out


def _value(text):
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_value(x) for x in text[1:-1].split(",") if x.strip()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _n(ne):
    return math.prod(ne)


def _unary(name, eps=15.0, init=(-150.0, 150.0)):
    def make(v):
        if v.get("v", 0) != 0:
            return None
        return dict(graph=f"{name}(a)", params={"a": v["ne_a"]}, init={"a": list(init)}, eps=eps, stencil=2)
    return make


def _simple(name, eps=0.1, stencil=2, init=(-1.0, 1.0), max_maa=1e-4):
    def make(v):
        e = eps(v["ne"]) if callable(eps) else eps
        return dict(graph=f"{name}(a)", params={"a": v["ne"]}, init={"a": list(init)}, eps=e, stencil=stencil,
                    max_maa=max_maa)
    return make


def _sum(v):
    if "permute" in v:
        return dict(graph=f"sum(permute(a, axes={v['permute']}))", params={"a": v["ne"]},
                    init={"a": [-0.9, 1.1]}, eps=0.1 * math.sqrt(_n(v["ne"])), stencil=2)
    return _simple("sum", eps=lambda ne: 0.1 * math.sqrt(_n(ne)), init=(-0.9, 1.1))(v)


def _sum_rows(v):
    if v.get("permute") or v.get("slice"):
        return None
    return _simple("sum_rows")(v)


def _scale(v):
    if v.get("bias", 0) != 0 or v.get("inplace"):
        return None
    return dict(graph=f"scale(a, s={float(v['scale'])})", params={"a": v["ne"]}, init={"a": [-1.0, 1.0]},
                eps=0.1, stencil=2)


def _add(v):
    if any(x != 1 for x in v["nr"]) or v.get("nf", 1) != 1 or v.get("perm1") or v.get("src_overlap"):
        return None
    return dict(graph="add(a, b)", params={"a": v["ne"], "b": v["ne"]}, eps=0.1, stencil=2)


def _rms_norm(v):
    if v.get("v") or v.get("inplace"):
        return None
    return dict(graph=f"rms_norm(a, eps={float(v['eps'])})", params={"a": v["ne"]}, init={"a": [-10.0, 10.0]},
                eps=1.0, stencil=4)


def _soft_max(v):
    if v.get("mask") or v.get("sinks") or v.get("nr23", [1, 1]) != [1, 1] or v.get("max_bias", 0) != 0 \
            or v.get("inplace"):
        return None
    return dict(graph=f"soft_max_ext(a, scale={float(v['scale'])})", params={"a": v["ne"]}, eps=0.1, stencil=4)


def _repeat(v):
    target = [n * r for n, r in zip(v["ne"], v["nr"])]
    return dict(graph=f"repeat(src, shape={target})", params={"src": v["ne"]}, eps=0.1, stencil=2)


def _dup(v):
    if "permute" in v:
        return None
    return dict(graph="dup(src)", params={"src": v["ne"]}, eps=0.1, stencil=2)


def _cont(v):
    if v.get("use_view_slice"):
        return None
    return dict(graph="cont(transpose(src))", params={"src": v["ne"]}, eps=0.1, stencil=2)


def _mul_mat(v):
    if v.get("type_a") != "f32" or v.get("type_b") != "f32" or v.get("per") != [0, 1, 2, 3] \
            or v.get("k_v", 0) != 0 or v.get("o", 1) != 1:
        return None
    m, n, k, bs, nr = v["m"], v["n"], v["k"], v["bs"], v["nr"]
    a = [k, m, bs[0], bs[1]]
    b = [k, n, bs[0] * nr[0], bs[1] * nr[1]]
    if bs[1] == 1 and nr[1] == 1:
        return dict(graph="mul_mat(a, b)", params={"a": a, "b": b}, eps=0.1, stencil=2)
    return dict(graph="mul_mat(a, b)", params={"b": b}, inputs={"a": {"type": "f32", "shape": a}},
                eps=0.1, stencil=2)


def _glu_split(name):
    def make(v):
        if not v.get("split") or v.get("v", 0) != 0:
            return None
        return dict(graph=f"{name}_split(a, b)", params={"a": v["ne_a"], "b": v["ne_a"]},
                    init={"a": [-150.0, 150.0], "b": [-150.0, 150.0]}, eps=0.1, stencil=2)
    return make


# op as test-backend-ops' first line names it -> vars -> Case fields (None: not reproducible)
TRANSLATORS = {
    "SQR": _simple("sqr", eps=lambda ne: 0.1 * 0.25 * _n(ne)),
    "SQRT": _simple("sqrt", eps=20.0, stencil=4, init=(50.0, 100.0)),
    "LOG": _simple("log", stencil=4, init=(0.9, 1.1)),
    "SIN": _simple("sin", eps=0.2, stencil=4, init=(-6.5, 6.5), max_maa=1e-3),
    "COS": _simple("cos", eps=0.2, stencil=4, init=(-6.5, 6.5), max_maa=1e-3),
    "SUM": _sum,
    "SUM_ROWS": _sum_rows,
    "MEAN": _simple("mean", eps=lambda ne: 0.1 * _n(ne), init=(-0.9, 1.1)),
    "SCALE": _scale,
    "ADD": _add,
    "RMS_NORM": _rms_norm,
    "SOFT_MAX": _soft_max,
    "REPEAT": _repeat,
    "DUP": _dup,
    "CONT": _cont,
    "MUL_MAT": _mul_mat,
    "NEG": _unary("neg"),
    "SILU": _unary("silu"),
    "EXPM1": _unary("expm1"),
    "SOFTPLUS": _unary("softplus"),
    "SWIGLU": _glu_split("swiglu"),
    "GEGLU": _glu_split("geglu"),
}


def to_case(ref, seed=0):
    """Our Case doing the same work as a test-backend-ops grad case, or None."""
    make = TRANSLATORS.get(ref.op)
    if make is None:
        return None
    v = parse_vars(ref.vars)
    if v.get("type", v.get("type_a", "f32")) != "f32":
        return None
    try:
        fields = make(v)
    except (KeyError, TypeError, IndexError):
        return None   # a vars layout this translator does not know (another ggml version)
    if fields is None:
        return None
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", f"tbo_{ref.op}_{ref.vars}").strip("_")[:120]
    # memory of its own only: test-backend-ops allocates every tensor apart, so the allocation
    # regimes (an alias, ggml-opt's accumulation) are what it cannot see, not a verdict to compare
    return Case(name=name, consumer="none", loss="sum", seed=seed, alloc="own", **fields)


# -- comparing verdicts and MAAs --------------------------------------------------------------
MAA_ORDERS = 1.5            # "same order": within 10^1.5 of each other ...
# ... or both below 10% of the limit, where MAA is float noise (test-backend-ops draws its
# inputs from std::random_device). Only used where a case fails; see agreement().
NOISE_FLOOR = 1e-1
BORDERLINE = 3.0            # test-backend-ops' fixed 1e-4 limit fails correct cases by float noise up to ~3x


def comparable(ref):
    """A case both sides can judge: it ran to a verdict with a finite MAA (test-backend-ops
    passes NaN MAAs, where every gradient element is 0/0) and we can reproduce it."""
    return ref.status in ("ok", "fail") and ref.worst_maa is not None and math.isfinite(ref.worst_maa) \
        and to_case(ref) is not None


def agreement(ref, result):
    """(same_verdict, same_order, why) for a reference case and our Result on its Case."""
    ours_pass = result.status == "passed"
    theirs_pass = ref.status == "ok"
    limit = to_case(ref).max_maa
    same_verdict = ours_pass == theirs_pass
    why = ""
    if not same_verdict and ours_pass and ref.worst_maa <= BORDERLINE * limit:
        # test-backend-ops' known false alarm: a correct op just over its fixed limit by roundoff;
        # our limit adds what the numeric error explains (metrics.py)
        same_verdict, why = True, f"borderline: test-backend-ops MAA {ref.worst_maa:.3g} within {BORDERLINE}x its limit"
    ours, theirs = result.maa, ref.worst_maa
    if ours is None or not math.isfinite(ours):
        return same_verdict, False, why or "our MAA is not finite"
    if ours_pass and same_verdict:
        # two passing (or borderline) MAAs are float noise of different random inputs (test-backend-ops seeds from
        # std::random_device; seen: SIN 3.9e-6 here, 1.3e-4 in one of its runs): "same order" then
        # means both stay within what a correct op shows, not a ratio of two noise values
        return same_verdict, max(ours, theirs) <= BORDERLINE * limit, why
    floor = NOISE_FLOOR * limit
    same_order = (ours <= floor and theirs <= floor) or \
        (ours > 0 and theirs > 0 and abs(math.log10(ours / theirs)) <= MAA_ORDERS)
    return same_verdict, same_order, why
