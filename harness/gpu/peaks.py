"""What a GPU model can do at most, from NVIDIA's data sheets: memory bandwidth and the dense
arithmetic rates at the boost clock (no sparsity). No kernel goes faster than these, so the
roofline floor (:mod:`.roofline`) is built from them; the rates the harness measures (a device
copy, cuBLAS matmuls: :mod:`.ceilings`) are shown beside it and are often beaten (a reduction
reads faster than a copy moves; a 3xTF32 GEMM does fp32 faster than cuBLAS's fp32 path). Pure.

A device is matched by the name CUDA gives it (``NVIDIA H100 80GB HBM3``); a model not listed has
no data-sheet floor (the roofline then falls back to the measured ceilings and says so). The dry
run's GPU presets (:mod:`.presets`) take their rates from here too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peaks:
    """One model's data-sheet peaks. ``tf32_tflops`` None: no TF32 tensor cores (before Ampere)."""

    model: str
    mem_gbps: float  # DRAM bandwidth, GB/s (1e9 bytes per second)
    fp32_tflops: float  # FFMA on the CUDA cores, 2 FLOP per FMA
    tf32_tflops: float | None  # dense TF32 tensor cores
    half_tflops: float  # dense fp16/bf16 tensor cores, the faster accumulation where a card has two
    # dense bf16 with fp32 accumulation (bf16 has no other) where it is slower than half_tflops: GeForce
    # cards run it at half the rate of fp16 with fp16 accumulation
    bf16_f32acc_tflops: float | None = None

    @property
    def bf16_tflops(self) -> float:
        """Dense bf16 tensor cores with fp32 accumulation: what a bf16 matmul (cuBLAS's) can reach."""
        return self.bf16_f32acc_tflops or self.half_tflops


# (every word a device name must contain, peaks), most specific first
_MODELS: tuple[tuple[tuple[str, ...], Peaks], ...] = (
    (("H200", "NVL"), Peaks("H200 NVL", 4800, 60.0, 417.5, 835.5)),
    (("H200",), Peaks("H200 SXM", 4800, 66.9, 494.7, 989.4)),
    (("H100", "NVL"), Peaks("H100 NVL", 3900, 60.0, 417.5, 835.5)),
    (("H100", "PCIE"), Peaks("H100 PCIe", 2000, 51.2, 378.0, 756.0)),
    (("H100",), Peaks("H100 SXM", 3350, 66.9, 494.7, 989.4)),
    (("A100", "PCIE", "40GB"), Peaks("A100 PCIe 40GB", 1555, 19.5, 156.0, 312.0)),
    (("A100", "PCIE"), Peaks("A100 PCIe 80GB", 1935, 19.5, 156.0, 312.0)),
    (("A100", "40GB"), Peaks("A100 SXM 40GB", 1555, 19.5, 156.0, 312.0)),
    (("A100",), Peaks("A100 SXM 80GB", 2039, 19.5, 156.0, 312.0)),
    (("L40S",), Peaks("L40S", 864, 91.6, 183.0, 362.0)),
    (("L4",), Peaks("L4", 300, 30.3, 60.0, 121.0)),
    (("A10",), Peaks("A10", 600, 31.2, 62.5, 125.0)),
    (("RTX", "4090"), Peaks("GeForce RTX 4090", 1008, 82.6, 82.6, 330.3, 165.2)),
    (("RTX", "3090"), Peaks("GeForce RTX 3090", 936, 35.6, 35.6, 142.0, 71.0)),
    (("V100",), Peaks("V100", 900, 15.7, None, 125.0)),
)


def peaks_of(device_name: str) -> Peaks | None:
    """The data-sheet peaks of the device CUDA calls ``device_name``, or None for a model not listed."""
    words = set(device_name.upper().replace("-", " ").split())
    for needed, peaks in _MODELS:
        if all(w in words for w in needed):
            return peaks
    return None


__all__ = ["Peaks", "peaks_of"]
