"""How to name a problem across processes and on disk: a built-in name or a file path, plus the
shape and dtype asked for on the command line."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, field_validator, model_serializer


class ProblemRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str  # built-in name ("softmax") or path to a KernelBench-format .py file
    shape: tuple[int, ...] | None = None  # built-ins only: e.g. (8192, 1024)
    dtype: str | None = None  # built-ins only: "float32" | "float16" | "bfloat16"
    # what the kernels are checked against (torch_modes.Precision): None is true fp32, "tf32" PyTorch's
    # TF32 settings with a measured tolerance (--precision tf32)
    precision: str | None = None

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str | None) -> str | None:
        if value is None or value == "fp32":
            return None  # the default has one spelling, so that keys and labels stay as before
        if value != "tf32":
            raise ValueError(f"precision {str(value)[:20]!r} is not fp32 or tf32")
        return value

    @model_serializer(mode="wrap")
    def _drop_default_precision(self, handler: SerializerFunctionWrapHandler) -> dict:
        """True fp32 is written as before the field existed (journals, keys, exports read alike)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("precision") is None:
            data.pop("precision", None)
        return data

    def key(self) -> str:
        """Stable identity (used in cache keys and run folders)."""
        data = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    def label(self) -> str:
        parts = [self.source]
        if self.shape:
            parts.append("x".join(str(s) for s in self.shape))
        if self.dtype:
            parts.append(self.dtype)
        if self.precision:
            parts.append(f"[{self.precision}]")
        return " ".join(parts)


DTYPE_ALIASES = {
    "fp32": "float32", "float32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "float16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp64": "float64", "float64": "float64", "f64": "float64", "double": "float64",
}  # fmt: skip


def canonical_dtype(name: str) -> str:
    """``bf16``/``fp16``/``fp32``/``fp64`` and the long names (also ``torch.float32``) -> long name."""
    from kerngen.errors import ProblemError

    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise ProblemError(f"unknown dtype {name!r} (use bf16, fp16, fp32, fp64 or bfloat16, float16, float32, float64)")
    return DTYPE_ALIASES[key]


def parse_shape(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"8192x1024"`` (also ``8192,1024`` or ``(8192, 1024)``) -> ``(8192, 1024)``."""
    from kerngen.errors import ProblemError

    if not isinstance(text, str):
        dims = tuple(text)
    else:
        body = text.strip().strip("()[]").strip().lower()
        body = body[:-1] if body.endswith(",") else body  # "(8192,)": a Python tuple of one
        parts = re.split(r"\s*[x,*]\s*|\s+", body)
        if body and any(not p for p in parts):  # "4096x", "x4096", "4096xx8": a size is missing
            raise ProblemError(f"cannot read shape {text!r}: a size is missing (expected e.g. 8192x1024)")
        parts = [p for p in parts if p]
        try:
            dims = tuple(int(p.replace("_", "")) for p in parts)
        except ValueError:
            raise ProblemError(f"cannot read shape {text!r} (expected e.g. 8192x1024)") from None
    if not dims or any(not isinstance(d, int) or d <= 0 for d in dims):
        raise ProblemError(f"bad shape {text!r}: need one or more positive integers, e.g. 8192x1024")
    return dims


def parse_problem_ref(source: str, shape: str | None = None, dtype: str | None = None,
                      precision: str | None = None) -> ProblemRef:
    """What the CLI turns ``PROBLEM --shape S --dtype D --precision P`` into."""
    return ProblemRef(
        source=source,
        shape=parse_shape(shape) if shape else None,
        dtype=canonical_dtype(dtype) if dtype else None,
        precision=parse_precision(precision),
    )


def parse_precision(text: str | None) -> str | None:
    """``--precision``: fp32 (the default, None) or tf32."""
    from kerngen.errors import ProblemError

    if text is None:
        return None
    key = str(text).strip().lower()
    if key not in ("fp32", "tf32"):
        raise ProblemError(f"unknown precision {text!r} (use fp32, the default, or tf32)")
    return None if key == "fp32" else key


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``--shape`` with several shapes: ``1x4096,8x4096,64x4096`` (or separated by ``;``) -> three
    shapes. A comma between plain numbers (``8192,1024``, ``(8192, 1024)``) stays one shape, as before."""
    from kerngen.errors import ProblemError

    text = str(text).strip()
    parts = [p for p in text.split(";") if p.strip()]
    if len(parts) == 1 and "," in text and "x" in text.lower():
        parts = [p for p in text.split(",") if p.strip()]
    shapes = [parse_shape(p) for p in parts]
    if not shapes:
        raise ProblemError(f"bad shape {text!r}: need one or more positive integers, e.g. 8192x1024")
    if len(set(shapes)) != len(shapes):
        raise ProblemError(f"--shape {text!r} names a shape twice")
    return shapes
