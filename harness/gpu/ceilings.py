"""The GPU's measured ceilings: device copy bandwidth, fp32 (no TF32) and bf16 matmul rates.

Measured once and cached on disk per (GPU name, driver version, torch version) in
``$KERNGEN_CACHE_DIR/ceilings/`` (``KERNGEN_CACHE_DIR`` defaults to ``~/.cache/kerngen``).
Each figure is the median of :func:`kerngen.harness.gpu.timing.bench` with the L2 flushed, on
random inputs (never zeros). A measurement takes a few seconds.

- copy: ``dst.copy_(src)`` of 1 GiB fp32 buffers; bytes read + bytes written (2 GiB) over time.
- fp32: ``torch.mm`` of 8192^3 with ``torch.backends.cuda.matmul.allow_tf32 = False`` (the flag
  is restored afterwards); 2 * N^3 FLOP over time.
- bf16: ``torch.mm`` of 8192^3 in bf16.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import warnings
from pathlib import Path

from pydantic import BaseModel, Field

from kerngen.harness.atomic import write_atomic
from kerngen.harness.cache_dir import cache_root
from kerngen.harness.results import ClockReading

log = logging.getLogger(__name__)

COPY_BYTES = 1 << 30  # per buffer: 1 GiB read + 1 GiB written
MATMUL_N = 8192


class Ceilings(BaseModel):
    copy_gbps: float  # device-to-device copy, bytes read + written, GB/s (1e9 bytes)
    fp32_tflops: float  # fp32 matmul, TF32 off
    bf16_tflops: float  # bf16 matmul
    gpu: str
    driver: str
    torch: str = ""
    measured_at: str  # ISO 8601, UTC
    # NVML readings during each measurement ("copy", "fp32", "bf16"): a power cap or a thermal
    # slowdown there is part of what the card sustains as found (nothing is ever set)
    clocks: dict[str, ClockReading] = Field(default_factory=dict)


def cache_path(gpu: str, driver: str, torch_version: str) -> Path:
    """Where the ceilings of (gpu, driver, torch) are cached. Pure apart from the env lookup."""
    key = f"{gpu}__drv{driver}__torch{torch_version}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")
    return cache_root() / "ceilings" / f"{slug}.json"


def load_cached(path: Path) -> Ceilings | None:
    try:
        return Ceilings.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except Exception as e:  # corrupt or stale format: measure again
        log.warning("ignoring unreadable ceilings cache %s: %s", path, e)
        return None


def gbps(nbytes: float, ms: float) -> float:
    """GB/s (1e9 bytes per second) of ``nbytes`` moved in ``ms`` milliseconds. Pure."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flop: float, ms: float) -> float:
    """TFLOP/s of ``flop`` operations in ``ms`` milliseconds. Pure."""
    return flop / (ms * 1e-3) / 1e12


def measure_ceilings(device_index: int = 0, *, refresh: bool = False) -> Ceilings:
    """The ceilings of CUDA device ``device_index``, from the disk cache unless ``refresh``."""
    import torch

    from kerngen.harness.gpu.clocks import driver_version

    gpu = torch.cuda.get_device_name(device_index)
    driver = driver_version()
    path = cache_path(gpu, driver, torch.__version__)
    if not refresh:
        cached = load_cached(path)
        if cached is not None:
            return cached

    copy, fp32, bf16, readings = _measure(device_index)
    c = Ceilings(
        copy_gbps=copy,
        fp32_tflops=fp32,
        bf16_tflops=bf16,
        gpu=gpu,
        driver=driver,
        torch=torch.__version__,
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        clocks=readings,
    )
    try:
        write_atomic(path, json.dumps(c.model_dump(), indent=2) + "\n")
    except OSError as e:
        log.warning("could not cache ceilings in %s: %s", path, e)
    return c


def _measure(device_index: int) -> tuple[float, float, float, dict[str, ClockReading]]:
    import torch

    from kerngen.harness.gpu.clocks import ClockMonitor
    from kerngen.harness.gpu.timing import L2Flusher, bench

    readings: dict[str, ClockReading] = {}

    device = torch.device("cuda", device_index)
    with torch.cuda.device(device):
        stream = torch.cuda.Stream(device)
        flusher = L2Flusher(device)
        gen = torch.Generator(device=device)
        gen.manual_seed(20261122)

        # device copy: random fp32 data, 1 GiB each way
        n = COPY_BYTES // 4
        src = torch.rand(n, device=device, generator=gen)
        dst = torch.empty_like(src)
        torch.cuda.synchronize(device)
        t = bench(
            lambda: dst.copy_(src),  # noqa: F821 - bound above; `del` below frees them after the bench
            stream=stream,
            flusher=flusher,
            budget_ms=100.0,
            keep_samples=False,
            clocks=ClockMonitor(device_index),
        )
        readings["copy"] = t.clocks
        copy = gbps(2 * n * 4, t.median_ms)
        del src, dst

        N = MATMUL_N
        flop = 2.0 * N * N * N

        # fp32 with TF32 off (restored afterwards)
        a = torch.randn(N, N, device=device, generator=gen)
        b = torch.randn(N, N, device=device, generator=gen)
        out = torch.empty(N, N, device=device)
        torch.cuda.synchronize(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
        try:
            t = bench(
                lambda: torch.mm(a, b, out=out),  # noqa: F821 - bound above, freed by `del` below
                stream=stream,
                flusher=flusher,
                keep_samples=False,
                clocks=ClockMonitor(device_index),
            )
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.backends.cuda.matmul.allow_tf32 = saved
        fp32 = tflops(flop, t.median_ms)
        readings["fp32"] = t.clocks

        # bf16
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        out = torch.empty(N, N, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize(device)
        t = bench(
            lambda: torch.mm(a, b, out=out),  # noqa: F821 - bound above, freed by `del` below
            stream=stream,
            flusher=flusher,
            keep_samples=False,
            clocks=ClockMonitor(device_index),
        )
        bf16 = tflops(flop, t.median_ms)
        readings["bf16"] = t.clocks

        del a, b, out, flusher
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return copy, fp32, bf16, {k: v for k, v in readings.items() if v is not None}
