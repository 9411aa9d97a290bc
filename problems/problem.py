"""A problem: a KernelBench-format Python file, loaded, described and run as a reference.

The file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()`` (as in
KernelBench levels 1 and 2, which load unchanged). Optional metadata of ours::

    KERNGEN_META = {"atol": 1e-4, "rtol": 1e-4, "flops": "2*M*N*K", "min_bytes": ..., "description": "..."}

every key optional; ``flops`` and ``min_bytes`` are numbers or expressions
(:mod:`kerngen.expr`) over the problem's sizes and tensor facts, so they follow shape
overrides. Default tolerances follow the main dtype (:data:`DEFAULT_TOLERANCES`).

Built-ins (``problems/suite``) take other shapes and dtypes: see :mod:`kerngen.problems.registry`
for the module-level ``SHAPE`` / ``DTYPE`` convention the loader overrides.

Everything :class:`ProblemInfo` reports is computed on the meta device (falling back to fake
tensors, then to real CPU tensors for small problems whose ops have no meta kernels), so
describing a multi-GB problem is fast and needs no GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import math
import random
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kerngen.errors import ProblemError
from kerngen.expr import TensorFacts

from . import registry
from .ref import ProblemRef, canonical_dtype, parse_shape

if TYPE_CHECKING:  # torch is imported inside functions so that importing this module stays cheap
    import torch
    from torch import Tensor, nn

__all__ = [
    "DEFAULT_TOLERANCES",
    "Problem",
    "ProblemInfo",
    "TensorInfo",
    "canonical_dtype",
    "default_tolerance",
    "load_problem",
    "normalize_ref",
    "parse_shape",
    "strict_fp32",
]

# ---------------------------------------------------------------------------------------------
# dtypes, shapes, tolerances

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (atol, rtol)
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
    "float64": (1e-7, 1e-7),
}

_META_KEYS = {"atol", "rtol", "flops", "min_bytes", "description"}
_FALLBACK_CPU_BYTES = 1 << 30  # describe on real CPU tensors only below this many input bytes


def default_tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) for a dtype name; integer and bool outputs compare (near) exactly."""
    if dtype in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype]
    return (1e-4, 1e-4) if "float" in dtype else (0.0, 0.0)


