"""How a speedup is said wherever one is printed (show, runs, suite, report, bench, generate's
summary): against PyTorch in true fp32 (TF32 off: what the check compares with at the default
precision) and against PyTorch at its defaults (cuDNN convolutions in TF32: what a user's PyTorch
runs), each labelled plainly."""

from __future__ import annotations

import math
from typing import Any, Mapping

from kerngen.problems.torch_modes import DEFAULTS_LABEL

TRUE_FP32 = "vs PyTorch (true fp32)"
SHORT_NOTE = "fp32: vs PyTorch (true fp32); dflt: vs {label}; comp.: torch.compile"
_SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def pytorch_precision(dtype: str) -> tuple[str, str]:
    """(column tag, label) of PyTorch's timings of a problem whose main dtype is ``dtype``: an fp32 problem's run in
    true fp32 (TF32 off), ("fp32", "true fp32"); a bf16 or fp16 one's in that dtype as written, ("bf16", "bf16")."""
    tag = _SHORT_DTYPES.get(dtype, dtype)
    return tag, "true fp32" if dtype == "float32" else tag


def short_note(label: str, dtype: str = "float32") -> str:
    """SHORT_NOTE for one problem in ``dtype`` (``kerngen bench``): its PyTorch rows' precision named as they ran."""
    tag, ran = pytorch_precision(dtype)
    return f"{tag}: vs PyTorch ({ran}); dflt: vs {label}; comp.: torch.compile"


def vs_defaults(label: str | None) -> str:
    """``vs PyTorch defaults (TF32 conv)`` (or the label a baseline recorded)."""
    return f"vs {label or DEFAULTS_LABEL}"


def times(value: float | None) -> str | None:
    return None if value is None or not math.isfinite(value) else f"{value:.2f}x"


def speedup_line(f: Mapping[str, Any], eager: str = "eager", compiled: str = "torch.compile") -> str:
    """``1.41x eager, 1.39x torch.compile vs PyTorch (true fp32); 0.74x eager, 0.70x torch.compile vs
    PyTorch defaults (TF32 conv)`` from :meth:`kerngen.agent.tree.Tree.figures` (or any mapping with
    its keys); "" without a baseline. The defaults' part is left out for a baseline recorded before
    they were measured."""
    parts = []
    for suffix, label in (("", TRUE_FP32), ("_defaults", vs_defaults(f.get("defaults_label")))):
        bits = [f"{t} {word}" for key, word in (("speedup_eager", eager), ("speedup_compile", compiled))
                if (t := times(f.get(key + suffix))) is not None]
        if bits:
            parts.append(f"{', '.join(bits)} {label}")
    return "; ".join(parts)


__all__ = ["SHORT_NOTE", "TRUE_FP32", "pytorch_precision", "short_note", "speedup_line", "times", "vs_defaults"]
