"""Text from a user's input (a case's name or value, a file name, a path, a message that quotes
them) made safe to print: on a terminal, in a log, in pytest's report, and under GitHub Actions,
whose runner takes any output line that starts with `::` as a workflow command. A newline inside
a value would start such a line (`x\\n::error::...` an annotation of the user's making), so every
value that reaches output passes through `inline`, which leaves it one line with its control
characters written as escapes (`\\n`, `\\x1b`).
"""

import re

# C0 and C1 controls and Unicode's line and paragraph separators; a tab is left as it is
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match):
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def inline(text):
    """`text` as one printable line: every control character (newline included) as an escape."""
    return _CONTROL.sub(_escape, str(text))


def has_control(text):
    """Whether `text` holds a character that inline() would escape (a newline, an escape...)."""
    return _CONTROL.search(str(text)) is not None


def printable_lines(text):
    """Multi-line text of ours (which may quote a user's values): its newlines kept, every other
    control character escaped, so that a carriage return or a terminal escape cannot forge a line."""
    return "\n".join(inline(line) for line in str(text).split("\n"))
