"""Read the GPU's clocks, temperature, power and throttle ("clocks event") reasons through NVML.

ONLY READS. Nothing here sets clocks, application clocks, power limits, persistence or any
other setting of the card: the GPU is measured as it is found.

NVML (package ``nvidia-ml-py``, module ``pynvml``) is imported lazily. If it is missing, or
any call fails, the reading says ``available=False`` (or leaves a field ``None``): a clock
reading never crashes a measurement.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from kerngen.harness.results import ClockReading

log = logging.getLogger(__name__)

# NVML's clocks-event (formerly "throttle") reason bits -> our names.
REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",  # also "user defined clocks"
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
    0x200: "board_limit",
    0x400: "reliability",
}
# Reasons that mean the chip ran slower than it could: thermal, power cap, hardware slowdown.
SAG_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})
SAG_RATIO = 0.9  # the SM clock after below 90% of before is a sag

_UNSET = object()
_nvml_module: Any = _UNSET  # the initialised pynvml module, or None when NVML is unusable


def _nvml() -> Any:
    """The initialised ``pynvml`` module, or None (missing library, no driver, init failed)."""
    global _nvml_module
    if _nvml_module is _UNSET:
        try:
            import pynvml  # noqa: PLC0415  (lazy on purpose)

            pynvml.nvmlInit()
            _nvml_module = pynvml
        except Exception as e:  # ImportError, NVMLError, OSError...
            log.debug("NVML unavailable: %s", e)
            _nvml_module = None
    return _nvml_module


def _reset_nvml() -> None:
    """Forget the cached NVML state (tests)."""
    global _nvml_module
    _nvml_module = _UNSET


def reason_names(mask: int) -> list[str]:
    """Names of the reason bits set in ``mask`` (unknown bits as ``bit_0x...``). Pure."""
    names = []
    for bit in range(32):
        b = 1 << bit
        if mask & b:
            names.append(REASON_BITS.get(b, f"bit_{b:#x}"))
    return names


def is_sagged(sm_mhz_before: int | None, sm_mhz_after: int | None, reasons: Iterable[str]) -> bool:
    """Did the clocks sag during a measurement? Pure.

    True when the SM clock after is below 90% of the clock before, or when any thermal,
    power-cap or hardware-slowdown reason is active.
    """
    if any(r in SAG_REASONS for r in reasons):
        return True
    if sm_mhz_before and sm_mhz_after is not None and sm_mhz_before > 0:
        return sm_mhz_after < SAG_RATIO * sm_mhz_before
    return False


def _safe(fn, *args):
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_handle(nv: Any, device_index: int) -> Any:
    """NVML's handle of the CUDA device ``device_index``: by UUID where torch knows it (NVML
    numbers devices without regard to CUDA_VISIBLE_DEVICES), else by index."""
    try:
        import torch

        if torch.cuda.is_available():
            uuid = str(torch.cuda.get_device_properties(device_index).uuid)
            if uuid:
                if not uuid.startswith(("GPU-", "MIG-")):
                    uuid = "GPU-" + uuid
                return nv.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        pass
    return nv.nvmlDeviceGetHandleByIndex(device_index)


def nvml_driver_version() -> str | None:
    """The driver's version as NVML reports it (e.g. "580.159.04"), or None."""
    nv = _nvml()
    if nv is None:
        return None
    v = _safe(nv.nvmlSystemGetDriverVersion)
    if isinstance(v, bytes):
        v = v.decode()
    return str(v) if v else None


