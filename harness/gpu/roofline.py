"""The roofline floor of a problem on a GPU, from its measured ceilings. Pure functions.

floor = max(flops / rate(dtype), min_bytes / copy bandwidth), in milliseconds, where rate is the
measured fp32 (no TF32) matmul rate for fp32 and the measured bf16 matmul rate for bf16/fp16,
and the copy bandwidth counts bytes read plus bytes written. The larger term names the bound.
"""

from __future__ import annotations

import math

from kerngen.harness.results import GpuFacts

_FP32 = {"fp32", "float32", "float", "f32", "torch.float32"}
_HALF = {"bf16", "bfloat16", "torch.bfloat16", "fp16", "float16", "half", "f16", "torch.float16"}


def compute_rate_tflops(dtype: str, facts: GpuFacts) -> float | None:
    """The measured rate (TFLOP/s) that bounds arithmetic in ``dtype``, or None when none is
    known (an unmeasured ceiling, or a dtype with no measured rate such as fp64 or int8)."""
    d = str(dtype).strip().lower()
    if d in _FP32:
        return facts.fp32_tflops
    if d in _HALF:
        return facts.bf16_tflops
    return None


def compute_ms(flops: float, tflops: float) -> float:
    """Milliseconds to do ``flops`` operations at ``tflops`` TFLOP/s."""
    return flops / (tflops * 1e12) * 1e3


def memory_ms(nbytes: float, gbps: float) -> float:
    """Milliseconds to move ``nbytes`` at ``gbps`` GB/s (1e9 bytes per second)."""
    return nbytes / (gbps * 1e9) * 1e3


def floor_ms(flops: float | None, min_bytes: int | None, dtype: str, facts: GpuFacts) -> tuple[float | None, str]:
    """``(floor in ms, "memory" | "compute")``; ``(None, "")`` when neither term is known.

    A term is left out when its count is None or non-positive, or when the ceiling it needs is
    unknown (not measured, or no rate for ``dtype``). A tie counts as memory-bound.
    """
    mem = None
    if min_bytes is not None and min_bytes > 0 and facts.copy_gbps:
        mem = memory_ms(float(min_bytes), facts.copy_gbps)
    comp = None
    rate = compute_rate_tflops(dtype, facts)
    if flops is not None and flops > 0 and rate:
        comp = compute_ms(float(flops), rate)
    if mem is None and comp is None:
        return None, ""
    if comp is None or (mem is not None and mem >= comp):
        return mem, "memory"
    return comp, "compute"


def pct_of_roofline(ms: float, floor: float | None) -> float:
    """How close a time is to the floor, in percent: ``100 * floor / ms`` (100 = at the floor).
    0.0 when the floor is unknown or the time is not a positive finite number."""
    if floor is None or not floor > 0 or not math.isfinite(floor):
        return 0.0
    if not ms > 0 or not math.isfinite(ms):
        return 0.0
    return 100.0 * floor / ms
