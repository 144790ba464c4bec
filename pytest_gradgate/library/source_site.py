"""Which function of the ggml tree under test holds a source line that ggml's abort named.

An abort inside a case's declared op (a fork's C function, which calls ggml's) names the file and
line of the assert (`ggml/src/ggml.c:2146: GGML_ASSERT(...) failed`) but not which of the ggml
functions the declared op reached holds it. The tree is on disk: the function is read from the
line upwards to its definition. ggml's C puts each definition's return type at column 0 and its
name before the first parenthesis on that line, which is what is looked for; a line that does not
sit in such a definition gives no name rather than a guess.
"""

import re
from pathlib import Path

_SITE = re.compile(r"((?:ggml/)?(?:src|include)/[\w./+-]+\.(?:c|cc|cpp|h)):(\d+)")
# a definition's first line: `static struct ggml_tensor * ggml_acc_impl(`, `void ggml_foo(int x) {`
_DEFINITION = re.compile(r"^(?!(?:if|for|while|switch|return|else|do)\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\(")
MAX_LINES_UP = 2000      # a function longer than this is not ggml's style: no name


def abort_site(text):
    """(path relative to the ggml root, line) of the first ggml source site in `text`, or None."""
    m = _SITE.search(text or "")
    if not m:
        return None
    path = m.group(1)
    return (path[len("ggml/"):] if path.startswith("ggml/") else path), int(m.group(2))


def enclosing_function(ggml_root, relative_path, line):
    """The name of the function whose body holds `line` of the file, or None."""
    try:
        lines = (Path(ggml_root) / relative_path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    if not 0 < line <= len(lines):
        return None
    for text in reversed(lines[max(0, line - MAX_LINES_UP):line]):
        if text.startswith("}"):       # the end of an earlier definition: the line is not in one
            return None
        m = _DEFINITION.match(text)
        if m and not text.rstrip().endswith(";"):
            return m.group(1)
    return None
