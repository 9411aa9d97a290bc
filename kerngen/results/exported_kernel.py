"""The implementation behind an exported op (:class:`ExportedKernel`): which kernel, or the problem's
own PyTorch forward, runs for the shapes and dtypes of a call.

For a call's signature (shapes, dtypes, devices), decided once and then looked up
(:class:`kerngen.harness.gpu.op_call.OpRuntime`):

1. a shape bucket checked at exactly those shapes and dtypes: its kernel, with the plan it was
   checked with;
2. else the buckets of the same dtypes, nearest first (by how far each argument's size is from the
   bucket's), whose constraints admit the shapes: the first one's kernel, its plan resolved at the
   new shapes (and compiled anew when its ``defines`` change). The output shapes come from the
   problem's forward run on meta tensors (:mod:`.op_fallback`), so this needs a fallback. A kernel
   whose plan reads a problem size that follows the shapes (a size name equal to a tensor's
   dimension: ``batch_size``, a built-in's ``rows``) serves its own shapes only: a new shape does not
   tell that size. With ``check_new_shapes`` (the default) and a fallback, the first call of every
   signature, a checked bucket's included (the op's own launch path on this machine), also runs the
   fallback and compares (at the tolerance the kernel was checked at, with PyTorch at the precision it
   was checked at); a kernel that disagrees is not used at that signature again;
3. else the fallback (a warning once per signature; ``stats.fallback_calls`` counts the calls), or,
   in strict mode or without a fallback, a ValueError saying why no kernel admits the call.

Tensors not on a CUDA device are never given to a kernel (case 3).
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kerngen import expr
from kerngen.agent.safe_paths import UnsafePathError, inside, regular_file, shown
from kerngen.errors import SpecError
from kerngen.harness.gpu.op_call import Entry, KernelEntry, OpRuntime
from kerngen.harness.gpu.op_runtime import Binder, CudaBinder, DescriptorCache, KernelRuntime, Slots, write_descriptor
from kerngen.results.manifest import MAX_CUBIN_BYTES, ExportError, KernelVariant, check_arch, read_manifest
from kerngen.results.op_fallback import Fallback, builtin_fallback, user_fallback


class FallbackWarning(UserWarning):
    """An exported op ran the problem's PyTorch forward instead of its kernel (once per signature)."""


@dataclass
class OpStats:
    """What an exported op did, for the user to read (``op.kerngen.stats``): calls that ran the
    problem's PyTorch forward, and what was decided for every signature seen. Calls replayed by a
    CUDA graph run no Python and are not counted."""

    fallback_calls: int = 0
    decisions: dict[str, str] = field(default_factory=dict)  # "float32[8, 4096]" -> what runs


def describe(args: tuple) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in args)


