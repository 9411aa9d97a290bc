"""Exported kernels as PyTorch ops: the manifest of an export, the runtime behind the op, and
:func:`load_op` (``kerngen.load``).

An export folder (written by ``kerngen export``) holds ``<name>.cu`` (the kernel source),
``<name>.json`` (:class:`ExportManifest`: the spec, its tuned configuration, the resolved launch
plan, the problem and its tensors), ``<name>.<arch>.cubin`` (compiled at export time) and
``<name>.py``, a small module registering ``torch.ops.kerngen.<name>`` with
``torch.library.custom_op``. That module imports kerngen: :class:`ExportedKernel` compiles the
``.cu`` with NVRTC (:mod:`kerngen.harness.compile`) when the shipped cubin is for another GPU
architecture, and launches the plan with the harness's own launcher (cupy, on torch's current
stream), so arguments are bound exactly as when the kernel was checked and timed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, Field, ValidationError

from kerngen.harness.errors import KerngenError
from kerngen.harness.plan import ResolvedPlan
from kerngen.harness.results import Timing
from kerngen.harness.spec import KernelSpec
from kerngen.problems.problem import TensorInfo
from kerngen.problems.ref import ProblemRef

if TYPE_CHECKING:
    import torch

FORMAT = "kerngen-export/1"
MODULE_PREFIX = "kerngen_exports"


class ExportError(KerngenError):
    """An export cannot be written or loaded (no correct kernel, a bad folder, ...)."""


class ExportManifest(BaseModel):
    """``<name>.json`` of an export folder."""

    format: Literal["kerngen-export/1"] = FORMAT
    name: str  # the op is torch.ops.kerngen.<name>
    op: str  # "kerngen::<name>"
    problem: ProblemRef
    problem_label: str
    inputs: list[TensorInfo]  # the op's arguments: inputs, then params (see arg_names)
    params: list[TensorInfo]
    outputs: list[TensorInfo]
    arg_names: list[str]  # Python names of the op's arguments, in order (inputs then params)
    scalars: dict[str, int | float] = Field(default_factory=dict)  # fixed non-tensor inputs of the problem
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
    gpu: str = ""
    kerngen_version: str = ""

    @property
    def arguments(self) -> list[TensorInfo]:
        return [*self.inputs, *self.params]


def read_manifest(path: str | Path) -> ExportManifest:
    p = Path(path)
    try:
        return ExportManifest.model_validate_json(p.read_text())
    except OSError as exc:
        raise ExportError(f"cannot read export manifest {p}: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise ExportError(f"{p} is not a kerngen export manifest ({where}: {err.get('msg')})") from None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class ExportedKernel:
    """The implementation behind an exported op: checks arguments, allocates outputs and
    scratch, and runs the launch plan on torch's current stream."""

    def __init__(self, manifest_path: str | Path) -> None:
        self.path = Path(manifest_path)
        self.dir = self.path.parent
        self.manifest = read_manifest(self.path)
        self._modules: dict[int, Any] = {}  # device index -> LoadedModule

    # ----- checks -------------------------------------------------------------------------------
    def check(self, args: tuple, *, real: bool) -> None:
        """ValueError naming the first argument whose shape, dtype or device is not the problem's
        (devices only when ``real``: the fake implementation sees fake or meta tensors)."""
        import torch

        m = self.manifest
        want = m.arguments
        if len(args) != len(want):
            raise ValueError(f"{m.op} takes {len(want)} tensors ({', '.join(m.arg_names)}), got {len(args)}")
        device = None
        for name, info, t in zip(m.arg_names, want, args):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{m.op}: argument {name} must be a tensor, got {type(t).__name__}")
            if tuple(t.shape) != tuple(info.shape) or _dtype_name(t.dtype) != info.dtype:
                raise ValueError(f"{m.op}: argument {name} must be {info.dtype}{list(info.shape)}, got "
                                 f"{_dtype_name(t.dtype)}{list(t.shape)} (the kernel was made for this shape only)")
            if real and t.device.type != "cuda":
                raise ValueError(f"{m.op}: argument {name} is on {t.device}, the kernel runs on CUDA tensors only")
            if real and device is not None and t.device != device:
                raise ValueError(f"{m.op}: argument {name} is on {t.device}, others on {device}")
            device = t.device if device is None else device

    def fake(self, *args: "torch.Tensor") -> Any:
        """Outputs of the right shapes and dtypes, without running anything (register_fake)."""
        self.check(args, real=False)
        device = args[0].device if args else None
        return self._pack([self._empty(o, device) for o in self.manifest.outputs])

    # ----- the real thing -----------------------------------------------------------------------
    def __call__(self, *args: "torch.Tensor") -> Any:
        import torch

        self.check(args, real=True)
        m = self.manifest
        device = args[0].device if args else torch.device("cuda", torch.cuda.current_device())
        # the harness ran the kernel on contiguous tensors: give it the same layout
        tensors = {info.name: t.contiguous() for info, t in zip(m.arguments, args)}
        outputs = [self._empty(o, device) for o in m.outputs]
        tensors.update({o.name: t for o, t in zip(m.outputs, outputs)})
        from kerngen.harness.buffers import torch_dtype

        for s in m.plan.scratch:  # uninitialised, as in the harness (which even poisons it)
            tensors[s.name] = torch.empty((s.size,), dtype=torch_dtype(s.dtype), device=device)
        self._run(device, tensors)
        return self._pack(outputs)

    def _run(self, device: "torch.device", tensors: dict[str, "torch.Tensor"]) -> None:
        import cupy
        import torch

        from kerngen.harness.launcher import PlanRunner

        with torch.cuda.device(device), cupy.cuda.Device(device.index):
            module = self.module(device)
            PlanRunner(module, self.manifest.plan, tensors, torch.cuda.current_stream(device))()

    def module(self, device: "torch.device") -> Any:
        """The kernels loaded on ``device``: the shipped cubin when it is for this GPU's arch,
        else the .cu compiled now with NVRTC (same options as the harness used)."""
        import torch

        from kerngen.harness.launcher import LoadedModule

        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._modules:
            self._modules[index] = LoadedModule(self.cubin_for(self._arch(index)), self.manifest.kernels)
        return self._modules[index]

    @staticmethod
    def _arch(index: int) -> str:
        import torch

        from kerngen.harness.compile import arch_for_capability

        return arch_for_capability(*torch.cuda.get_device_capability(index))

    def cubin_for(self, arch: str) -> bytes:
        m = self.manifest
        if m.cubin_file and m.arch == arch and (self.dir / m.cubin_file).is_file():
            return (self.dir / m.cubin_file).read_bytes()
        from kerngen.harness.compile import compile_job, job_for

        spec = m.spec.model_copy(update={"source": (self.dir / m.source_file).read_text()})
        return compile_job(job_for(spec, m.plan, arch)).cubin

    # ----- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _empty(info: TensorInfo, device: Any) -> "torch.Tensor":
        import torch

        from kerngen.harness.buffers import torch_dtype

        return torch.empty(tuple(info.shape), dtype=torch_dtype(info.dtype), device=device)

    def _pack(self, outputs: list) -> Any:
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


