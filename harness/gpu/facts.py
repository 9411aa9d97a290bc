"""What a worker reports of its GPU: the device's limits and the measured ceilings.

Fields come from ``torch.cuda.get_device_properties``; where torch lacks one (e.g. the opt-in
shared memory per block, registers per block), from ``cuda.bindings.runtime``'s device
attributes. The ceilings come from :func:`kerngen.harness.gpu.ceilings.measure_ceilings`
(cached on disk, measured once per GPU, driver and torch version).
"""

from __future__ import annotations

import logging
from typing import Any

from kerngen.harness.gpu.clocks import driver_version
from kerngen.harness.results import GpuFacts

log = logging.getLogger(__name__)


def arch_from_cc(major: int, minor: int) -> str:
    """NVRTC target of a compute capability: (9, 0) -> "sm_90". Pure."""
    return f"sm_{int(major)}{int(minor)}"


def device_attribute(name: str, device_index: int = 0) -> int | None:
    """``cudaDeviceGetAttribute(cudaDevAttr<name>, device_index)``, or None on any failure."""
    try:
        from cuda.bindings import runtime as cudart

        attr = getattr(cudart.cudaDeviceAttr, f"cudaDevAttr{name}")
        err, value = cudart.cudaDeviceGetAttribute(attr, device_index)
        if err != cudart.cudaError_t.cudaSuccess:
            return None
        return int(value)
    except Exception as e:
        log.debug("cudaDevAttr%s: %s", name, e)
        return None


def _pick(props: Any, prop: str, attr: str | None, device_index: int, default: int) -> int:
    """torch's property where it has one, else the runtime attribute, else ``default``."""
    v = getattr(props, prop, None) if prop else None
    if v is None or (isinstance(v, int) and v <= 0):
        v = device_attribute(attr, device_index) if attr else None
    return int(v) if v is not None and int(v) > 0 else default


def gpu_facts(device_index: int = 0, *, with_ceilings: bool = True) -> GpuFacts:
    """The facts of CUDA device ``device_index``; the ceilings too unless ``with_ceilings=False``
    (measuring them takes a few seconds the first time, then comes from the disk cache). A
    failed ceiling measurement leaves those fields ``None`` (logged), it does not raise."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    d = GpuFacts.model_fields
    facts = GpuFacts(
        name=props.name,
        index=device_index,
        arch=arch_from_cc(props.major, props.minor),
        sm_count=_pick(props, "multi_processor_count", "MultiProcessorCount", device_index, 0),
        max_threads_per_block=_pick(
            props, "max_threads_per_block", "MaxThreadsPerBlock", device_index, d["max_threads_per_block"].default
        ),
        max_shared_per_block=_pick(
            props, "shared_memory_per_block", "MaxSharedMemoryPerBlock", device_index, d["max_shared_per_block"].default
        ),
        max_shared_per_block_optin=_pick(
            props,
            "shared_memory_per_block_optin",
            "MaxSharedMemoryPerBlockOptin",
            device_index,
            d["max_shared_per_block_optin"].default,
        ),
        shared_per_sm=_pick(
            props,
            "shared_memory_per_multiprocessor",
            "MaxSharedMemoryPerMultiprocessor",
            device_index,
            d["shared_per_sm"].default,
        ),
        regs_per_block=_pick(props, "", "MaxRegistersPerBlock", device_index, d["regs_per_block"].default),
        regs_per_sm=_pick(
            props, "regs_per_multiprocessor", "MaxRegistersPerMultiprocessor", device_index, d["regs_per_sm"].default
        ),
        l2_bytes=_pick(props, "L2_cache_size", "L2CacheSize", device_index, d["l2_bytes"].default),
        mem_bytes=int(getattr(props, "total_memory", 0) or 0),
        driver=driver_version(),
    )
    if with_ceilings:
        try:
            from kerngen.harness.gpu.ceilings import measure_ceilings

            c = measure_ceilings(device_index)
            facts.copy_gbps = c.copy_gbps
            facts.fp32_tflops = c.fp32_tflops
            facts.bf16_tflops = c.bf16_tflops
        except Exception as e:  # e.g. out of memory on a busy device
            log.warning("could not measure the ceilings of cuda:%d: %s", device_index, e)
    return facts