class ClockMonitor:
    """``start()`` before a measurement, ``sample()`` while it runs (optional), ``stop()`` after
    it: a :class:`ClockReading`. ``sagged`` compares the lowest SM clock seen (samples and the
    reading at stop) with the clock at start; ``throttle_reasons`` are all the reasons seen."""

    def __init__(self, device_index: int = 0):
        self.device_index = int(device_index)
        self._nv: Any = None
        self._handle: Any = None
        self._before: dict[str, Any] | None = None
        self._min_sm: int | None = None
        self._max_power: float | None = None
        self._seen: set[str] = set()
        self._failed = False
        try:
            self._nv = _nvml()
            if self._nv is not None:
                self._handle = _nvml_handle(self._nv, self.device_index)
        except Exception as e:
            log.debug("NVML handle of device %d: %s", self.device_index, e)
            self._handle = None

    @property
    def available(self) -> bool:
        return self._nv is not None and self._handle is not None and not self._failed

    def _read(self) -> dict[str, Any]:
        nv, h = self._nv, self._handle
        sm = _safe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        power_mw = _safe(nv.nvmlDeviceGetPowerUsage, h)
        return {
            "sm": int(sm) if sm is not None else None,
            "sm_max": _int_or_none(_safe(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)),
            "mem": _int_or_none(_safe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)),
            "temp": _int_or_none(_safe(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
            "power_w": float(power_mw) / 1000.0 if power_mw is not None else None,
        }

    def _reasons(self) -> list[str]:
        nv, h = self._nv, self._handle
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            mask = _safe(fn, h)
            if mask is not None:
                return reason_names(int(mask))
        return []

    def start(self) -> None:
        self._before = None
        self._min_sm = None
        self._max_power = None
        self._seen = set()
        if not self.available:
            return
        try:
            self._before = self._read()
        except Exception as e:
            log.debug("NVML read failed: %s", e)
            self._failed = True

    def sample(self) -> None:
        """One reading while the measured work runs (SM clock, power, reasons): a sag seen
        here counts even when the clocks recovered by ``stop()``. Never raises."""
        if not self.available or self._before is None:
            return
        try:
            nv, h = self._nv, self._handle
            sm = _safe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            if sm is not None:
                self._min_sm = int(sm) if self._min_sm is None else min(self._min_sm, int(sm))
            p = _safe(nv.nvmlDeviceGetPowerUsage, h)
            if p is not None:
                w = float(p) / 1000.0
                self._max_power = w if self._max_power is None else max(self._max_power, w)
            self._seen.update(self._reasons())
        except Exception as e:
            log.debug("NVML sample failed: %s", e)

    def stop(self) -> ClockReading:
        if not self.available or self._before is None:
            return ClockReading(available=False)
        try:
            after = self._read()
            reasons = self._reasons()
        except Exception as e:
            log.debug("NVML read failed: %s", e)
            return ClockReading(available=False)
        before = self._before
        if before["sm"] is None and after["sm"] is None:
            return ClockReading(available=False)
        # reasons seen while it ran or at the end, in bit order
        seen = set(reasons) | self._seen
        order = list(REASON_BITS.values())
        reasons = sorted(seen, key=lambda r: (order.index(r) if r in order else len(order), r))
        lows = [x for x in (after["sm"], self._min_sm) if x is not None]
        powers = [x for x in (before["power_w"], after["power_w"], self._max_power) if x is not None]
        return ClockReading(
            sm_mhz_before=before["sm"],
            sm_mhz_after=after["sm"],
            sm_mhz_max=after["sm_max"] if after["sm_max"] is not None else before["sm_max"],
            mem_mhz=after["mem"] if after["mem"] is not None else before["mem"],
            temp_c_before=before["temp"],
            temp_c_after=after["temp"],
            power_w=max(powers) if powers else None,  # the highest reading: under load
            throttle_reasons=reasons,
            sagged=is_sagged(before["sm"], min(lows) if lows else None, reasons),
            available=True,
        )


def _int_or_none(x: Any) -> int | None:
    return int(x) if x is not None else None


def read_clocks(device_index: int = 0) -> ClockReading:
    """One reading now (before == after): what a worker reports at start."""
    m = ClockMonitor(device_index)
    m.start()
    return m.stop()


def driver_version() -> str:
    """The driver version: NVML's ("580.159.04") where it answers, else the CUDA version the
    driver supports ("cuda-13.0"), else "unknown"."""
    v = nvml_driver_version()
    if v:
        return v
    try:
        from cuda.bindings import runtime as cudart

        err, n = cudart.cudaDriverGetVersion()
        if err == cudart.cudaError_t.cudaSuccess and n:
            return f"cuda-{n // 1000}.{(n % 1000) // 10}"
    except Exception as e:
        log.debug("cudaDriverGetVersion: %s", e)
    return "unknown"