class ExportedKernel:
    """An export's kernels behind one op. ``fallback``: the problem's ``nn.Module`` or a callable
    of the op's arguments (default: the built-in problem the export names, if it names one).
    ``strict``: a call no kernel admits raises ValueError instead of falling back."""

    def __init__(self, manifest_path: str | Path, *, fallback: Any = None, strict: bool = False,
                 check_new_shapes: bool = True, binder: Callable[[KernelVariant], Binder] | None = None) -> None:
        from kerngen.harness.gpu.buffers import TORCH_DTYPES

        self.path = Path(manifest_path)
        self.dir = self.path.parent
        self.manifest = m = read_manifest(self.path)
        self.variants = m.variants()
        for v in self.variants:
            for t in [*v.arguments, *v.outputs]:
                if t.dtype not in TORCH_DTYPES:
                    raise ExportError(f"{self.path}: tensor {shown(t.name)} has an unknown dtype {shown(t.dtype)}")
            for s in v.plan.scratch:
                if s.dtype not in TORCH_DTYPES:
                    raise ExportError(f"{self.path}: scratch {shown(s.name)} has an unknown dtype {shown(s.dtype)}")
        self.stats = OpStats()
        self._cuda = binder is None  # else a test's backend (the CPU emulator)
        self._binder = binder or self._cuda_binder
        self._descriptors = DescriptorCache(write_descriptor)
        self._kernels: dict[int, KernelRuntime] = {}
        self._lock = threading.Lock()
        self.runtime = OpRuntime(self._admit)
        self.configure(fallback=fallback, strict=strict, check_new_shapes=check_new_shapes)

    def configure(self, *, fallback: Any = None, strict: bool = False, check_new_shapes: bool = True) -> None:
        """The rules for shapes no kernel admits: the problem definition to fall back on (None: the
        built-in problem the export names, if any), strict mode, checking new shapes. Every
        signature is decided again under them (the kernels, plans and descriptors are kept)."""
        m = self.manifest
        if fallback is not None:
            self.fallback: Fallback | None = user_fallback(fallback, m.inputs, m.params, m.forward_args, m.scalars)
        else:
            self.fallback = builtin_fallback(m.problem.source, m.problem.dtype, m.inputs, m.params, m.forward_args,
                                             m.scalars)
        self.strict, self.check_new_shapes = strict, check_new_shapes
        self.runtime.clear()

    # ----- files ------------------------------------------------------------------------------
    def file(self, name: str) -> Path:
        """A file of the export folder: a regular file inside it (symlinks resolved)."""
        try:
            return regular_file(inside(self.dir, name, "export file"), "export file", MAX_CUBIN_BYTES)
        except UnsafePathError as exc:
            raise ExportError(str(exc)) from None

    def cubin_for(self, arch: str, variant: KernelVariant | None = None, plan: Any = None) -> bytes:
        """The cubin of ``variant`` (default: the first) at ``plan`` (default: its own) for ``arch``:
        the shipped one when it fits, else the .cu compiled now with NVRTC (the harness's options)."""
        v = variant or self.variants[0]
        plan = plan if plan is not None else v.plan
        same = plan.config == v.plan.config and plan.defines == v.plan.defines
        if same and v.cubin_file and v.arch == arch and (self.dir / v.cubin_file).is_file():
            return self.file(v.cubin_file).read_bytes()
        from kerngen.harness.compile.compiler import compile_job, job_for

        spec = v.spec.model_copy(update={"source": self.file(v.source_file).read_text()})
        return compile_job(job_for(spec, plan, check_arch(arch))).cubin

    def _cuda_binder(self, variant: KernelVariant) -> Binder:
        def cubin(plan: Any, device: int) -> bytes:
            import torch

            from kerngen.harness.compile.nvrtc_info import arch_for_capability

            return self.cubin_for(arch_for_capability(*torch.cuda.get_device_capability(device)), variant, plan)

        return CudaBinder(variant.spec, cubin, self._descriptors)

    # ----- the op -----------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        return self.runtime(*args)

    def fake(self, *args: Any) -> Any:
        """Outputs of the right shapes and dtypes, without running anything (register_fake): a
        kernel's, or the fallback's; a call the real op would refuse is refused here too."""
        import torch

        shapes = self._shapes(args)
        chosen, why = self._choose(shapes, None)
        got = chosen[1] if chosen is not None else None
        if got is None and not self.strict and self.fallback is not None:
            got = self.fallback.output_shapes(shapes, args[0].device)
        if got is None:
            self._refuse(describe(args), why)
        outs = [torch.empty(shape, dtype=dtype, device=args[0].device) for shape, dtype in got]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _refuse(self, label: str, why: str) -> None:
        hint = ("strict mode" if self.strict else
                "no fallback: pass the problem's model, kerngen.load(EXPORT, fallback=model)")
        raise ValueError(f"{self.manifest.op}: no kernel for {label}: {why} ({hint})")

    def _shapes(self, args: tuple) -> tuple:
        m = self.manifest
        if len(args) != len(m.arguments):
            raise ValueError(f"{m.op} takes {len(m.arguments)} tensors ({', '.join(m.arg_names)}), got {len(args)}")
        for name, t in zip(m.arg_names, args):
            if not hasattr(t, "shape") or not hasattr(t, "dtype"):
                raise ValueError(f"{m.op}: argument {name} must be a tensor, got {type(t).__name__}")
        return tuple((tuple(int(d) for d in t.shape), t.dtype) for t in args)

    def _exact(self, shapes: tuple) -> int | None:
        """The bucket checked at exactly these shapes and dtypes."""
        for i, v in enumerate(self.variants):
            if tuple((tuple(t.shape), _torch_dtype(t.dtype)) for t in v.arguments) == shapes:
                return i
        return None

    def _admit(self, args: tuple) -> Entry:
        """What runs for the signature of ``args`` (see the module docstring)."""
        shapes = self._shapes(args)
        devices = {t.device for t in args}
        if len(devices) > 1:
            raise ValueError(f"{self.manifest.op}: the arguments are on several devices ({', '.join(map(str, devices))})")
        device = next(iter(devices))
        chosen, why = self._choose(shapes, device)
        label = describe(args)
        if chosen is not None:
            index, outputs, checked = chosen
            entry = self._kernel_entry(index, shapes, outputs, device)
            self.stats.decisions[label] = f"kernel of bucket {index}" + ("" if checked else " (an unchecked shape)")
            # the first call of every signature is compared with PyTorch, a checked bucket's too: the harness
            # checked the kernel through its own launcher, and this is the op's launch path on this machine (on
            # 4x H200 a regions spec's op differed from its checked kernel, 2026-11-28)
            if self.fallback is not None and self.check_new_shapes:
                return _FirstCallChecked(self, entry, index, label)
            return entry
        return self._fallback_entry(label, why)

    def _fallback_entry(self, label: str, why: str) -> Entry:
        if self.strict or self.fallback is None:
            self._refuse(label, why)
        fb = self.fallback
        assert fb is not None
        warnings.warn(f"{self.manifest.op}: {label}: {why}; running {fb.what} (PyTorch) instead; "
                      "op.kerngen.stats counts such calls", FallbackWarning, stacklevel=2)
        self.stats.decisions[label] = f"fallback ({why})"

        def run(args: tuple) -> Any:
            self.stats.fallback_calls += 1
            return fb.call(args)

        return run

    def _choose(self, shapes: tuple, device: Any) -> tuple[tuple[int, list, bool] | None, str]:
        """(bucket, its outputs' (shape, dtype), checked at exactly these shapes), or None and why.
        ``device`` None: a fake call's (meta or fake tensors; where they would run is not known)."""
        if device is not None and getattr(device, "type", None) != "cuda" and self._cuda:
            return None, f"the arguments are on {device}; the kernel runs on CUDA tensors only"
        exact = self._exact(shapes)
        if exact is not None:
            v = self.variants[exact]
            return (exact, [(tuple(t.shape), _torch_dtype(t.dtype)) for t in v.outputs], True), ""
        same_dtypes = [i for i, v in enumerate(self.variants)
                       if tuple(_torch_dtype(t.dtype) for t in v.arguments) == tuple(d for _, d in shapes)]
        if not same_dtypes:
            have = "; ".join(sorted({", ".join(t.dtype for t in v.arguments) for v in self.variants}))
            return None, f"no kernel for these dtypes (the export's: {have})"
        outputs = self.fallback.output_shapes(shapes, device or "cpu") if self.fallback is not None else None
        if outputs is None:
            return None, ("a shape no kernel was checked at, and no problem definition tells its output shapes"
                          if self.fallback is None else f"{self.fallback.what} does not run on meta tensors here")
        whys = []
        for i in sorted(same_dtypes, key=lambda i: _distance(self.variants[i], shapes)):
            v = self.variants[i]
            bound = shape_bound_sizes(v)
            if bound:
                whys.append(f"bucket {i} reads the size{'s' if len(bound) > 1 else ''} {', '.join(bound)} "
                            "that follow the shapes")
                continue
            try:
                self._runtime_of(i).plans.plan(self._named_shapes(v, shapes, outputs))
            except SpecError as exc:
                whys.append(f"bucket {i}: {' '.join(str(exc).split())[:200]}")
                continue
            return (i, outputs, False), ""
        return None, "; ".join(whys)

    # ----- kernels ------------------------------------------------------------------------------
    def _runtime_of(self, index: int) -> KernelRuntime:
        with self._lock:
            if index not in self._kernels:
                v = self.variants[index]
                sizes = {**v.sizes, **self.manifest.scalars}
                kr = KernelRuntime(v.spec, v.plan.config, sizes, self._binder(v))
                own = [(tuple(t.shape), _torch_dtype(t.dtype)) for t in v.arguments]
                kr.plans.seed(self._named_shapes(v, own, [(tuple(t.shape), None) for t in v.outputs]), v.plan)
                self._kernels[index] = kr
            return self._kernels[index]

    @staticmethod
    def _named_shapes(v: KernelVariant, shapes: Any, outputs: list) -> tuple:
        names = [t.name for t in v.arguments] + [t.name for t in v.outputs]
        return tuple(zip(names, [tuple(s) for s, _ in list(shapes) + list(outputs)]))

    def _kernel_entry(self, index: int, shapes: tuple, outputs: list, device: Any) -> KernelEntry:
        v = self.variants[index]
        kr = self._runtime_of(index)
        slots = Slots(tuple([t.name for t in v.arguments] + [t.name for t in v.outputs] + [s.name for s in v.spec.scratch]))
        plan, runner = kr.runner(self._named_shapes(v, shapes, outputs), device.index or 0, slots)
        if [s.name for s in plan.scratch] != list(slots.names[len(v.arguments) + len(v.outputs):]):
            raise ExportError(f"{self.path}: the plan's scratch buffers are not the spec's")
        return KernelEntry(runner, tuple((tuple(s), d) for s, d in outputs),
                           tuple((s.size, _torch_dtype(s.dtype)) for s in plan.scratch), device)