# ----- kerngen.load -----------------------------------------------------------------------------
def find_manifest(folder: Path) -> Path | None:
    """The export manifest of a folder (the one .json with our format), or None."""
    for p in sorted(folder.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return p
    return None


def export_cache_dir() -> Path:
    env = os.environ.get("KERNGEN_EXPORT_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kerngen" / "exports"


def import_export(manifest_path: str | Path) -> Callable[..., Any]:
    """Import the generated module of an export once per process; returns its op."""
    manifest = read_manifest(manifest_path)
    module_name = f"{MODULE_PREFIX}_{manifest.name}"
    if module_name in sys.modules:  # an op registers once per process
        return sys.modules[module_name].op
    path = Path(manifest_path).with_name(f"{manifest.name}.py")
    if not path.is_file():
        raise ExportError(f"export module {path} is missing")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module.op


def load_op(path: str | Path, runs_dir: str | Path = "runs") -> Callable[..., Any]:
    """The exported op of an export folder (or its manifest), or of a run: a run folder or id
    is exported first into ``$KERNGEN_EXPORT_DIR`` (default ``~/.cache/kerngen/exports``)."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        return import_export(p)
    if p.is_dir():
        manifest = find_manifest(p)
        if manifest is not None:
            return import_export(manifest)
    from kerngen.agent.export import export_run
    from kerngen.agent.tree import load_run

    run = load_run(p, runs_dir)  # JournalError: neither an export nor a run
    best = run.best
    out = export_cache_dir() / f"{run.id}-node{best.id if best else 'none'}"
    cached = find_manifest(out) if out.is_dir() else None
    if cached is None:
        cached = export_run(run, out).manifest
    return import_export(cached)


class _CallableModule(types.ModuleType):
    """Importing this submodule rebinds the attribute ``kerngen.load`` (the function of
    ``kerngen/__init__.py``) to the module; a callable module keeps ``kerngen.load(path)`` working."""

    def __call__(self, path: str | Path, runs_dir: str | Path = "runs") -> Callable[..., Any]:
        return load_op(path, runs_dir)


sys.modules[__name__].__class__ = _CallableModule
