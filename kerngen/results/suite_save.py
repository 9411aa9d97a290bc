"""``kerngen suite --save FILE``: a suite that outlasts one sitting.

KernelBench at its own sizes takes 5-15 s a problem (the reference, its torch.compile, the kernel,
each timed), so a whole level does not fit one sitting of a lent GPU. With ``--save`` every measured
problem lands in FILE as it is done (written whole and atomically: a kill leaves the previous
version); the same command again measures only what FILE lacks, and the table and metrics cover
every problem given.

A saved measurement is reused only for the same problem (its resolved path or built-in name, shape
and dtype), the same kernel (spec content hash and configuration) and the same time budget, and
only on a GPU of the same model: FILE names its GPU, and another GPU's FILE is refused, never mixed
in (a time means something on one model only). Problems without a kernel are never saved: why they
have none is read from the runs each time.

FILE is untrusted input like a run folder: it is parsed into typed records, and anything else is a
one-line :class:`SuiteSaveError`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from kerngen.errors import KerngenError
from kerngen.harness.atomic import write_atomic
from kerngen.results.suite import SuiteEntry
from kerngen.results.suite_runs import FoundKernel, problem_key
from kerngen.text import one_line

__all__ = ["SuiteSaveError", "SavedMeasurement", "SuiteSave", "SaveFile"]

FORMAT = "kerngen-suite/1"
MAX_BYTES = 64 * 1024 * 1024  # far above a 250-problem suite (~2 MB); a larger file is refused unread


class SuiteSaveError(KerngenError):
    """A --save file that cannot be used: unreadable, not a suite file, or another GPU's."""


class SavedMeasurement(BaseModel):
    """One measured problem and what it was measured with."""

    key: str  # problem_key of the problem + its shape and dtype (see _identity)
    kernel_hash: str  # the spec's content hash
    config: dict[str, int] = Field(default_factory=dict)
    budget_ms: float
    entry: SuiteEntry


class SuiteSave(BaseModel):
    format: str = FORMAT
    gpu: str
    measured: list[SavedMeasurement] = Field(default_factory=list)


def _identity(problem: str, found: FoundKernel) -> str:
    """The problem as measured: its name or resolved path, the file's content (an edited file is
    another problem), the shape and dtype."""
    ref = found.ref
    shape = "x".join(str(n) for n in ref.shape) if ref.shape else "-"
    content = "-"
    path = Path(problem)
    if problem.endswith(".py") and path.is_file():
        try:
            content = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        except OSError:
            content = "unreadable"
    return f"{problem_key(problem)}|{content}|{shape}|{ref.dtype or '-'}"


class SaveFile:
    """The suite's measurements so far on this GPU, and where each new one is written."""

    def __init__(self, path: Path, gpu: str) -> None:
        self.path = path
        self.gpu = gpu
        self.reused = 0
        self._save = self._load(path, gpu)
        self._by: dict[str, SavedMeasurement] = {m.key: m for m in self._save.measured}

    @staticmethod
    def _load(path: Path, gpu: str) -> SuiteSave:
        if not path.exists():
            return SuiteSave(gpu=gpu)
        if path.is_symlink() or not path.is_file():
            raise SuiteSaveError(f"--save {path}: not a regular file")
        try:
            if path.stat().st_size > MAX_BYTES:
                raise SuiteSaveError(f"--save {path}: larger than {MAX_BYTES >> 20} MiB, not a suite file")
            save = SuiteSave.model_validate_json(path.read_bytes())
        except (OSError, ValidationError, ValueError) as exc:
            raise SuiteSaveError(one_line(f"--save {path}: not a kerngen suite file ({exc})", 300)) from None
        if save.format != FORMAT:
            raise SuiteSaveError(f"--save {path}: format {one_line(save.format, 40)!r}, this kerngen writes {FORMAT}")
        if save.gpu != gpu:
            raise SuiteSaveError(one_line(f"--save {path} holds times measured on {save.gpu}; this GPU is {gpu}: "
                                          "give another file (times of two GPU models are never mixed)", 300))
        return save

    def reuse(self, problem: str, found: FoundKernel, budget_ms: float) -> SuiteEntry | None:
        """The saved entry of this problem, kernel and budget, as given now (None: measure it)."""
        m = self._by.get(_identity(problem, found))
        if (m is None or m.kernel_hash != found.spec.content_hash() or m.config != found.config
                or m.budget_ms != budget_ms):
            return None
        self.reused += 1
        return m.entry.model_copy(update={"problem": problem})

    def record(self, problem: str, found: FoundKernel, budget_ms: float, entry: SuiteEntry) -> None:
        """Keep a measurement (replacing an older one of the problem) and write the file now."""
        m = SavedMeasurement(key=_identity(problem, found), kernel_hash=found.spec.content_hash(),
                             config=dict(found.config), budget_ms=budget_ms, entry=entry)
        self._by[m.key] = m
        self._save.measured = list(self._by.values())
        write_atomic(self.path, self._save.model_dump_json(indent=1))
