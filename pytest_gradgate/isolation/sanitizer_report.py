"""A sanitizer's report, read from a dead case's stderr: what kind of error, and where in ggml.

A build made with --gradgate-sanitize (library/sanitizer.py) ends a case's process at the first
error the sanitizer sees, after printing its report. The report names the error and the stack of
the thread that made it, innermost frame first; the innermost frames are often the sanitizer's
own (a memcpy interceptor) and the outermost are Python's, so the frame worth naming is the first
one in the built library that is ggml's, not our shim's.

Every frame carries its module (library/sanitizer.py's STACK_FRAME_FORMAT asks for it): "in the
library" is then a fact of the report, not a guess from a source path, which for a tree built
without ccache is wherever the user's checkout lies (and CPython's own frames have files and lines
too, where it was built with debug information).
"""

import os
import re
from dataclasses import dataclass

SHIM_SOURCE = "gradgate_shim.c"

# "==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x... at pc ...", "... SEGV on unknown
# address ...", "... attempting double-free on 0x... in thread T0:": the error is what comes before " on "
_ASAN_HEADER = re.compile(r"^==\d+==ERROR: (AddressSanitizer): (.+?)(?= on | \(|:?$)", re.M)
# "WRITE of size 4 at 0x602000000018 thread T0", or for a SEGV "The signal is caused by a WRITE memory access."
_ASAN_ACCESS = re.compile(r"^(READ|WRITE) of size (\d+) at ", re.M)
_ASAN_SIGNAL_ACCESS = re.compile(r"^==\d+==The signal is caused by a (READ|WRITE) memory access", re.M)
# "src/ggml-cpu/ops.cpp:123:45: runtime error: load of misaligned address ..."
_UBSAN_HEADER = re.compile(r"^(\S+?):(\d+):(?:\d+:)? runtime error: (.+)$", re.M)
# a frame as STACK_FRAME_FORMAT writes it: number, pc, "in function", file:line (or module+offset
# where there is no debug information), the module in braces
_FRAME = re.compile(r"^\s*#(\d+) 0x[0-9a-fA-F]+ (.*?)\s*\{(.*)\}\s*$")
_LOCATION = re.compile(r"^(.*) (\S+?):(\d+)(?::\d+)?$")
_OFFSET_IN_MODULE = re.compile(r"\s*\([^()]*\+0x[0-9a-fA-F]+\)$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str       # as the reports show ggml's paths: ggml/src/..., for a tree built through SOURCE_LINK
    line: int

    def __str__(self):
        return f"{self.function} at {self.file}:{self.line}"


@dataclass(frozen=True)
class SanitizerReport:
    tool: str           # AddressSanitizer, UndefinedBehaviorSanitizer
    error: str          # heap-buffer-overflow WRITE of size 4, SEGV on a READ, runtime error: ...
    frame: Frame = None  # the first frame of the report's stack inside ggml, if any

    def text(self):
        """One line for the item's failure: the tool, the error, where in ggml."""
        where = f" in {self.frame}" if self.frame else " (no frame of the report's stack is in ggml)"
        return f"{self.tool}: {self.error}{where}"


def report_start(text):
    """Offset of the first sanitizer report in `text`, or -1."""
    starts = [m.start() for m in (_ASAN_HEADER.search(text), _UBSAN_HEADER.search(text)) if m]
    return min(starts) if starts else -1


def parse(stderr):
    """The first sanitizer report in `stderr`, or None."""
    text = stderr or ""
    start = report_start(text)
    if start < 0:
        return None
    text = text[start:]
    asan = _ASAN_HEADER.match(text)
    if asan:
        tool, error = asan.group(1), asan.group(2)
        access = _ASAN_ACCESS.search(text)
        if access:
            error += f" {access.group(1)} of size {access.group(2)}"
        else:
            signal_access = _ASAN_SIGNAL_ACCESS.search(text)
            if signal_access:
                error += f" on a {signal_access.group(1)}"
    else:
        ubsan = _UBSAN_HEADER.match(text)
        tool, error = "UndefinedBehaviorSanitizer", f"runtime error: {ubsan.group(3).strip()}"
    return SanitizerReport(tool, error, first_ggml_frame(first_stack(text)))


def first_stack(text):
    """The frame lines of the report's first stack: the thread that made the error."""
    frames, started = [], False
    for line in text.splitlines():
        if _FRAME.match(line):
            frames.append(line)
            started = True
        elif started:
            break
    return frames


def first_ggml_frame(lines):
    """The first frame in the built library whose source is not our shim, as a Frame."""
    # here, not at the top: every worker imports this module, and only a report needs the build's names
    from pytest_gradgate.library.cmake import LIBRARY_NAME
    for line in lines:
        m = _FRAME.match(line)
        described, module = m.group(2), m.group(3)
        if os.path.basename(module.strip()) != LIBRARY_NAME:
            continue
        where = _LOCATION.match(described)
        if not where:        # no debug information for this frame: nothing to name
            continue
        function, path, line_no = where.groups()
        if os.path.basename(path) == SHIM_SOURCE:
            continue
        return Frame(_function_name(function), ggml_path(path), int(line_no))
    return None


def _function_name(described):
    """"in ggml_compute_forward_add(ggml_compute_params const*, ggml_tensor*)" -> its name alone."""
    name = described[3:] if described.startswith("in ") else described
    name = _OFFSET_IN_MODULE.sub("", name)
    return name.split("(", 1)[0] if not name.startswith("(") else name


def ggml_path(path):
    """A source path of the report as ggml's own abort lines name it: a build that reached the
    tree through the staging folder's link (library/cmake.py SOURCE_LINK) compiled it under a
    relative path through that link, which is read here as ggml/..."""
    from pytest_gradgate.library.cmake import SOURCE_LINK
    path = os.path.normpath(path)
    return re.sub(r"^(?:.*/)?" + re.escape(SOURCE_LINK) + "/", "ggml/", path)