class _FirstCallChecked:
    """A kernel's first call at a signature (outside a CUDA graph capture)
    also runs the fallback, under the precision the export was checked at, and compares; then the
    signature runs the kernel, or, if it disagreed, the fallback from then on."""

    def __init__(self, op: ExportedKernel, entry: KernelEntry, index: int, label: str) -> None:
        self.op, self.entry, self.index, self.label = op, entry, index, label

    def __call__(self, args: tuple) -> Any:
        import torch

        out = self.entry(args)
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return out  # nothing can be compared inside a capture: the next eager call checks
        op = self.op
        want, why = op_agrees(op, out, args, op.variants[self.index])
        if not why:
            op.runtime.replace(args, self.entry)
            return out
        op.runtime.replace(args, op._fallback_entry(self.label, f"the kernel disagreed with the fallback here ({why})"))
        op.stats.fallback_calls += 1
        return want


def op_agrees(op: ExportedKernel, out: Any, args: tuple, v: KernelVariant) -> tuple[Any, str]:
    """The kernel's outputs against the fallback's on the same arguments, at the tolerance the kernel
    was checked at (with PyTorch at the precision it was checked at): the fallback's outputs, and ""
    or how far the kernel's are off."""
    import torch

    from kerngen.harness.gpu.compare import compare, gross_rel_err, rel_err_limit
    from kerngen.harness.results import CheckFailure
    from kerngen.problems.info import default_tolerance
    from kerngen.problems.torch_modes import precision_mode

    assert op.fallback is not None
    with precision_mode(op.manifest.precision), torch.no_grad():
        result = op.fallback.call(args)
    got = [out] if isinstance(out, torch.Tensor) else list(out)
    want = [result] if isinstance(result, torch.Tensor) else list(result)
    for g, w in zip(got, want):
        atol, rtol = (v.atol, v.rtol) if v.atol is not None and v.rtol is not None else default_tolerance(
            str(g.dtype).removeprefix("torch."))
        if g.shape != w.shape:
            return result, f"shape {tuple(g.shape)} where PyTorch gives {tuple(w.shape)}"
        # atol and rtol were met on the problem's own inputs; the caller's may be of any scale, where two honest
        # fp32 summation orders part by more than atol (a 4096-deep matmul of randn: ~1e-3). The relative error
        # of the whole output does not move with the scale: within the harness's limit it is rounding. At
        # --precision tf32 the export does not record the relative limit the harness measured: there only a
        # kernel that is wrong (past GROSS_REL_ERR, compare.py), not one less precise, falls back
        limit = rel_err_limit(g.dtype) if op.manifest.precision == "fp32" else gross_rel_err(g.dtype)
        c = compare(g, w.to(g.dtype), atol=atol, rtol=rtol, rel_limit=limit)
        if c.mismatches == 0 or (c.failed is CheckFailure.mismatch and c.rel_err <= limit):
            continue  # every element within atol/rtol (allclose), or rounding at the caller's scale
        if c.failed is CheckFailure.nan_mismatch:
            return result, f"NaN or inf where PyTorch has none (or the reverse); max abs error {c.max_abs_err:.3g}"
        return result, f"max abs error {c.max_abs_err:.3g} > atol {atol:g}, ||out-ref||/||ref|| {c.rel_err:.3g} > {limit:g}"
    return result, ""


