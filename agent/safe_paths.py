"""Names and paths that come from a journal or an export manifest.

A run folder or an export folder may come from someone else (this repository ships ``runs/``), so
every name taken from one is checked before it becomes part of a path:

* :func:`check_name`: a run id, an op name or a file name is ONE path component: not empty, not
  ``.`` or ``..``, no ``/`` or ``\\``, no NUL or other control character, at most 200 characters.
  A run id of ``../../x``, ``/etc`` or ``a\\x00b`` is refused.
* :func:`inside`: ``folder/name`` with ``name`` checked, refused unless the path, symlinks
  resolved, is still inside ``folder``; so a manifest cannot make ``kerngen.load`` read
  ``/proc/self/environ`` and an export cannot write outside ``--out``.
* :func:`regular_file`: a file to read must be a regular file of bounded size (not a FIFO that
  blocks, not ``/dev/zero``).
"""

from __future__ import annotations

import re
from pathlib import Path

from kerngen.errors import KerngenError

MAX_NAME = 200
_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")


class UnsafePathError(KerngenError):
    """A name from a journal or a manifest would leave its folder (or is not a plain name)."""


def shown(value: object, width: int = 60) -> str:
    """A short, printable spelling of an untrusted value for an error message."""
    text = value if isinstance(value, str) else str(value)
    return repr(text[:width] + ("..." if len(text) > width else ""))


def name_problem(value: object) -> str | None:
    """Why ``value`` is not a plain one-component name, or None when it is one."""
    if not isinstance(value, str):
        return "is not a string"
    if not value:
        return "is empty"
    if value in (".", ".."):
        return "is a relative folder"
    if _BAD.search(value):
        return "holds a path separator or a control character"
    if len(value) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    return None


def check_name(value: object, what: str = "name") -> str:
    """``value`` if it is a plain one-component name, else :class:`UnsafePathError`."""
    why = name_problem(value)
    if why is not None:
        raise UnsafePathError(f"{what} {shown(value)} {why}: refused (a name must stay inside its folder)")
    return value  # type: ignore[return-value]


def inside(folder: str | Path, name: str, what: str = "file") -> Path:
    """``folder/name``, refused unless ``name`` is a plain name and the path, with every symlink
    resolved, is inside ``folder`` (itself resolved)."""
    check_name(name, what)
    base = Path(folder).resolve()
    path = Path(folder) / name
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a bad byte
        raise UnsafePathError(f"{what} {shown(name)} in {folder}: cannot be resolved ({exc})") from None
    if real != base and base not in real.parents:
        raise UnsafePathError(f"{what} {shown(name)} in {folder} leads outside that folder (to {real}): refused")
    return path


def regular_file(path: Path, what: str = "file", max_bytes: int = 64 << 20) -> Path:
    """``path`` if it is a regular file (symlinks followed) of at most ``max_bytes``."""
    try:
        st = path.stat()
    except (OSError, ValueError) as exc:
        raise UnsafePathError(f"{what} {path}: cannot be read ({exc})") from None
    import stat

    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{what} {path} is not a regular file: refused")
    if st.st_size > max_bytes:
        raise UnsafePathError(f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} allowed")
    return path


RUN_FILES = ("events.jsonl", "tree.json", "best", "best/spec.json", "best/figures.json", "best/figures.md")


def refuse_symlinks(run_dir: str | Path, names: tuple[str, ...] = RUN_FILES) -> None:
    """Before writing into a run folder (a resume): none of what a search writes there may be a
    symbolic link, which would carry the writes out of the folder."""
    for name in names:
        p = Path(run_dir) / name
        if p.is_symlink():
            raise UnsafePathError(f"run folder {run_dir}: {name} is a symbolic link; refusing to write through it")


__all__ = ["RUN_FILES", "UnsafePathError", "check_name", "inside", "name_problem", "refuse_symlinks",
           "regular_file", "shown"]
