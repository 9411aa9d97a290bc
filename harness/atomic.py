"""Write a file so that a reader (or a kill -9 mid-write) sees the old or the new content, never a
mix: a unique temporary file beside the target, fsync, then ``os.replace``.

The file gets the mode an ordinary ``open(path, "w")`` would give it (``0o666`` less the umask):
``mkstemp`` creates its temporary file 0600, which would otherwise make every report, export and
spec private under a umask of 022."""

from __future__ import annotations

import functools
import os
import tempfile
import threading
from pathlib import Path

_UMASK_LOCK = threading.Lock()


@functools.cache
def process_umask() -> int:
    """The process's umask, read once. Linux says it in /proc/self/status (no change to the
    process); elsewhere it is set and put back at once, under a lock, the first time only."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask & 0o777


def file_mode() -> int:
    """The mode of a new regular file: 0o666 less the umask."""
    return 0o666 & ~process_umask()


def write_atomic(path: str | Path, data: str | bytes) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            if hasattr(os, "fchmod"):  # mkstemp's 0600 -> what open() would have made
                os.fchmod(fh.fileno(), file_mode())
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