def shape_bound_sizes(v: KernelVariant) -> list[str]:
    """The problem sizes a kernel's plan reads that follow the shapes (a size equal to a dimension
    of one of its tensors): at another shape nothing tells their values."""
    dims = {d for t in [*v.arguments, *v.outputs] for d in t.shape}
    tensors = {t.name for t in [*v.arguments, *v.outputs]} | {s.name for s in v.spec.scratch}
    own = set(v.spec.tunables) | set(v.spec.defines)
    read: set[str] = set()
    for _, text in v.spec.expressions():
        if isinstance(text, str):
            read |= expr.names_in(text)
    return sorted(n for n in read - own - tensors
                  if isinstance(v.sizes.get(n), int) and not isinstance(v.sizes.get(n), bool) and v.sizes[n] in dims)


def _distance(v: KernelVariant, shapes: tuple) -> float:
    """How far a bucket's argument sizes are from a call's (sum of |log| of the element-count ratios)."""
    total = 0.0
    for t, (shape, _) in zip(v.arguments, shapes):
        a, b = max(1, math.prod(t.shape)), max(1, math.prod(shape))
        total += abs(math.log(a / b))
    return total


def _torch_dtype(name: str) -> Any:
    from kerngen.harness.gpu.buffers import torch_dtype

    return torch_dtype(name)


__all__ = ["ExportedKernel", "FallbackWarning", "OpStats", "describe", "op_agrees", "shape_bound_sizes"]