def strict_fp32() -> None:
    """fp32 references must be true fp32: no TF32 in cuBLAS or cuDNN. Call before building or
    running a reference on CUDA (cheap; idempotent)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # torch >= 2.9 also has per-backend fp32_precision settings; make them explicit ("ieee"),
    # since cuDNN conv's default there is "tf32" and the legacy flag only resets it to "none".
    for backend in (getattr(torch.backends.cuda, "matmul", None), getattr(torch.backends.cudnn, "conv", None),
                    getattr(torch.backends.cudnn, "rnn", None)):  # fmt: skip
        if backend is not None and hasattr(backend, "fp32_precision"):
            try:
                backend.fp32_precision = "ieee"
            except (RuntimeError, ValueError, AttributeError):  # pragma: no cover - older torch
                pass


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_str(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


# ---------------------------------------------------------------------------------------------
# the description others code against


class TensorInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", "int64", ... (no "torch.")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    def label(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(str(d) for d in self.shape)}]"


class ProblemInfo(BaseModel):
    name: str
    ref: ProblemRef
    path: str
    description: str
    inputs: list[TensorInfo]  # tensor inputs, named by Model.forward's parameter names
    params: list[TensorInfo]  # named_parameters() then named_buffers(), dotted names
    outputs: list[TensorInfo]  # "out" if one output, else "out0", "out1", ...
    sizes: dict[str, int | float]  # module-level int/float constants + SHAPE dims + scalar inputs
    flops: float | None
    min_bytes: int
    atol: float
    rtol: float
    dtype: str  # main dtype: the first float input's
    # extensions
    builtin: bool = False
    shape: tuple[int, ...] | None = None  # built-ins: the effective SHAPE
    shape_doc: str = ""  # built-ins: what SHAPE means
    args: list[str] = Field(default_factory=list)  # forward's arguments in call order (tensors and scalars)
    scalars: dict[str, int | float] = Field(default_factory=dict)  # non-tensor inputs (also in sizes)
    flops_source: str = "none"  # "meta" (KERNGEN_META), "counted" (FlopCounterMode) or "none"

    def tensor_facts(self) -> dict[str, TensorFacts]:
        """Every bindable tensor name (inputs, params, outputs) -> its facts, for expressions."""
        return {t.name: TensorFacts(tuple(t.shape)) for t in [*self.inputs, *self.params, *self.outputs]}

    def tensors(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in [*self.inputs, *self.params, *self.outputs]}

    def summary(self) -> str:
        """A few human-readable lines (for prompts and the CLI)."""
        head = f"problem: {self.name}" + (f" ({self.ref.label()})" if self.ref.label() != self.name else "")
        lines = [head]
        if self.description:
            lines.append(f"description: {self.description}")
        if self.shape_doc:
            lines.append(f"shape: {_shape_str(self.shape or ())} = {self.shape_doc}")
        lines.append("inputs: " + (", ".join(t.label() for t in self.inputs) or "(none)"))
        if self.scalars:
            lines.append("scalar inputs: " + ", ".join(f"{k}={v}" for k, v in self.scalars.items()))
        lines.append("parameters: " + (", ".join(t.label() for t in self.params) or "(none)"))
        lines.append("outputs: " + ", ".join(t.label() for t in self.outputs))
        lines.append("sizes: " + (", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "(none)"))
        flops = f"{_human(self.flops)}FLOP" if self.flops else "n/a (memory-bound)"
        lines.append(f"dtype: {self.dtype}; FLOPs: {flops}; minimum bytes moved: {_human(self.min_bytes)}B")
        lines.append(f"tolerance: atol={self.atol:g} rtol={self.rtol:g}")
        return "\n".join(lines)


def _human(x: float | int | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:g} "


_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip


def _itemsize(dtype: str) -> int:
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    import torch

    return getattr(torch, dtype).itemsize


# ---------------------------------------------------------------------------------------------
# loading


_load_counter = itertools.count()


def normalize_ref(ref: ProblemRef | str) -> ProblemRef:
    """Canonical dtype names (``bf16`` -> ``bfloat16``); shapes stay as given until loaded."""
    if isinstance(ref, str):
        ref = ProblemRef(source=ref)
    if ref.dtype is not None:
        ref = ref.model_copy(update={"dtype": canonical_dtype(ref.dtype)})
    return ref


def _resolve_source(source: str) -> tuple[Path, bool]:
    """(path, is_builtin). A bare built-in name wins over a same-named file without ``.py``."""
    if registry.is_builtin(source) and not source.endswith(".py") and "/" not in source:
        return registry.builtin_path(source), True
    path = Path(source).expanduser()
    if not path.is_file():
        if path.is_dir():
            raise ProblemError(f"{source} is a folder, not a problem file")
        raise ProblemError(
            f"problem {source!r} not found: neither a file nor a built-in ({', '.join(registry.builtin_names())})"
        )
    path = path.resolve()
    builtin = path.parent == registry.SUITE_DIR and registry.is_builtin(path.stem)
    return path, builtin


def _import_file(path: Path) -> ModuleType:
    stem = re.sub(r"\W", "_", path.stem)
    name = f"kerngen_problem_{stem}_{next(_load_counter)}"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ProblemError(f"{path}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
    except ProblemError:
        raise
    except Exception as exc:
        raise ProblemError(f"{path}: cannot be imported: {_exc_line(exc)}") from None
    sys.modules[name] = module  # inspect.getsource, dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise ProblemError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise ProblemError(f"{path}: error while importing: {_exc_line(exc)}") from None
    return module


def _exc_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 240:
        text = text[:237] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_module(module: ModuleType, path: Path) -> None:
    from torch import nn

    model = getattr(module, "Model", None)
    if model is None:
        raise ProblemError(f"{path}: no `class Model(nn.Module)` defined")
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise ProblemError(f"{path}: `Model` must be a subclass of torch.nn.Module")
    if not callable(getattr(module, "get_inputs", None)):
        raise ProblemError(f"{path}: no `get_inputs()` function defined")
    init = getattr(module, "get_init_inputs", None)
    if init is not None and not callable(init):
        raise ProblemError(f"{path}: `get_init_inputs` must be a function")
    meta = getattr(module, "KERNGEN_META", None)
    if meta is not None:
        if not isinstance(meta, dict):
            raise ProblemError(f"{path}: KERNGEN_META must be a dict")
        unknown = set(meta) - _META_KEYS
        if unknown:
            raise ProblemError(
                f"{path}: unknown KERNGEN_META key(s) {', '.join(sorted(map(str, unknown)))} "
                f"(known: {', '.join(sorted(_META_KEYS))})"
            )
        for key in ("atol", "rtol"):
            if key in meta and (not isinstance(meta[key], (int, float)) or meta[key] < 0):
                raise ProblemError(f"{path}: KERNGEN_META[{key!r}] must be a number >= 0")


def _apply_overrides(module: ModuleType, ref: ProblemRef, path: Path, builtin: bool) -> ProblemRef:
    """Set SHAPE / DTYPE of a built-in from the ref; return the ref with the canonical shape."""
    import torch

    if not builtin:
        if ref.shape is not None or ref.dtype is not None:
            raise ProblemError(
                f"{path}: --shape/--dtype apply to built-in problems only; edit the file's sizes instead"
            )
        return ref
    name = path.stem
    names = tuple(getattr(module, "SHAPE_NAMES", ()))
    doc = getattr(module, "SHAPE_DOC", "")
    if ref.shape is not None:
        shape = tuple(ref.shape)
        arity = tuple(getattr(module, "SHAPE_ARITY", (len(names),)))
        if len(shape) not in arity:
            want = " or ".join(str(a) for a in arity)
            raise ProblemError(
                f"{name}: shape {_shape_str(shape)} has {len(shape)} dim(s), expected {want} ({doc})"
            )
        if any(int(d) <= 0 for d in shape):
            raise ProblemError(f"{name}: shape {_shape_str(shape)} has a dimension <= 0")
        canon = getattr(module, "canonical_shape", None)
        if callable(canon):
            try:
                shape = tuple(int(d) for d in canon(shape))
            except ValueError as exc:
                raise ProblemError(f"{name}: shape {_shape_str(shape)} refused: {exc}") from None
        module.SHAPE = shape
        ref = ref.model_copy(update={"shape": shape})
    if ref.dtype is not None:
        module.DTYPE = getattr(torch, canonical_dtype(ref.dtype))
    return ref


def load_problem(ref: ProblemRef | str) -> Problem:
    """Load a built-in (by name) or a KernelBench-format file (by path); str = name or path.

    Raises :class:`ProblemError` (one line naming the file) for anything that cannot be loaded
    or described."""
    ref = normalize_ref(ref)
    path, builtin = _resolve_source(ref.source)
    module = _import_file(path)
    _check_module(module, path)
    ref = _apply_overrides(module, ref, path, builtin)
    return Problem(ref, path, module, builtin)


# ---------------------------------------------------------------------------------------------
# devices and seeds


def _force_device_mode(device: Any):
    """A torch-function mode that puts every tensor a problem file creates on ``device``:
    factory functions (``torch.randn(..., device='cuda')`` included), ``Tensor.cuda()``,
    ``Tensor.cpu()`` and ``Tensor.to(<device>)``. So ``get_inputs`` lands directly on the GPU
    (no host copy of GB inputs), and files that hard-code ``.cuda()`` still describe on meta
    and run on a CPU-only machine."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    dev = torch.device(device)
    constructors = _device_constructors()
    tensor_cuda, tensor_cpu, tensor_to = torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.to

    class _ForceDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in constructors:
                kwargs["device"] = dev
            elif func is tensor_cuda or func is tensor_cpu:
                kwargs.pop("device", None)
                return tensor_to(args[0], dev, **{k: v for k, v in kwargs.items() if k == "non_blocking"})
            elif func is tensor_to:
                args = tuple(
                    dev if i > 0 and isinstance(a, (str, torch.device)) else a for i, a in enumerate(args)
                )
                if "device" in kwargs:
                    kwargs["device"] = dev
            return func(*args, **kwargs)

    return _ForceDevice()


