"""A loaded problem: a KernelBench-format Python file's module, described and run as a reference.

The file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()`` (as in
KernelBench levels 1 and 2, which load unchanged). Optional metadata of ours::

    KERNGEN_META = {"atol": 1e-4, "rtol": 1e-4, "flops": "2*M*N*K", "min_bytes": ..., "description": "..."}

every key optional; ``flops`` and ``min_bytes`` are numbers or expressions
(:mod:`kerngen.expr`) over the problem's sizes and tensor facts, so they follow shape
overrides. Default tolerances follow the main dtype (:data:`kerngen.problems.info.DEFAULT_TOLERANCES`).

Get one with :func:`kerngen.problems.load.load_problem` (loaded once per process). Everything
:class:`~kerngen.problems.info.ProblemInfo` reports is computed on the meta device (falling back
to fake tensors, then to real CPU tensors for small problems whose ops have no meta kernels), so
describing a multi-GB problem is fast and needs no GPU.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from kerngen.errors import ProblemError
from kerngen.expr import TensorFacts

from kerngen.problems.info import ProblemInfo, TensorInfo, default_tolerance, dtype_name
from kerngen.problems.ref import ProblemRef
from kerngen.problems.torch_modes import force_device_mode, seeded, set_precision

if TYPE_CHECKING:  # torch is imported inside functions so that importing this module stays cheap
    import torch
    from torch import Tensor, nn

__all__ = ["Problem", "exc_line", "named_tensors"]

_FALLBACK_CPU_BYTES = 1 << 30  # describe on real CPU tensors only below this many input bytes


def exc_line(exc: BaseException) -> str:
    """An exception as one short line: ``TypeName: message`` (for one-line ProblemErrors)."""
    text = " ".join(str(exc).split())
    if len(text) > 240:
        text = text[:237] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Problem:
    """A loaded problem. ``info`` is computed at load on the meta device. ``text`` is the file's
    content that ``module`` ran (``sha256`` its digest); one Problem is shared by every user in a
    process (:func:`kerngen.problems.load.load_problem`), so treat it as read-only."""

    def __init__(self, ref: ProblemRef, path: Path, module: ModuleType, builtin: bool, *, text: str,
                 sha256: str) -> None:
        self.ref = ref
        self.path = Path(path)
        self.module = module
        self.builtin = builtin
        self.name = self.path.stem
        self.text = text
        self.sha256 = sha256
        self._arg_names = self._forward_arg_names()
        self.info: ProblemInfo = self._describe()

    def __repr__(self) -> str:
        return f"Problem({self.ref.label()!r}, path={str(self.path)!r})"

    # -- public API ---------------------------------------------------------------------------

    def source(self) -> str:
        """The reference's Python source text (as loaded: the module ran exactly this)."""
        return self.text

    @property
    def dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.info.dtype)

    def build_model(self, device: Any = "cpu", seed: int = 0) -> "nn.Module":
        """The reference model: seeded, ``eval()``, ``requires_grad`` off, in the problem dtype,
        on ``device``; every floating parameter then perturbed from ``seed`` (``p += 0.1*randn*(p.std() or 1)``) so a
        kernel cannot pass by assuming default-initialised weights. Buffers are left alone."""
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            set_precision(self.ref.precision)  # true fp32, or TF32 at --precision tf32
        model = self._construct(dev, seed)
        if dev.type != "meta":
            _perturb(model, seed, dev)
        model.requires_grad_(False)  # a reference: no autograd graph even outside no_grad()
        return model

    def make_inputs(self, device: Any = "cpu", seed: int = 0) -> list:
        """``get_inputs()`` run directly on ``device`` under ``seed`` (different seeds, different
        data); built-ins' floating inputs in the problem dtype. Non-tensor inputs (a Python
        scalar, as in some KernelBench files) pass through. Raises :class:`ProblemError` if an
        input tensor is all zeros."""
        import torch

        dev = torch.device(device)
        inputs = self._raw_inputs(dev, seed)
        for name, x in zip(self._names_for(len(inputs)), inputs):
            if isinstance(x, torch.Tensor) and dev.type != "meta" and x.numel() > 0 and not bool(x.any()):
                raise ProblemError(f"{self.path}: input {name!r} is all zeros (seed {seed})")
        return inputs

    def run_reference(self, model: "nn.Module", inputs: Sequence[Any]) -> list["Tensor"]:
        """``model(*inputs)`` without autograd; always a list of tensors."""
        import torch

        if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs):
            set_precision(self.ref.precision)
        with torch.no_grad():
            out = model(*inputs)
        return _as_list(out, str(self.path))

    def bindings(self, model: "nn.Module", inputs: Sequence[Any], outputs: Sequence["Tensor"]) -> dict[str, "Tensor"]:
        """name -> tensor for the inputs, the model's parameters and buffers, and the outputs,
        named exactly as in :attr:`info`."""
        import torch

        out: dict[str, Tensor] = {}
        for name, x in zip(self._names_for(len(inputs)), inputs):
            if isinstance(x, torch.Tensor):
                out[name] = x
        for name, t in named_tensors(model, set(out)):
            out[name] = t
        for name, t in zip(_output_names(len(outputs)), outputs):
            out[name] = t
        return out

    def scalar_values(self, inputs: Sequence[Any]) -> dict[str, int | float]:
        """The non-tensor inputs by name (they are also in ``info.sizes``)."""
        import torch

        return {
            n: x for n, x in zip(self._names_for(len(inputs)), inputs)
            if isinstance(x, (int, float)) and not isinstance(x, (bool, torch.Tensor))
        }  # fmt: skip

    # -- internals ----------------------------------------------------------------------------

    def _forward_arg_names(self) -> list[str]:
        try:
            sig = inspect.signature(self.module.Model.forward)
        except (TypeError, ValueError):
            return []
        names: list[str] = []
        for i, p in enumerate(sig.parameters.values()):
            if i == 0 and p.name == "self":
                continue
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            else:
                break
        return names

    def _names_for(self, n: int) -> list[str]:
        names = list(self._arg_names[:n])
        names += [f"in{i}" for i in range(len(names), n)]
        return names

    def _construct(self, dev: "torch.device", seed: int) -> "nn.Module":
        with seeded(seed, dev), force_device_mode(dev):
            init = self._call("get_init_inputs()", getattr(self.module, "get_init_inputs", lambda: []))
            if isinstance(init, dict) or init is None:
                raise ProblemError(f"{self.path}: get_init_inputs() must return a list")
            model = self._call("Model(*get_init_inputs())", lambda: self.module.Model(*list(init)))
        if self.builtin:
            model = model.to(dtype=self.module.DTYPE)
        model.eval()
        return model

    def _raw_inputs(self, dev: "torch.device", seed: int) -> list:
        import torch

        with seeded(seed, dev), force_device_mode(dev):
            raw = self._call("get_inputs()", self.module.get_inputs)
        if isinstance(raw, torch.Tensor) or not isinstance(raw, (list, tuple)):
            raise ProblemError(f"{self.path}: get_inputs() must return a list, got {type(raw).__name__}")
        inputs = list(raw)
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                if x.device != dev and not (dev.type == "cuda" and x.device.type == "cuda" and dev.index is None):
                    x = x.to(dev)  # e.g. made from numpy
                if self.builtin and x.is_floating_point() and x.dtype != self.module.DTYPE:
                    x = x.to(self.module.DTYPE)
                inputs[i] = x
        return inputs

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except ProblemError:
            raise
        except Exception as exc:
            raise _StageError(what, exc) from exc

    def _forward(self, model: "nn.Module", inputs: list, dev: "torch.device") -> list:
        import torch

        with torch.no_grad(), force_device_mode(dev):
            out = self._call("forward", lambda: model(*inputs))
        return _as_list(out, str(self.path))

    def _trace(self, dev: "torch.device", fake: bool) -> tuple[list, list, list, float]:
        """(inputs, named params, outputs, counted FLOPs) on ``dev``, optionally under fake tensors."""
        from torch.utils.flop_counter import FlopCounterMode

        ctx: Any = contextlib.nullcontext()
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            ctx = FakeTensorMode(allow_non_fake_inputs=True)
        with ctx:
            model = self._construct(dev, 0)
            inputs = self._raw_inputs(dev, 0)
            self._traced_input_bytes = _tensor_bytes(inputs)
            counter = FlopCounterMode(display=False)
            with counter:
                outputs = self._forward(model, inputs, dev)
            params = list(named_tensors(model, set(self._names_for(len(inputs)))))
        return inputs, params, outputs, float(counter.get_total_flops())

    def _describe(self) -> ProblemInfo:
        import torch

        self._traced_input_bytes: int | None = None
        attempts = [(torch.device("meta"), False), (torch.device("cpu"), True)]
        error: _StageError | None = None
        traced = None
        for dev, fake in attempts:
            try:
                traced = self._trace(dev, fake)
                break
            except _StageError as exc:
                error = exc
            except ProblemError:
                raise
            except Exception as exc:  # a meta/fake limitation outside the file's own code
                error = _StageError("describe", exc)
        if traced is None:
            known = self._traced_input_bytes
            if known is None or known <= _FALLBACK_CPU_BYTES:
                try:
                    traced = self._trace(torch.device("cpu"), False)
                except _StageError as exc:
                    error = exc
        if traced is None:
            assert error is not None
            raise ProblemError(f"{self.path}: {error.what} failed: {exc_line(error.exc)}")
        inputs, params, outputs, counted = traced
        return self._info(inputs, params, outputs, counted)

    def _info(self, inputs: list, params: list, outputs: list, counted: float) -> ProblemInfo:
        import torch

        names = self._names_for(len(inputs))
        in_infos, scalars = [], {}
        for name, x in zip(names, inputs):
            if isinstance(x, torch.Tensor):
                in_infos.append(TensorInfo(name=name, shape=tuple(x.shape), dtype=dtype_name(x.dtype)))
            elif isinstance(x, (int, float)) and not isinstance(x, bool):
                scalars[name] = x
        param_infos = [TensorInfo(name=n, shape=tuple(t.shape), dtype=dtype_name(t.dtype)) for n, t in params]
        out_infos = [
            TensorInfo(name=n, shape=tuple(t.shape), dtype=dtype_name(t.dtype))
            for n, t in zip(_output_names(len(outputs)), outputs)
        ]
        taken = {t.name for t in [*in_infos, *param_infos]}
        clash = taken & {t.name for t in out_infos}
        if clash:
            raise ProblemError(f"{self.path}: output name(s) {', '.join(sorted(clash))} clash with inputs or parameters")

        sizes: dict[str, int | float] = {}
        for key, value in vars(self.module).items():
            if key.startswith("_") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            sizes[key] = value
        shape = None
        if self.builtin:
            shape = tuple(int(d) for d in self.module.SHAPE)
            shape_names = tuple(getattr(self.module, "SHAPE_NAMES", ()))
            if len(shape_names) != len(shape):
                shape_names = tuple(f"d{i}" for i in range(len(shape)))
            sizes.update(zip(shape_names, shape))
        sizes.update(scalars)

        float_inputs = [t for t in in_infos if "float" in t.dtype]
        float_params = [t for t in param_infos if "float" in t.dtype]
        main = (float_inputs or float_params or out_infos or [None])[0]
        dtype = main.dtype if main is not None else "float32"
        atol, rtol = default_tolerance(dtype)

        meta = dict(getattr(self.module, "KERNGEN_META", None) or {})
        atol = float(meta.get("atol", atol))
        rtol = float(meta.get("rtol", rtol))
        env: dict[str, Any] = dict(sizes)
        env.update({t.name: TensorFacts(tuple(t.shape)) for t in [*in_infos, *param_infos, *out_infos]})
        flops: float | None
        if "flops" in meta and meta["flops"] is not None:
            flops, flops_source = float(self._meta_number(meta, "flops", env)), "meta"
        else:
            flops, flops_source = (counted, "counted") if counted > 0 else (None, "none")
        if "min_bytes" in meta and meta["min_bytes"] is not None:
            min_bytes = int(self._meta_number(meta, "min_bytes", env))
        else:
            min_bytes = sum(t.nbytes for t in [*in_infos, *param_infos, *out_infos])
        description = str(meta.get("description") or "") or _doc_line(self.module.Model) or _doc_line(self.module)

        return ProblemInfo(
            name=self.name,
            ref=self.ref,
            path=str(self.path),
            description=description,
            inputs=in_infos,
            params=param_infos,
            outputs=out_infos,
            sizes=sizes,
            flops=flops,
            min_bytes=min_bytes,
            atol=atol,
            rtol=rtol,
            dtype=dtype,
            builtin=self.builtin,
            shape=shape,
            shape_doc=str(getattr(self.module, "SHAPE_DOC", "")) if self.builtin else "",
            args=names,
            scalars=scalars,
            flops_source=flops_source,
        )

    def _meta_number(self, meta: dict, key: str, env: dict) -> float:
        from kerngen import expr
        from kerngen.errors import ExprError

        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ProblemError(f"{self.path}: KERNGEN_META[{key!r}] must be a number or an expression string")
        try:
            result = expr.evaluate(value, env)
        except ExprError as exc:
            raise ProblemError(f"{self.path}: KERNGEN_META[{key!r}]: {exc}") from None
        if result < 0:
            raise ProblemError(f"{self.path}: KERNGEN_META[{key!r}] is negative ({result})")
        return result


