"""What others code against: a problem's description (:class:`ProblemInfo`, its tensors as
:class:`TensorInfo`) and the default tolerances per dtype. Pure data: no torch at import."""

from __future__ import annotations

import math
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kerngen.expr import TensorFacts

from kerngen.problems.ref import ProblemRef

__all__ = ["DEFAULT_TOLERANCES", "ProblemInfo", "TensorInfo", "default_tolerance", "dtype_name", "shape_str"]

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (atol, rtol)
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
    "float64": (1e-7, 1e-7),
}


def default_tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) for a dtype name; integer and bool outputs compare (near) exactly."""
    if dtype in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype]
    return (1e-4, 1e-4) if "float" in dtype else (0.0, 0.0)


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def shape_str(shape: Sequence[int]) -> str:
    """``(8192, 1024)`` -> ``"8192x1024"``."""
    return "x".join(str(d) for d in shape)


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
            lines.append(f"shape: {shape_str(self.shape or ())} = {self.shape_doc}")
        lines.append("inputs: " + (", ".join(t.label() for t in self.inputs) or "(none)"))
        if self.scalars:
            lines.append("scalar inputs: " + ", ".join(f"{k}={v}" for k, v in self.scalars.items()))
        lines.append("parameters: " + (", ".join(t.label() for t in self.params) or "(none)"))
        lines.append("outputs: " + ", ".join(t.label() for t in self.outputs))
        lines.append("sizes: " + (", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "(none)"))
        flops = f"{_human(self.flops)}FLOP" if self.flops else "n/a (memory-bound)"
        lines.append(f"dtype: {self.dtype}; FLOPs: {flops}; minimum bytes moved: {_human(self.min_bytes)}B")
        if self.ref.precision == "tf32":
            lines.append(f"tolerance: measured at TF32 precision (below); at least atol={self.atol:g} rtol={self.rtol:g}")
            lines.append("precision: TF32 (--precision tf32): the reference runs with PyTorch's TF32 settings and "
                         "fp32 outputs are checked at 4x PyTorch's own TF32 error against fp64 (measured on the GPU), "
                         "so plain TF32 tensor-core products (1xTF32) and bf16x3 splits are admissible")
        else:
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
