"""A model run's record (issue 34): ``runs/<id>/model.json``, one :class:`ModelRun` (pydantic) written when the
run ends and read back by ``kerngen show`` / ``kerngen report`` / ``kerngen.load``: the assembled plan (data), the
table per region (its share of the eager time, what each variant tried gave, kernel or PyTorch and why, the
Amdahl bound), the end-to-end check and the end-to-end times. Reading it runs nothing from the folder: the plan's
kernels are specs, its other steps allowlisted ATen ops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from kerngen.errors import KerngenError
from kerngen.harness.atomic import write_atomic
from kerngen.harness.model.bench import EndToEnd
from kerngen.harness.model.check import ModelCheck
from kerngen.harness.model.aten import PlanError
from kerngen.harness.model.plan import ModelPlan

__all__ = ["MODEL_EVENTS", "MODEL_FILE", "ModelRun", "RegionRow", "VariantTry", "is_model_run", "read_model_run", "write_model_run"]

MODEL_FILE = "model.json"
MODEL_EVENTS = "model_events.jsonl"  # the run's journal (:mod:`.model_journal`): what a resume reads
MAX_MODEL_BYTES = 64 << 20


class VariantTry(BaseModel):
    variant: str
    ok: bool
    config: dict[str, int] | None = None  # a tune's configuration (None: the variant's default)
    kernel_ms: float | None = None
    message: str = ""
    parent: int | None = None  # a tune's configuration: the index (in its region's tries) of the kernel it tunes


class RegionRow(BaseModel):
    region: int
    nodes: list[str]
    family: str | None = None  # the family that covers it (None: none does)
    eager_ms: float  # its PyTorch steps alone (median)
    share: float  # of the eager forward's step time
    floor_ms: float | None = None  # its roofline floor on the run's GPU (None: not known)
    weight: float = 0.0  # share x (1 - floor / eager): what the budget is split by
    budget_s: float = 0.0  # the search time it was given
    tried: list[VariantTry] = []
    chosen: Literal["kernel", "pytorch"] = "pytorch"
    variant: str | None = None
    config: dict[str, int] | None = None  # the chosen kernel's configuration
    chosen_try: int | None = None  # the chosen kernel's index in ``tried``
    kernel_ms: float | None = None
    why: str = ""  # why PyTorch runs it (no family, no variant correct, slower than PyTorch, no budget left)

    @property
    def amdahl(self) -> float:
        """The whole forward's speed-up if this region took no time at all."""
        return 1.0 / max(1.0 - self.share, 1e-9)

    @property
    def amdahl_text(self) -> str:
        return amdahl_text(self.amdahl)


class ModelRun(BaseModel):
    kind: Literal["model"] = "model"
    id: str
    problem: str
    problem_path: str
    problem_sha256: str
    device: str
    started: str
    plan: ModelPlan
    regions: list[RegionRow]
    views_ms: float = 0.0  # the views between regions (PyTorch)
    check: ModelCheck | None = None
    timing: EndToEnd | None = None
    elapsed_s: float = 0.0
    stopped: str = ""
    replay_of: str = ""  # the run whose plan this one re-checked and re-timed (kerngen replay)
    retuned: bool = False  # kerngen replay --tune: each kernel region tuned again on this device
    changed: list[int] = []  # a re-tune: the regions whose variant or configuration differs from replay_of's
    sessions: int = 1  # 1 + the times it was resumed (kerngen generate --as-model --resume)

    @property
    def kernel_share(self) -> float:
        """The share of the eager step time whose regions run as kerngen kernels."""
        return sum(r.share for r in self.regions if r.chosen == "kernel")

    @property
    def amdahl_bound(self) -> float:
        """The forward's speed-up if every kernel region took no time."""
        return 1.0 / max(1.0 - self.kernel_share, 1e-9)

    @property
    def amdahl_text(self) -> str:
        return amdahl_text(self.amdahl_bound)


AMDAHL_UNBOUNDED = 1000.0  # an Amdahl bound at least this large is shown as "unbounded" (null in JSON)


def amdahl_text(bound: float) -> str:
    """An Amdahl bound as a table shows it: past 1000x the rest of the forward is too small to bound anything
    (a plan whose every region is a kernel: 1 / (1 - 100%))."""
    return f"{bound:.2f}x" if bound < AMDAHL_UNBOUNDED else "unbounded"


def is_model_run(path: Path) -> bool:
    """A model run's folder: its record, or (a run interrupted before its end) its journal."""
    return (Path(path) / MODEL_FILE).is_file() or (Path(path) / MODEL_EVENTS).is_file()


def write_model_run(run: ModelRun, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    write_atomic(path, run.model_dump_json(indent=1))
    return path


def read_model_run(folder: Path) -> ModelRun:
    """The record of a model run folder (or a model export); KerngenError (one line) for a missing, huge or invalid
    one, or one whose plan cannot run (a name read before it is made, an ATen op outside the allowlist or not
    functional)."""
    path = Path(folder) / MODEL_FILE
    if not path.exists() and not path.is_symlink() and (Path(folder) / MODEL_EVENTS).is_file():
        raise KerngenError(f"model run {Path(folder).name} was interrupted before its end (its journal holds the "
                           f"regions searched): continue it with kerngen generate MODEL.py --as-model --resume {folder}")
    try:
        if path.is_symlink() or path.stat().st_size > MAX_MODEL_BYTES:
            raise KerngenError(f"{path}: not a regular model record of at most {MAX_MODEL_BYTES >> 20} MB")
        with path.open("rb") as f:  # bounded: a file that grows after the stat is cut, then refused as invalid
            run = ModelRun.model_validate_json(f.read(MAX_MODEL_BYTES + 1))
        run.plan.validate()
        return run
    except PlanError as exc:
        raise KerngenError(f"{path}: its plan cannot run: {exc}") from None
    except OSError as exc:
        raise KerngenError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise KerngenError(f"{path}: not a model run record ({'.'.join(map(str, first['loc']))}: "
                           f"{first['msg']})") from None
