"""Writing a file whole or not at all (imports nothing of the project: every layer uses it).

A results file is read while it is written (the bench reads ``summary.json`` of a running
cell; a resumed run reads what the killed one left), and several processes (Ray actors)
may write the same cache file at once.  So a file is written to a temporary file in the
same folder (``tempfile.mkstemp``: a name no other writer uses) and then renamed over its
target (``os.replace``: atomic on POSIX): a reader sees the old file or the new one, never
half of one.  The file gets the permissions a plain ``open`` would give it (mkstemp makes
0600); on any failure the temporary file is removed and the target left as it was.
Choice left open: ``fsync`` before the rename only where asked (checkpoints), not for the
files rewritten every round.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once, at import (os.umask can only be read by setting it)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], object], mode: str = "w",
                 fsync: bool = False) -> Path:
    """``write(fh)`` fills a temporary file that then replaces ``path``; text modes write
    with ``newline=""`` (csv's rule; no translation on POSIX)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, newline=None if "b" in mode else "") as fh:
            write(fh)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``path`` holds ``text`` whole (see :func:`atomic_write`)."""
    return atomic_write(path, lambda fh: fh.write(text))
