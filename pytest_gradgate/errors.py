"""Exceptions a user can act on: each message says what, where, and what to do."""


class GradgateError(Exception):
    """Base for every error pytest-gradgate reports without a Python traceback."""


class UsageError(GradgateError):
    """The command line asked for something that cannot be: a bad argument or path (exit 2)."""


class SourceError(GradgateError):
    """The ggml source could not be found, fetched or recognised."""


class BuildError(GradgateError):
    """CMake failed to configure or build the native library."""

    def __init__(self, message, log_path=None, log_tail=""):
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail

    def __str__(self):
        text = super().__str__()
        if self.log_tail:
            text += "\n--- last lines of the build log ---\n" + self.log_tail
        if self.log_path:
            text += f"\n(full log: {self.log_path})"
        return text


class CaseError(GradgateError):
    """A case declaration is invalid; carries where it was declared (and, for an error in a
    multi-line graph, which of its lines: the loader maps that to the file's line)."""

    def __init__(self, message, path=None, line=None, graph_line=None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.graph_line = graph_line

    def __str__(self):
        where = ""
        if self.path is not None:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        # one line, whatever a name or value it quotes holds (printable.py)
        from pytest_gradgate.printable import inline
        return inline(where + super().__str__())
