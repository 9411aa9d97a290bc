"""A run's id (its folder's name) and the versions a run records."""

from __future__ import annotations

import platform
import secrets
import time
from pathlib import Path

from kerngen.problems.ref import ProblemRef
from kerngen.version import __version__

__all__ = ["new_run_id", "versions"]


def new_run_id(problem: ProblemRef, now: float | None = None) -> str:
    """Like ``20261122-153000-softmax-ab12``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    slug = Path(problem.source).stem if problem.source.endswith(".py") else problem.source
    slug = "".join(c if c.isalnum() or c in "_-" else "-" for c in slug.lower()).strip("-")[:40] or "problem"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


def versions() -> dict[str, str]:
    out = {"kerngen": __version__, "python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
    except Exception:  # noqa: BLE001 - a version we cannot read is only a missing fact
        out["torch"] = "unavailable"
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        out["nvrtc"] = f"{major}.{minor}"
    except Exception:  # noqa: BLE001
        out["nvrtc"] = "unavailable"
    return out
