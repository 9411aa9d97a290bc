"""Exported kernels as PyTorch ops: the manifest of an export, the runtime behind the op, and
:func:`load_op` (``kerngen.results.exported_op``).

An export folder (written by ``kerngen export``) is data: ``<name>.cu`` (the kernel source),
``<name>.json`` (:class:`ExportManifest`: the spec, its tuned configuration, the resolved launch
plan, the problem and its tensors) and ``<name>.<arch>.cubin`` (compiled at export time).
:func:`load_op` registers ``torch.ops.kerngen.<name>`` with ``torch.library.custom_op`` (its
schema written from the manifest's argument names) and :class:`ExportedKernel` behind it: it
compiles the ``.cu`` with NVRTC (:mod:`kerngen.harness.compile.compiler`) when the shipped cubin is for
another GPU architecture, and launches the plan with the harness's own launcher (cupy, on torch's
current stream), so arguments are bound exactly as when the kernel was checked and timed.

An export folder may come from anyone, so loading one runs no Python from it: the ``<name>.py``
that ``kerngen export`` also writes (a convenience that only calls ``kerngen.results.exported_op``) is never
imported here. Every name the manifest holds is checked (an identifier for the op and its
arguments, a plain file name for the source and the cubin, ``sm_XX`` for the arch) and every file
read is a regular file inside the folder, symlinks resolved (:mod:`kerngen.agent.safe_paths`).
Loading a run exports its best kernel into ``$KERNGEN_EXPORT_DIR`` from the run's recorded data,
without importing the run's problem file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable


from kerngen.agent.safe_paths import UnsafePathError, inside, regular_file, shown
from kerngen.errors import KerngenError
from kerngen.results.manifest import ExportError, FORMAT, MAX_CUBIN_BYTES, MAX_MANIFEST_BYTES, check_arch, read_manifest
from kerngen.problems.info import TensorInfo

if TYPE_CHECKING:
    import torch

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
        from kerngen.harness.gpu.buffers import TORCH_DTYPES

        m = self.manifest
        for t in [*m.arguments, *m.outputs]:
            if t.dtype not in TORCH_DTYPES:
                raise ExportError(f"{self.path}: tensor {shown(t.name)} has an unknown dtype {shown(t.dtype)}")
        for s in m.plan.scratch:
            if s.dtype not in TORCH_DTYPES:
                raise ExportError(f"{self.path}: scratch {shown(s.name)} has an unknown dtype {shown(s.dtype)}")

    def file(self, name: str) -> Path:
        """A file of the export folder: a regular file inside it (symlinks resolved)."""
        try:
            return regular_file(inside(self.dir, name, "export file"), "export file", MAX_CUBIN_BYTES)
        except UnsafePathError as exc:
            raise ExportError(str(exc)) from None

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
        from kerngen.harness.gpu.buffers import torch_dtype

        for s in m.plan.scratch:  # uninitialised, as in the harness (which even poisons it)
            tensors[s.name] = torch.empty((s.size,), dtype=torch_dtype(s.dtype), device=device)
        self._run(device, tensors)
        return self._pack(outputs)

    def _run(self, device: "torch.device", tensors: dict[str, "torch.Tensor"]) -> None:
        import cupy
        import torch

        from kerngen.harness.gpu.launcher import PlanRunner

        with torch.cuda.device(device), cupy.cuda.Device(device.index):
            module = self.module(device)
            PlanRunner(module, self.manifest.plan, tensors, torch.cuda.current_stream(device))()

    def module(self, device: "torch.device") -> Any:
        """The kernels loaded on ``device``: the shipped cubin when it is for this GPU's arch,
        else the .cu compiled now with NVRTC (same options as the harness used)."""
        import torch

        from kerngen.harness.gpu.launcher import LoadedModule

        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._modules:
            self._modules[index] = LoadedModule(self.cubin_for(self._arch(index)), self.manifest.kernels)
        return self._modules[index]

    @staticmethod
    def _arch(index: int) -> str:
        import torch

        from kerngen.harness.compile.nvrtc_info import arch_for_capability

        return arch_for_capability(*torch.cuda.get_device_capability(index))

    def cubin_for(self, arch: str) -> bytes:
        m = self.manifest
        if m.cubin_file and m.arch == arch and (self.dir / m.cubin_file).is_file():
            return self.file(m.cubin_file).read_bytes()
        from kerngen.harness.compile.compiler import compile_job, job_for

        spec = m.spec.model_copy(update={"source": self.file(m.source_file).read_text()})
        return compile_job(job_for(spec, m.plan, check_arch(arch))).cubin

    # ----- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _empty(info: TensorInfo, device: Any) -> "torch.Tensor":
        import torch

        from kerngen.harness.gpu.buffers import torch_dtype

        return torch.empty(tuple(info.shape), dtype=torch_dtype(info.dtype), device=device)

    def _pack(self, outputs: list) -> Any:
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


# ----- kerngen.results.exported_op -----------------------------------------------------------------------------
def find_manifest(folder: Path) -> Path | None:
    """The export manifest of a folder (the first .json with our format that is a regular file
    inside it), or None. Nothing else of the folder is read."""
    for p in sorted(folder.glob("*.json")):
        try:
            q = regular_file(inside(folder, p.name, "manifest"), "manifest", MAX_MANIFEST_BYTES)
            data = json.loads(q.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError, KerngenError):  # ValueError: bad JSON or UTF-8
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return p
    return None


def export_cache_dir() -> Path:
    env = os.environ.get("KERNGEN_EXPORT_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kerngen" / "exports"


_OPS: dict[str, tuple[str, Path, Any]] = {}  # op name -> (manifest identity, manifest path, op)
_OPS_LOCK = threading.Lock()


def op_of_manifest(manifest_path: str | Path) -> Callable[..., Any]:
    """The op of an export manifest, registered once per process with kerngen's own code: a
    ``torch.library.custom_op`` whose schema comes from the manifest and whose implementation is
    an :class:`ExportedKernel`. Nothing from the export folder is imported."""
    path = Path(manifest_path)
    try:
        path = inside(path.parent, path.name, "export manifest")  # not a link out of its folder
    except UnsafePathError as exc:
        raise ExportError(str(exc)) from None
    kernel = ExportedKernel(path)
    m = kernel.manifest
    with _OPS_LOCK:
        known = _OPS.get(m.name)
        if known is not None:
            if known[0] != m.identity():
                raise ExportError(f"op kerngen::{m.name} is already loaded in this process from another export "
                                  f"({known[1]}); export this kernel under another --name")
            return known[2]
        import torch

        def implementation(*args: Any) -> Any:
            return kernel(*args)

        def fake(*args: Any) -> Any:
            return kernel.fake(*args)

        try:
            op = torch.library.custom_op(f"kerngen::{m.name}", implementation, mutates_args=(), schema=m.schema())
            op.register_fake(fake)
        except Exception as exc:  # noqa: BLE001 - torch refusing a name or schema: one line
            raise ExportError(f"{path}: cannot register kerngen::{m.name}: {type(exc).__name__}: {exc}") from None
        _OPS[m.name] = (m.identity(), path, op)
        return op


def export_key(run: Any, best: Any) -> str:
    """The export cache's folder name for a run's best kernel: a digest of what the export holds
    (the spec with its source, the configuration, the problem and the GPU's arch), never the run id
    a journal claims, so a handed run that reuses a genuine run's id cannot plant its kernel where
    ``kerngen.load`` of the genuine run looks (issue #31)."""
    spec = best.best_spec()
    gpu = run.tree.gpu
    parts = (spec.model_dump_json() if spec is not None else "", json.dumps(best.config, sort_keys=True, default=str),
             run.started.problem.model_dump_json(),
             run.started.problem_info.model_dump_json() if run.started.problem_info is not None else "",
             gpu.arch if gpu is not None else "", str(run.started.demo))
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"kernel-{digest[:32]}-node{int(best.id)}"  # the node for people; the digest decides


def load_op(path: str | Path, runs_dir: str | Path = "runs") -> Callable[..., Any]:
    """The exported op of an export folder (or its manifest), or of a run: a run folder, id or
    ``latest`` (the newest run under ``runs_dir``) is exported first into ``$KERNGEN_EXPORT_DIR`` (default ``~/.cache/kerngen/exports``), from
    the run's recorded data."""
    p = Path(path)
    if p.suffix == ".json" and p.is_file():
        return op_of_manifest(p)
    if p.is_dir():
        manifest = find_manifest(p)
        if manifest is not None:
            return op_of_manifest(manifest)
    from kerngen.results.export import export_run
    from kerngen.agent.tree import load_run

    run = load_run(p, runs_dir)  # JournalError: neither an export nor a run
    best = run.best
    if best is None:
        raise ExportError(f"run {run.id} has no correct kernel to load")
    try:
        out = inside(export_cache_dir(), export_key(run, best), "export folder")
    except UnsafePathError as exc:
        raise ExportError(str(exc)) from None
    cached = find_manifest(out) if out.is_dir() else None
    if cached is None:
        cached = export_run(run, out).manifest
    return op_of_manifest(cached)


class _CallableModule(types.ModuleType):
    """Importing this submodule rebinds the attribute ``kerngen.results.exported_op`` (the function of
    ``kerngen/__init__.py``) to the module; a callable module keeps ``kerngen.load(path)`` working."""

    def __call__(self, path: str | Path, runs_dir: str | Path = "runs") -> Callable[..., Any]:
        return load_op(path, runs_dir)


sys.modules[__name__].__class__ = _CallableModule
