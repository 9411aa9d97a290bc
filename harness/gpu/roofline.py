"""The roofline floor of a problem on a GPU: the time no correct kernel can beat. Pure functions.

floor = max(flops / peak rate, min_bytes / peak bandwidth), in milliseconds, from the GPU model's
data sheet (:mod:`.peaks`), where the peak rate is the fastest arithmetic a kernel may use and
still pass the check at the problem's precision:

* fp32 (checked at 1e-4): FFMA on the CUDA cores, or 3xTF32 on the tensor cores (a split into
  big and small TF32 halves, three MMAs per product: fp32 accuracy at a third of the TF32 rate),
  whichever is faster; ``precision="tf32"`` (a problem checked at TF32's tolerance): TF32 tensor
  cores at their full rate;
* bf16 / fp16: the tensor cores;
* other dtypes (fp64, integers): no compute term.

The larger term names the bound. The same floor from the ceilings the harness measures (a device
copy, cuBLAS matmuls: :mod:`.ceilings`) is kept beside it: a kernel often beats those (eager fp32
matmul was 100% of a floor built from cuBLAS's own rate). A GPU with no data sheet here falls back
to the measured ceilings, and its basis says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kerngen.harness.gpu.peaks import peaks_of
from kerngen.harness.results import Baseline, GpuFacts

_FP32 = {"fp32", "float32", "float", "f32", "torch.float32"}
_HALF = {"bf16", "bfloat16", "torch.bfloat16", "fp16", "float16", "half", "f16", "torch.float16"}


@dataclass(frozen=True)
class Roof:
    """A problem's floor on a GPU: ``ms`` (None: neither term known), the bound ("memory",
    "compute" or ""), ``basis`` (what rate or bandwidth, and from where) and ``measured_ms`` (the
    floor the measured ceilings give, shown beside it)."""

    ms: float | None
    bound: str
    basis: str
    measured_ms: float | None


def _kind(dtype: str) -> str:
    d = str(dtype).strip().lower()
    return "fp32" if d in _FP32 else "half" if d in _HALF else ""


def compute_rate_tflops(dtype: str, facts: GpuFacts) -> float | None:
    """The MEASURED rate (TFLOP/s: cuBLAS's fp32 without TF32, or bf16) for ``dtype``, or None when
    none is known (not measured, or a dtype with no measured rate such as fp64 or int8)."""
    kind = _kind(dtype)
    return facts.fp32_tflops if kind == "fp32" else facts.bf16_tflops if kind == "half" else None


def peak_rate(dtype: str, facts: GpuFacts, precision: str | None = None) -> tuple[float, str] | None:
    """(TFLOP/s, what it is) of the fastest arithmetic a correct kernel may use for ``dtype`` on
    this GPU, from its data sheet; the measured rate where the model has none; None for a dtype
    with no compute term."""
    kind = _kind(dtype)
    peaks = peaks_of(facts.name)
    if not kind:
        return None
    if peaks is None:
        rate = compute_rate_tflops(dtype, facts)
        return (rate, f"{'fp32 (no TF32)' if kind == 'fp32' else 'bf16'} matmul as measured (no data sheet for "
                      f"this GPU: a kernel may beat it)") if rate else None
    sheet = f"{peaks.model} data sheet"
    if kind == "half":
        return peaks.half_tflops, f"bf16/fp16 tensor cores at {peaks.half_tflops:g} TFLOP/s ({sheet})"
    if precision == "tf32" and peaks.tf32_tflops:
        return peaks.tf32_tflops, f"TF32 tensor cores at {peaks.tf32_tflops:g} TFLOP/s ({sheet})"
    ffma = (peaks.fp32_tflops, f"FFMA at {peaks.fp32_tflops:g} TFLOP/s ({sheet})")
    if not peaks.tf32_tflops or peaks.tf32_tflops / 3 <= peaks.fp32_tflops:
        return ffma
    rate = peaks.tf32_tflops / 3
    return rate, f"3xTF32 tensor cores at {rate:.1f} TFLOP/s (a third of TF32's {peaks.tf32_tflops:g}; {sheet})"


def peak_bandwidth(facts: GpuFacts) -> tuple[float, str] | None:
    """(GB/s, what it is): the data sheet's memory bandwidth, else the measured device copy."""
    peaks = peaks_of(facts.name)
    if peaks is not None:
        return peaks.mem_gbps, f"{peaks.mem_gbps:g} GB/s ({peaks.model} data sheet)"
    if facts.copy_gbps:
        return facts.copy_gbps, f"{facts.copy_gbps:.0f} GB/s device copy as measured (no data sheet for this GPU)"
    return None


def compute_ms(flops: float, tflops: float) -> float:
    """Milliseconds to do ``flops`` operations at ``tflops`` TFLOP/s."""
    return flops / (tflops * 1e12) * 1e3


def memory_ms(nbytes: float, gbps: float) -> float:
    """Milliseconds to move ``nbytes`` at ``gbps`` GB/s (1e9 bytes per second)."""
    return nbytes / (gbps * 1e9) * 1e3


def _floor(flops: float | None, min_bytes: float | None, rate: float | None,
           gbps: float | None) -> tuple[float | None, str]:
    """max(compute, memory) with the bound it names; a term is left out when its count is None or
    non-positive or its rate unknown. A tie counts as memory-bound."""
    mem = memory_ms(float(min_bytes), gbps) if min_bytes is not None and min_bytes > 0 and gbps else None
    comp = compute_ms(float(flops), rate) if flops is not None and flops > 0 and rate else None
    if mem is None and comp is None:
        return None, ""
    if comp is None or (mem is not None and mem >= comp):
        return mem, "memory"
    return comp, "compute"


def roof(flops: float | None, min_bytes: int | None, dtype: str, facts: GpuFacts,
         precision: str | None = None) -> Roof:
    """The floor of a problem (its FLOPs, minimum bytes and dtype) on ``facts``'s GPU."""
    rate, bw = peak_rate(dtype, facts, precision), peak_bandwidth(facts)
    ms, bound = _floor(flops, min_bytes, rate[0] if rate else None, bw[0] if bw else None)
    measured, _ = _floor(flops, min_bytes, compute_rate_tflops(dtype, facts), facts.copy_gbps)
    what = (rate if bound == "compute" else bw) if bound else None
    return Roof(ms=ms, bound=bound, basis=f"{bound}: {what[1]}" if what else "", measured_ms=measured)


def refloor(base: Baseline, facts: GpuFacts | None, dtype: str | None) -> Baseline:
    """A baseline recorded before floors came from data sheets (no ``floor_basis``): its floor
    again from the peaks, the recorded one (from the measured ceilings) kept beside it. Returned as
    is when it has a basis already or what the floor needs (the GPU, the dtype) is unknown."""
    if base.floor_basis or facts is None or not dtype:
        return base
    r = roof(base.flops, base.min_bytes, dtype, facts)
    if r.ms is None:
        return base
    return base.model_copy(update={"floor_ms": r.ms, "floor_bound": r.bound, "floor_basis": r.basis,
                                   "floor_measured_ms": base.floor_ms})


def floor_ms(flops: float | None, min_bytes: int | None, dtype: str, facts: GpuFacts,
             precision: str | None = None) -> tuple[float | None, str]:
    """``(floor in ms, "memory" | "compute")`` (see :func:`roof`); ``(None, "")`` when neither
    term is known."""
    r = roof(flops, min_bytes, dtype, facts, precision)
    return r.ms, r.bound


def pct_of_roofline(ms: float, floor: float | None) -> float:
    """How close a time is to the floor, in percent: ``100 * floor / ms`` (100 = at the floor).
    0.0 when the floor is unknown or the time is not a positive finite number."""
    if floor is None or not floor > 0 or not math.isfinite(floor):
        return 0.0
    if not ms > 0 or not math.isfinite(ms):
        return 0.0
    return 100.0 * floor / ms
