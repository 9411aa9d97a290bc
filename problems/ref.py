"""How to name a problem across processes and on disk: a built-in name or a file path, plus the
shape and dtype asked for on the command line."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from pydantic import BaseModel, ConfigDict


class ProblemRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str  # built-in name ("softmax") or path to a KernelBench-format .py file
    shape: tuple[int, ...] | None = None  # built-ins only: e.g. (8192, 1024)
    dtype: str | None = None  # built-ins only: "float32" | "float16" | "bfloat16"

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


def parse_problem_ref(source: str, shape: str | None = None, dtype: str | None = None) -> ProblemRef:
    """What the CLI turns ``PROBLEM --shape S --dtype D`` into."""
    return ProblemRef(
        source=source,
        shape=parse_shape(shape) if shape else None,
        dtype=canonical_dtype(dtype) if dtype else None,
    )
