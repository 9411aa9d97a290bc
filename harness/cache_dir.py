"""Where kerngen keeps what it learns on a machine: compiled cubins, tuning results, the GPU's
measured ceilings. ``$KERNGEN_CACHE_DIR`` or ``~/.cache/kerngen``; each cache has its subfolder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("KERNGEN_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kerngen"