@contextlib.contextmanager
def _seeded(seed: int, device: Any) -> Iterator[None]:
    """Seed torch (CPU and the device), ``random`` and numpy; restore their states afterwards."""
    import torch

    dev = torch.device(device)
    devices: list[int] = []
    if dev.type == "cuda":
        devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    py_state = random.getstate()
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            if np is not None:
                np.random.seed(seed % (2**32))
            yield
    finally:
        random.setstate(py_state)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)


def _as_list(out: Any, what: str) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    raise ProblemError(f"{what}: forward must return a tensor or a tuple/list of tensors, got {type(out).__name__}")


def _output_names(n: int) -> list[str]:
    return ["out"] if n == 1 else [f"out{i}" for i in range(n)]


# ---------------------------------------------------------------------------------------------
# the problem


class Problem:
    """A loaded problem. ``info`` is computed at load on the meta device."""

    def __init__(self, ref: ProblemRef, path: Path, module: ModuleType, builtin: bool) -> None:
        self.ref = ref
        self.path = Path(path)
        self.module = module
        self.builtin = builtin
        self.name = path.stem
        self._arg_names = self._forward_arg_names()
        self.info: ProblemInfo = self._describe()

    def __repr__(self) -> str:
        return f"Problem({self.ref.label()!r}, path={str(self.path)!r})"

    # -- public API ---------------------------------------------------------------------------

    def source(self) -> str:
        """The reference's Python source text."""
        return self.path.read_text()

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
            strict_fp32()
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
            strict_fp32()
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
        for name, t in _named_tensors(model, set(out)):
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
        with _seeded(seed, dev), _force_device_mode(dev):
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

        with _seeded(seed, dev), _force_device_mode(dev):
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

        with torch.no_grad(), _force_device_mode(dev):
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
            params = list(_named_tensors(model, set(self._names_for(len(inputs)))))
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
            raise ProblemError(f"{self.path}: {error.what} failed: {_exc_line(error.exc)}")
        inputs, params, outputs, counted = traced
        return self._info(inputs, params, outputs, counted)

    def _info(self, inputs: list, params: list, outputs: list, counted: float) -> ProblemInfo:
        import torch

        names = self._names_for(len(inputs))
        in_infos, scalars = [], {}
        for name, x in zip(names, inputs):
            if isinstance(x, torch.Tensor):
                in_infos.append(TensorInfo(name=name, shape=tuple(x.shape), dtype=_dtype_name(x.dtype)))
            elif isinstance(x, (int, float)) and not isinstance(x, bool):
                scalars[name] = x
        param_infos = [TensorInfo(name=n, shape=tuple(t.shape), dtype=_dtype_name(t.dtype)) for n, t in params]
        out_infos = [
            TensorInfo(name=n, shape=tuple(t.shape), dtype=_dtype_name(t.dtype))
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


def _named_tensors(model: "nn.Module", taken: set[str]) -> Iterator[tuple[str, "Tensor"]]:
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
