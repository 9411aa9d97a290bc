"""The facts of well-known GPUs, from their data sheets, for work that has no GPU to ask: the dry
run (``kerngen generate --dry-run --gpu h100``) compiles for the preset's architecture and tells
the model its limits and its roofline. Nothing here is measured: the rates (memory bandwidth,
fp32 FFMA and dense bf16 tensor-core TFLOP/s) are the data sheets' peaks, from the one table of
them (:mod:`.peaks`, which the roofline reads too), marked ``datasheet``, and every prompt and
table says so."""

from __future__ import annotations

from kerngen.errors import KerngenError
from kerngen.harness.gpu.peaks import peaks_of
from kerngen.harness.results import GpuFacts

_KB, _MB, _GB = 1024, 1024**2, 1000**3
PRESET_SUFFIX = " (preset, not measured)"  # ends every preset's name (old dry runs are known by it)


def _gpu(name: str, arch: str, sms: int, shared_per_sm_kb: int, l2_mb: int, mem_gb: int) -> GpuFacts:
    peaks = peaks_of(name)
    if peaks is None:  # a preset is a model the data-sheet table holds (tests/harness/test_roofline.py)
        raise KerngenError(f"GPU preset {name!r} has no data-sheet peaks in kerngen.harness.gpu.peaks")
    # a block may opt in to all of an SM's shared memory but 1 KB (what the driver reserves)
    return GpuFacts(name=name + PRESET_SUFFIX, arch=arch, sm_count=sms,
                    max_shared_per_block_optin=(shared_per_sm_kb - 1) * _KB, shared_per_sm=shared_per_sm_kb * _KB,
                    l2_bytes=l2_mb * _MB, mem_bytes=mem_gb * _GB, copy_gbps=peaks.mem_gbps,
                    fp32_tflops=peaks.fp32_tflops, bf16_tflops=peaks.bf16_tflops, datasheet=True)


# the rates: memory bandwidth GB/s, fp32 (FFMA) TFLOP/s, dense bf16 tensor TFLOP/s (fp32 accumulate), from .peaks
PRESETS: dict[str, GpuFacts] = {
    "h100": _gpu("NVIDIA H100 80GB HBM3", "sm_90", 132, 228, 50, 80),
    "h200": _gpu("NVIDIA H200", "sm_90", 132, 228, 50, 141),
    "a100": _gpu("NVIDIA A100-SXM4-80GB", "sm_80", 108, 164, 40, 80),
    "l40s": _gpu("NVIDIA L40S", "sm_89", 142, 100, 96, 48),
    "rtx4090": _gpu("NVIDIA GeForce RTX 4090", "sm_89", 128, 100, 72, 24),
}


def preset(name: str) -> GpuFacts:
    """The preset ``name`` (case-insensitive); a one-line :class:`KerngenError` listing the known
    ones otherwise."""
    key = name.strip().lower().replace("-", "").replace(" ", "")
    if key not in PRESETS:
        raise KerngenError(f"unknown GPU {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[key].model_copy()


__all__ = ["PRESETS", "PRESET_SUFFIX", "preset"]
