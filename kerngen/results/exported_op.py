"""Exported kernels as PyTorch ops: :func:`load_op` (``kerngen.load``), the op's registration, and
where a run's export is cached (``kerngen.results.exported_op``).

An export folder (written by ``kerngen export``) is data: ``<name>.cu`` (the kernel source),
``<name>.json`` (:class:`~kerngen.results.manifest.ExportManifest`: the spec, its tuned configuration,
the resolved launch plan, the problem and its tensors; further shape buckets beside the first) and
``<name>.<arch>.cubin`` (compiled at export time). :func:`load_op` registers ``torch.ops.kerngen.<name>``
with ``torch.library`` (its schema written from the manifest's argument names, a fake
implementation registered, so ``torch.compile(fullgraph=True)`` traces through it and CUDA graphs
capture it) and :class:`~kerngen.results.exported_kernel.ExportedKernel` behind it: which kernel, or
the problem's own PyTorch forward, runs for a call's shapes, and the launch path that costs nothing
per call (:mod:`kerngen.harness.gpu.op_runtime`). The op is ``op.kerngen`` of what ``load`` returns:
``op.kerngen.stats`` counts the calls that fell back.

An export folder may come from anyone, so loading one runs no Python from it: the ``<name>.py``
that ``kerngen export`` also writes (a convenience that only calls ``kerngen.load``) is never
imported here, and the fallback is the problem definition the user has (``fallback=``) or a
built-in problem of kerngen's own. Every name the manifest holds is checked (an identifier for the
op and its arguments, a plain file name for the source and the cubin, ``sm_XX`` for the arch) and
every file read is a regular file inside the folder, symlinks resolved (:mod:`kerngen.agent.safe_paths`).
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
from typing import Any, Callable

from kerngen.agent.safe_paths import UnsafePathError, inside, regular_file
from kerngen.errors import KerngenError
from kerngen.results.exported_kernel import ExportedKernel
from kerngen.results.manifest import ExportError, FORMAT, MAX_MANIFEST_BYTES

__all__ = ["ExportedKernel", "export_cache_dir", "find_manifest", "load_op", "op_of_manifest"]

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


def op_of_manifest(manifest_path: str | Path, *, fallback: Any = None, strict: bool = False,
                   check_new_shapes: bool = True) -> Callable[..., Any]:
    """The op of an export manifest, registered once per process with kerngen's own code: a
    ``torch.library`` op (:func:`~kerngen.harness.gpu.op_call.register_op`) whose schema comes from the
    manifest and whose implementation is an :class:`ExportedKernel`'s runtime (``op.kerngen``). Nothing from the export folder is imported. Loading
    the same export again returns the same op, with the fallback and strictness of this load."""
    from kerngen.harness.gpu.op_call import register_op

    path = Path(manifest_path)
    try:
        path = inside(path.parent, path.name, "export manifest")  # not a link out of its folder
    except UnsafePathError as exc:
        raise ExportError(str(exc)) from None
    try:
        kernel = ExportedKernel(path, fallback=fallback, strict=strict, check_new_shapes=check_new_shapes)
    except ValueError as exc:  # a fallback module without the export's parameters
        raise ExportError(f"{path}: {exc}") from None
    m = kernel.manifest
    with _OPS_LOCK:
        known = _OPS.get(m.name)
        if known is not None:
            if known[0] != m.identity():
                raise ExportError(f"op kerngen::{m.name} is already loaded in this process from another export "
                                  f"({known[1]}); export this kernel under another --name")
            op = known[2]
            try:
                op.kerngen.configure(fallback=fallback, strict=strict, check_new_shapes=check_new_shapes)
            except ValueError as exc:
                raise ExportError(f"{path}: {exc}") from None
            return op

        try:  # the op's implementation is the runtime itself: no Python layer between torch's dispatch and it
            op = register_op(f"kerngen::{m.name}", m.schema(), kernel.runtime, kernel.fake)
        except Exception as exc:  # noqa: BLE001 - torch refusing a name or schema: one line
            raise ExportError(f"{path}: cannot register kerngen::{m.name}: {type(exc).__name__}: {exc}") from None
        op.kerngen = kernel
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


def load_op(path: str | Path, runs_dir: str | Path = "runs", *, fallback: Any = None, strict: bool = False,
            check_new_shapes: bool = True) -> Callable[..., Any]:
    """The exported op of an export folder (or its manifest), or of a run: a run folder, id or
    ``latest`` (the newest run under ``runs_dir``) is exported first into ``$KERNGEN_EXPORT_DIR`` (default
    ``~/.cache/kerngen/exports``), from the run's recorded data. ``fallback``: the problem's model (or a
    callable of the op's arguments) for shapes no kernel admits (default: the built-in problem the
    export names, if any); ``strict``: raise ValueError for those instead; ``check_new_shapes``: the
    first call of each signature (a checked bucket's too: the launch path on this machine) is compared with
    the fallback (see :mod:`kerngen.results.exported_kernel`)."""
    how = dict(fallback=fallback, strict=strict, check_new_shapes=check_new_shapes)
    p = Path(path)
    if p.suffix == ".json" and p.is_file():
        return op_of_manifest(p, **how)
    if p.is_dir():
        manifest = find_manifest(p)
        if manifest is not None:
            return op_of_manifest(manifest, **how)
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
    return op_of_manifest(cached, **how)


class _CallableModule(types.ModuleType):
    """Importing this submodule rebinds the attribute ``kerngen.results.exported_op`` (the function of
    ``kerngen/__init__.py``) to the module; a callable module keeps ``kerngen.load(path)`` working."""

    def __call__(self, path: str | Path, runs_dir: str | Path = "runs", **how: Any) -> Callable[..., Any]:
        return load_op(path, runs_dir, **how)


sys.modules[__name__].__class__ = _CallableModule
