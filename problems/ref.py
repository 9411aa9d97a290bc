"""How to name a problem across processes and on disk: a built-in name or a file path, plus the
shape and dtype asked for on the command line."""

from __future__ import annotations

import hashlib
import json

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
    "fp32": "float32", "float32": "float32", "float": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}


def parse_shape(text: str) -> tuple[int, ...]:
    """``8192x1024`` (or ``8192,1024``) -> (8192, 1024)."""
    parts = text.lower().replace(",", "x").replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts if p.strip())
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        from kerngen.harness.errors import ProblemError

        raise ProblemError(f"bad shape {text!r}: expected positive integers like 8192x1024")
    return dims


def parse_dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        from kerngen.harness.errors import ProblemError

        raise ProblemError(f"unknown dtype {text!r}: use fp32, fp16 or bf16")
    return name


def parse_problem_ref(source: str, shape: str | None = None, dtype: str | None = None) -> ProblemRef:
    """What the CLI turns ``PROBLEM --shape S --dtype D`` into."""
    return ProblemRef(
        source=source,
        shape=parse_shape(shape) if shape else None,
        dtype=parse_dtype(dtype) if dtype else None,
    )