class _StageError(Exception):
    """An exception raised by the problem file's own code (get_inputs, Model, forward)."""

    def __init__(self, what: str, exc: BaseException) -> None:
        super().__init__(f"{what}: {exc}")
        self.what = what
        self.exc = exc


def named_tensors(model: "nn.Module", taken: set[str]) -> Iterator[tuple[str, "Tensor"]]:
    """named_parameters() then named_buffers(); a name that clashes with an input gets ``model.``."""
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        yield (f"model.{name}" if name in taken else name), t


def _tensor_bytes(values: Sequence[Any]) -> int:
    import torch

    return sum(x.numel() * x.element_size() for x in values if isinstance(x, torch.Tensor))


def _perturb(model: "nn.Module", seed: int, dev: "torch.device") -> None:
    """``p += 0.1 * randn * (p.std() or 1)`` for every floating parameter, from ``seed``."""
    import torch

    gen = torch.Generator(device=dev)
    gen.manual_seed((seed * 0x9E3779B1 + 0x5EED) % (2**63))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if not p.is_floating_point() or p.numel() == 0:
                continue
            std = float(p.detach().float().std()) if p.numel() > 1 else float("nan")
            scale = std if math.isfinite(std) and std > 0 else 1.0
            noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
            p.add_((noise * (0.1 * scale)).to(p.dtype))


def _doc_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    if not doc or doc == inspect.getdoc(object) or doc.startswith("Base class for all neural network"):
        return ""
    para = doc.strip().split("\n\n")[0]
    return " ".join(para.split())


def _as_list(out: Any, what: str) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    raise ProblemError(f"{what}: forward must return a tensor or a tuple/list of tensors, got {type(out).__name__}")


def _output_names(n: int) -> list[str]:
    return ["out"] if n == 1 else [f"out{i}" for i in range(n)]
