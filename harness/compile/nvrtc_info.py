"""What this machine's NVRTC is and can target, and which target a device needs.

Queries only: no source is compiled here (compiles run in the sandbox, :mod:`.sandbox`), so these
run in kerngen's own process. ``KERNGEN_ARCH`` overrides the target where no GPU is visible.
"""

from __future__ import annotations

import functools
import os
from typing import Any

FALLBACK_ARCH = "sm_90"


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


@functools.cache
def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can target (e.g. 75, 80, ..., 90, 100, 120)."""
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def _check(err: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")


def arch_for_capability(major: int, minor: int) -> str:
    """The NVRTC target for a device: its own ``sm_XY``, else the newest supported one of the
    same major version not above it (cubin runs on later minors of one major), else sm_90."""
    cc = major * 10 + minor
    archs = supported_archs()
    if cc in archs:
        return f"sm_{cc}"
    same = [a for a in archs if a // 10 == major and a <= cc]
    return f"sm_{max(same)}" if same else FALLBACK_ARCH


def default_arch(device: int = 0) -> str:
    """``$KERNGEN_ARCH``, else the arch of visible device ``device`` (through the CUDA driver
    API, no torch), else ``sm_90``."""
    env = os.environ.get("KERNGEN_ARCH", "").strip()
    if env:
        return env
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return FALLBACK_ARCH
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count <= device:
            return FALLBACK_ARCH
        err, dev = driver.cuDeviceGet(device)
        attr = driver.CUdevice_attribute
        err1, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        if err != driver.CUresult.CUDA_SUCCESS or err1 != err or err2 != err:
            return FALLBACK_ARCH
        return arch_for_capability(int(major), int(minor))
    except Exception:  # noqa: BLE001 - no driver library, no device: compile for the default
        return FALLBACK_ARCH
