"""kerngen's version (one place: the package, the journal and exports read it), and a digest of
its source (what a cache of results this code computed is keyed on)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

__version__ = "0.1.0"

# the import packages whose files make up kerngen (the repository's folders: kerngen/, agent/, ...)
_PACKAGES = ("kerngen", "kerngen.agent", "kerngen.harness", "kerngen.problems", "kerngen.prompts")
_SOURCE = (".py", ".j2", ".yaml", ".json", ".cpp", ".h")


@functools.cache
def source_hash() -> str:
    """A digest of every source file and template of kerngen as installed: any change to its code
    gives another one (a version number does not move between commits). Read once per process."""
    h = hashlib.sha256(__version__.encode())
    roots = []
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in sorted(set(roots)):
        for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE and "__pycache__" not in p.parts):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
