"""Writing a file so that a reader sees the old text or the new, never half of one."""

import os
import tempfile
from pathlib import Path


def write_atomically(path, text):
    """Write `text` to a temporary sibling, then rename it into place; a failure leaves
    neither a partial file nor the temporary one behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own: two runs writing one path at once must not rename each other's file
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(staging)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)        # mkstemp makes it private; a report or a baseline is for sharing
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
