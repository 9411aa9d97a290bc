"""The manifest of an export folder (``<name>.json``): what ``kerngen export`` writes and
``kerngen.load`` reads, validated as untrusted data (names, files, arch, tensors)."""

from __future__ import annotations

import hashlib
import keyword
import re
from pathlib import Path
from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from kerngen.agent.safe_paths import UnsafePathError, check_name, regular_file, shown
from kerngen.errors import KerngenError
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.results import Timing
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.info import TensorInfo
from kerngen.problems.ref import ProblemRef

FORMAT = "kerngen-export/1"
MAX_MANIFEST_BYTES = 16 << 20
MAX_CUBIN_BYTES = 256 << 20
MAX_BUCKETS = 64  # shape buckets of one export
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,119}")
_ARCH = re.compile(r"sm_[0-9]{2,3}[af]?")


class ExportError(KerngenError):
    """An export cannot be written or loaded (no correct kernel, a bad folder, ...)."""


def check_arch(arch: str) -> str:
    """``sm_XY`` (``sm_90``, ``sm_90a``, ``sm_100``): anything else is refused before it becomes an
    NVRTC option or part of a file name."""
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ExportError(f"arch {shown(arch)} is not a GPU architecture like sm_90")
    return arch


def _identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENT.fullmatch(value) or keyword.iskeyword(value) or value == "self":
        raise ValueError(f"{what} {shown(value)} is not an ASCII identifier")
    return value


class TimedPath(str, Enum):
    """Which path a recorded time is of."""

    kernel = "kernel"  # the harness launching the plan on its own buffers (a run's times)
    op = "op"  # the exported op as a user calls it (kerngen bench --op, kerngen suite)


class KernelVariant(BaseModel):
    """One kernel of an export and the shapes it was checked and timed at (a shape bucket)."""

    inputs: list[TensorInfo]  # the op's arguments: inputs, then params (see arg_names)
    params: list[TensorInfo]
    outputs: list[TensorInfo]
    spec: KernelSpec
    config: dict[str, int]
    plan: ResolvedPlan
    source_file: str  # "<name>.cu"
    kernels: list[str]
    nvrtc_options: list[str]  # as the harness compiled it (arch, -D of tunables and defines)
    arch: str  # of the shipped cubin
    cubin_file: str | None = None
    nvrtc_version: str = ""
    origin: str = ""  # "run <id> node #<n>" or "spec <name>"
    timing: Timing | None = None  # what the harness measured, on ``gpu``
    timed: TimedPath = TimedPath.kernel  # which path ``timing`` is of
    gpu: str = ""
    # the problem's sizes at these shapes (names the plan's expressions may read besides the tensors'),
    # and the tolerance the kernel was checked at (None: the dtype's default)
    sizes: dict[str, int | float] = Field(default_factory=dict)
    atol: float | None = None
    rtol: float | None = None

    @property
    def arguments(self) -> list[TensorInfo]:
        return [*self.inputs, *self.params]

    # an export folder may come from anyone: every name that becomes a path, an op or an option is checked
    @field_validator("source_file", "cubin_file")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                check_name(value, "file name")
            except UnsafePathError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("arch")
    @classmethod
    def _arch(cls, value: str) -> str:
        if not _ARCH.fullmatch(value):
            raise ValueError(f"arch {shown(value)} is not a GPU architecture like sm_90")
        return value


class ExportManifest(KernelVariant):
    """``<name>.json`` of an export folder: the first kernel (at the first shape) in its own
    fields, the kernels of further shape buckets in ``buckets`` (``kerngen export RUN RUN ...``)."""

    format: Literal["kerngen-export/1"] = FORMAT
    name: str  # the op is torch.ops.kerngen.<name>
    op: str  # "kerngen::<name>"
    problem: ProblemRef
    problem_label: str
    arg_names: list[str]  # Python names of the op's arguments, in order (inputs then params)
    scalars: dict[str, int | float] = Field(default_factory=dict)  # fixed non-tensor inputs of the problem
    forward_args: list[str] = Field(default_factory=list)  # Model.forward's arguments in order (tensors, scalars)
    precision: str = "fp32"  # what the kernels were checked against: "fp32" (true fp32) or "tf32"
    buckets: list[KernelVariant] = Field(default_factory=list, max_length=MAX_BUCKETS)
    kerngen_version: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _identifier(value, "op name")

    @field_validator("arg_names")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for a in value:
            _identifier(a, "argument name")
        if len(set(value)) != len(value):
            raise ValueError("argument names repeat")
        return value

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str) -> str:
        if value not in ("fp32", "tf32"):
            raise ValueError(f"precision {shown(value)} is not fp32 or tf32")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ExportManifest":
        if self.op != f"kerngen::{self.name}":
            raise ValueError(f"op {shown(self.op)} is not kerngen::{self.name}")
        if len(self.arg_names) != len(self.arguments):
            raise ValueError(f"{len(self.arg_names)} argument names for {len(self.arguments)} tensors")
        if not self.outputs:
            raise ValueError("no outputs")
        names = ([t.name for t in self.arguments], [t.name for t in self.outputs])
        for i, b in enumerate(self.buckets):
            if ([t.name for t in b.arguments], [t.name for t in b.outputs]) != names:
                raise ValueError(f"bucket {i} has other tensors than the op's ({', '.join(names[0])})")
        return self

    def variants(self) -> list[KernelVariant]:
        """Every kernel of the export, the first one first."""
        first = KernelVariant.model_validate({k: getattr(self, k) for k in KernelVariant.model_fields})
        return [first, *self.buckets]

    def schema(self) -> str:
        """The op's torch.library schema: ``(Tensor x, Tensor w) -> Tensor``."""
        outs = "Tensor" if len(self.outputs) == 1 else f"({', '.join(['Tensor'] * len(self.outputs))})"
        return f"({', '.join(f'Tensor {a}' for a in self.arg_names)}) -> {outs}"

    def identity(self) -> str:
        """A digest of what the op does (not where or when it was exported)."""
        keep = {"name", "spec", "config", "plan", "inputs", "params", "outputs", "arg_names", "kernels", "precision"}
        data = self.model_dump_json(include=keep)
        if self.buckets:
            data += "".join(b.model_dump_json(include=keep) for b in self.buckets)
        return hashlib.sha256(data.encode()).hexdigest()


def read_manifest(path: str | Path) -> ExportManifest:
    p = Path(path)
    try:
        text = regular_file(p, "export manifest", MAX_MANIFEST_BYTES).read_text(encoding="utf-8")
        return ExportManifest.model_validate_json(text)
    except UnsafePathError as exc:
        raise ExportError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read export manifest {p}: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise ExportError(f"{p} is not a kerngen export manifest ({where}: {err.get('msg')})") from None
