"""Timing of device work with CUDA events, the L2 cache flushed before every repetition.

Modelled on ``triton.testing.do_bench`` and Kernel Tuner, but our own code:

1. one untimed call (module load, run-time compilation, handle creation stay out of the numbers);
2. a few timed calls (each after ``before_each`` and an L2 flush) give an estimate of one call;
3. from that estimate and the budgets, :func:`plan_reps` picks the warm-up count
   (``warmup_ms / estimate``, at least 3) and the repetitions (``budget_ms / estimate`` within
   ``[min_reps, max_reps]``);
4. warm-up calls, then per repetition: ``before_each()`` (outside the timed region: the harness
   poisons outputs there), ``flusher.flush(stream)``, a start event, ``fn()``, an end event, all
   on ``stream``. Every event pair is recorded first and the stream synchronized once; then
   ``elapsed_time`` of each pair is one sample (milliseconds);
5. the host must stay ahead of the GPU: if the GPU has already passed a rep's start event by the
   time ``fn`` is enqueued (``start.query()``), that sample holds host time (Python and launch
   overhead, e.g. torch.compile's guards on a loaded machine), not device time. When more than 1%
   of the reps are late, the series is measured again with a GPU spin (``torch.cuda._sleep``)
   queued before each rep's flush, as long as twice the host's measured time per rep (at least
   LEAD_CYCLES), then twice that; ``Timing.late_reps`` and ``Timing.lead_cycles`` say what the
   kept series needed.

Milliseconds everywhere. The raw samples are kept (``Timing.samples_ms``) unless asked not to.

**Never time zeros.** ``bench`` times whatever ``fn`` does on whatever data it closes over; it
cannot see the inputs. Filling them with random (valid) data is the caller's job: zeros hide
unwritten outputs and wrong indexing, and can run faster than real data (a bf16 matrix product
ran 13% faster on zeros than on random data on an H200 here).

``fn`` must launch its work on the *current* stream (torch ops, or a cupy launch on
``torch.cuda.current_stream()``): ``bench`` makes ``stream`` current while it calls ``fn`` and
``before_each``. Work that ``fn`` sends to another stream escapes the timed region; the harness
keeps candidate kernels from doing that by never running a candidate's host code.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Sequence

from kerngen.harness.results import Timing

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from kerngen.harness.gpu.clocks import ClockMonitor

MIN_FLUSH_BYTES = 256 * 1024 * 1024  # at least 256 MiB, whatever the L2 size
ESTIMATE_CALLS = 5  # timed calls that estimate one call's time
MIN_WARMUP = 3
MAX_WARMUP = 10_000  # a cap for calls of a few microseconds (launch-bound)
CLOCK_SAMPLE_S = 0.002  # NVML sampling period while the timed reps run
_MIN_ESTIMATE_MS = 1e-4  # guards a zero estimate (event resolution is ~0.5 us)
LEAD_CYCLES = 200_000  # the least GPU spin queued before a rep when the host fell behind (~0.1 ms)
LEAD_CLOCK_HZ = 2.0e9  # cycles per second assumed for the spin; a slower clock only lengthens it
LEAD_TRIES = 3  # no lead, then twice the host's measured time per rep, then twice that again
MAX_LATE_FRACTION = 0.01


class L2Flusher:
    """Evicts the L2 cache by writing a buffer of at least twice its size (at least 256 MiB).

    Each flush writes a new non-zero value, so that nothing (e.g. compression of zero pages)
    makes the write cheaper than a full pass over the buffer.
    """

    def __init__(self, device: "torch.device | str | int", l2_bytes: int | None = None):
        import torch

        device = torch.device(device if not isinstance(device, int) else f"cuda:{device}")
        if device.type != "cuda":
            raise ValueError(f"L2Flusher needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if l2_bytes is None:
            l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        self.device = device
        self.l2_bytes = int(l2_bytes)
        self.nbytes = flush_bytes(self.l2_bytes)
        self._buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)
        self._value = 0

    def flush(self, stream: "torch.cuda.Stream") -> None:
        import torch

        self._value = self._value % 0x7FFFFFF0 + 1  # 1, 2, 3, ...: never zero
        with torch.cuda.stream(stream):
            self._buf.fill_(self._value)


def flush_bytes(l2_bytes: int) -> int:
    """Size of the flush buffer: ``max(2 * L2, 256 MiB)``, a multiple of 4 bytes."""
    n = max(2 * int(l2_bytes), MIN_FLUSH_BYTES)
    return (n + 3) // 4 * 4


def plan_reps(
    estimate_ms: float,
    *,
    budget_ms: float = 200.0,
    warmup_ms: float = 25.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    min_warmup: int = MIN_WARMUP,
    max_warmup: int = MAX_WARMUP,
) -> tuple[int, int]:
    """``(warmup, reps)`` from an estimate of one call (ms) and the budgets (ms). Pure.

    warmup = ``warmup_ms / estimate`` within ``[min_warmup, max_warmup]``;
    reps = ``budget_ms / estimate`` within ``[min_reps, max_reps]``.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    if not math.isfinite(estimate_ms):  # nan or inf: the fewest calls
        return min_warmup, min_reps
    estimate_ms = max(estimate_ms, _MIN_ESTIMATE_MS)
    warmup = int(max(0.0, warmup_ms) / estimate_ms)
    warmup = max(min_warmup, min(max_warmup, warmup))
    reps = int(max(0.0, budget_ms) / estimate_ms)
    reps = max(min_reps, min(max_reps, reps))
    return warmup, reps


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted samples (numpy's default method). Pure."""
    n = len(sorted_samples)
    if n == 0:
        raise ValueError("no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    h = (n - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return float(sorted_samples[lo] + (h - lo) * (sorted_samples[hi] - sorted_samples[lo]))


def summarize(
    samples_ms: Sequence[float], *, warmup: int, l2_flushed: bool, keep_samples: bool = True
) -> Timing:
    """Statistics of per-call times (ms): median, q25, q75, min, max, mean. Pure."""
    xs = [float(x) for x in samples_ms]
    if not xs:
        raise ValueError("summarize() needs at least one sample")
    if any(not math.isfinite(x) for x in xs):
        raise ValueError("samples must be finite")
    s = sorted(xs)
    return Timing(
        median_ms=quantile(s, 0.5),
        q25_ms=quantile(s, 0.25),
        q75_ms=quantile(s, 0.75),
        min_ms=s[0],
        max_ms=s[-1],
        mean_ms=math.fsum(s) / len(s),
        reps=len(s),
        warmup=int(warmup),
        samples_ms=xs if keep_samples else [],
        l2_flushed=bool(l2_flushed),
    )


def bench(
    fn: Callable[[], None],
    *,
    stream: "torch.cuda.Stream",
    before_each: Callable[[], None] | None = None,
    flusher: L2Flusher | None,
    budget_ms: float = 200.0,
    warmup_ms: float = 25.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    keep_samples: bool = True,
    clocks: "ClockMonitor | None" = None,
    lead_tries: int = LEAD_TRIES,
) -> Timing:
    """Time ``fn`` (which launches on ``stream``) with CUDA events; see the module docstring.

    ``flusher=None`` times with a warm L2 (``Timing.l2_flushed`` is False then). ``clocks``,
    when given, is started once the warm-up is launched (while the GPU runs it), sampled every
    2 ms while the timed repetitions run (the host polls the last end event instead of
    blocking) and stopped when they are done; its reading lands in ``Timing.clocks``.
    ``lead_tries=1`` turns the host-lag retry off (to show what it corrects).
    The inputs ``fn`` works on must hold random data, never zeros (the caller's job).
    """
    return bench_side_by_side([fn], stream=stream, before_each=before_each, flusher=flusher, budget_ms=budget_ms,
                              warmup_ms=warmup_ms, min_reps=min_reps, max_reps=max_reps, keep_samples=keep_samples,
                              clocks=clocks, lead_tries=lead_tries)[0]


def bench_side_by_side(
    fns: Sequence[Callable[[], None]],
    *,
    stream: "torch.cuda.Stream",
    before_each: Callable[[], None] | None = None,
    flusher: L2Flusher | None,
    budget_ms: float = 200.0,
    warmup_ms: float = 25.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    keep_samples: bool = True,
    clocks: "ClockMonitor | None" = None,
    lead_tries: int = LEAD_TRIES,
) -> list[Timing]:
    """:func:`bench` of several calls in one series, interleaved rep by rep: repetition r times every
    call once, in the given order when r is even and in reverse when r is odd (A B, B A, A B, ...).
    Each call's samples then see the same clocks: a power-capped GPU whose clock moves by 10% within
    a second (the 3xTF32 matmuls on an H200) gives two series timed one after the other gaps that
    are the clock's, not the calls'. The repetitions come from the summed estimate (``budget_ms``
    covers all the calls); one :class:`Timing` per call, in order, sharing the clock reading."""
    import torch

    fns = list(fns)
    if not fns:
        raise ValueError("bench_side_by_side() needs at least one call")

    def _each(r: int) -> list[int]:
        return list(range(len(fns))) if r % 2 == 0 else list(range(len(fns)))[::-1]

    def _timed(n: int, lead_cycles: int = 0) -> tuple[list[list[tuple[torch.cuda.Event, torch.cuda.Event]]], int,
                                                        float]:
        """Per call its event pairs, how many reps were late, the host's seconds per rep."""
        pairs: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in fns]
        late = 0
        began = time.perf_counter()
        for r in range(n):
            for i in _each(r):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if before_each is not None:
                    before_each()
                if lead_cycles:
                    torch.cuda._sleep(lead_cycles)
                if flusher is not None:
                    flusher.flush(stream)
                start.record(stream)
                fns[i]()
                late += bool(start.query())  # the GPU reached the start before the call was enqueued
                end.record(stream)
                pairs[i].append((start, end))
        return pairs, late, (time.perf_counter() - began) / max(n * len(fns), 1)

    with torch.cuda.stream(stream):
        # Inputs are usually made on the default stream: order them before anything we time.
        stream.wait_stream(torch.cuda.default_stream(stream.device))
        # 1. the untimed first calls
        for fn in fns:
            if before_each is not None:
                before_each()
            fn()
        stream.synchronize()
        # 2. estimate one rep (every call once)
        pairs, _, _ = _timed(ESTIMATE_CALLS)
        stream.synchronize()
        estimate_ms = 0.0
        for series in pairs:
            est = sorted(s.elapsed_time(e) for s, e in series)
            estimate_ms += est[len(est) // 2]
        warmup, reps = plan_reps(
            estimate_ms, budget_ms=budget_ms, warmup_ms=warmup_ms, min_reps=min_reps, max_reps=max_reps
        )
        # 3. warm-up (untimed), then the timed repetitions; one synchronize at the end
        for r in range(warmup):
            for i in _each(r):
                if before_each is not None:
                    before_each()
                fns[i]()
        lead, tries = 0, max(1, lead_tries)
        for attempt in range(tries):
            if clocks is not None:
                clocks.start()
            pairs, late, host_s = _timed(reps, lead)
            reading = _sample_clocks(clocks, pairs[_each(reps - 1)[-1]][-1][1])
            stream.synchronize()
            if late <= reps * len(fns) * MAX_LATE_FRACTION or attempt == tries - 1:
                break
            lead = max(LEAD_CYCLES, int(2 * host_s * LEAD_CLOCK_HZ), 2 * lead)
        samples = [[s.elapsed_time(e) for s, e in series] for series in pairs]

    timings = []
    for series in samples:
        timing = summarize(series, warmup=warmup, l2_flushed=flusher is not None, keep_samples=keep_samples)
        timing.clocks = reading
        timing.late_reps, timing.lead_cycles = late, lead
        timings.append(timing)
    return timings


def _sample_clocks(clocks: "ClockMonitor | None", last: "torch.cuda.Event"):
    """The host runs far ahead of the GPU: sample the clocks while the timed reps run, so that a
    sag (e.g. a power cap that sets in late) is seen, then read "after"."""
    if clocks is None:
        return None
    while not last.query():
        clocks.sample()
        time.sleep(CLOCK_SAMPLE_S)
    return clocks.stop()
