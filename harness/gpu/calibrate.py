"""``kerngen calibrate``: how far the harness itself can be trusted on this GPU, measured.

1. Overhead per candidate for a millisecond-scale kernel (a naive 3-pass softmax on 4096x65536):
   compile uncached and cached, load, check, bench, end to end through the worker pool.
2. Run-to-run spread of a median: the same kernel evaluated several times.
3. Agreement of our timing of a PyTorch op with ``triton.testing.do_bench`` (median, same op).
4. Host lag: a small op whose host side takes longer than the L2 flush (a 0.2 ms busy wait before
   a ~10 us add), timed without and with the late-rep retry of :func:`timing.bench`. Without it the
   host's time lands in the samples; with it the GPU lead keeps it out.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from pydantic import BaseModel

from kerngen.harness.spec.spec import KernelSpec

NAIVE_SOFTMAX = r"""
// one block per row, three passes over global memory: max, sum of exp, normalize
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, int cols) {
    const float* row = x + (size_t)blockIdx.x * cols;
    float* orow = out + (size_t)blockIdx.x * cols;
    __shared__ float red[BLOCK / 32];
    float m = -3.402823466e38f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < BLOCK / 32; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) s += __expf(row[c] - m);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < BLOCK / 32; ++w) s += red[w];
    const float inv = 1.f / s;
    for (int c = threadIdx.x; c < cols; c += BLOCK) orow[c] = __expf(row[c] - m) * inv;
}
"""


def naive_softmax_spec(input_name: str = "x") -> KernelSpec:
    return KernelSpec.model_validate(
        {
            "name": "naive-softmax",
            "description": "block per row, three passes",
            "source": NAIVE_SOFTMAX,
            "tunables": {"BLOCK": [256, 512, 1024]},
            "defaults": {"BLOCK": 512},
            "steps": [
                {
                    "kernel": "softmax_rows",
                    "grid": [f"{input_name}.shape[0]"],
                    "block": ["BLOCK"],
                    "args": [{"name": input_name}, {"name": "out"},
                             {"kind": "int32", "value": f"{input_name}.shape[1]"}],
                }
            ],
        }
    )


class OverheadRow(BaseModel):
    label: str
    end_to_end_s: float
    compile_s: float
    phases_s: dict[str, float]
    median_ms: float | None
    verdict: str


class HostLag(BaseModel):
    """The same host-heavy call timed without and with bench()'s late-rep retry."""

    host_busy_ms: float
    without_lead_ms: float
    without_lead_late: int
    without_lead_reps: int
    with_lead_ms: float
    with_lead_late: int
    with_lead_reps: int
    lead_cycles: int


class CalibrationReport(BaseModel):
    gpu: str
    overhead: list[OverheadRow]
    medians_ms: list[float]
    spread_pct: float
    ours_ms: float
    do_bench_ms: float | None
    agreement_pct: float | None
    host_lag: HostLag | None = None
    note: str = ""


def run_calibration(repeats: int = 5, budget_ms: float = 200.0) -> CalibrationReport:
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool

    ref = ProblemRef(source="softmax")
    info = load_problem(ref).info
    spec = naive_softmax_spec(info.inputs[0].name)
    opts = EvalOptions(seeds=3, budget_ms=budget_ms, timeout_s=120)
    # an empty compile cache for the uncached figure, without touching the user's cache
    os.environ["KERNGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kerngen-calibrate-")
    with WorkerPool(devices=None) as pool:
        facts = pool.gpu_facts()
        pool.evaluate(ref, [Candidate(spec=spec, config={"BLOCK": 256})], opts)  # loads problem in the worker
        rows = [_timed_eval(pool, ref, spec, opts, "uncached compile", {"BLOCK": 512})]
        rows.append(_timed_eval(pool, ref, spec, opts, "cached compile", {"BLOCK": 512}))
        medians = []
        for _ in range(repeats):
            r = pool.evaluate(ref, [Candidate(spec=spec, config={"BLOCK": 512})], opts)[0]
            if r.ok:
                medians.append(r.timing.median_ms)
    spread = 100.0 * (max(medians) - min(medians)) / statistics.median(medians) if medians else float("nan")
    ours, theirs = _agreement(info, budget_ms)
    agreement = 100.0 * abs(ours - theirs) / theirs if theirs else None
    return CalibrationReport(
        gpu=facts.name, overhead=rows, medians_ms=medians, spread_pct=spread,
        ours_ms=ours, do_bench_ms=theirs, agreement_pct=agreement, host_lag=host_lag(budget_ms),
    )


def _timed_eval(pool, ref, spec, opts, label, config) -> OverheadRow:
    from kerngen.harness.evaluator import Candidate

    started = time.perf_counter()
    r = pool.evaluate(ref, [Candidate(spec=spec, config=config)], opts)[0]
    return OverheadRow(
        label=label, end_to_end_s=time.perf_counter() - started,
        compile_s=r.compile.seconds if r.compile else 0.0, phases_s=r.phases_s,
        median_ms=r.timing.median_ms if r.ok and r.timing else None, verdict=r.verdict.value,
    )


def _agreement(info, budget_ms: float) -> tuple[float, float | None]:
    """torch.softmax on the problem's input: our bench() vs triton's do_bench, same process."""
    import torch

    from kerngen.harness.gpu.timing import L2Flusher, bench

    x = torch.randn(*info.inputs[0].shape, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()

    def op() -> None:
        torch.softmax(x, dim=1, out=out)

    with torch.cuda.stream(stream):
        ours = bench(op, stream=stream, flusher=L2Flusher(x.device), budget_ms=budget_ms).median_ms
        try:
            from triton.testing import do_bench
        except ImportError:
            return ours, None
        theirs = float(do_bench(op, warmup=25, rep=int(budget_ms), return_mode="median"))
    return ours, theirs


HOST_BUSY_MS = 0.2  # longer than the flush of a 256 MiB buffer (~0.07 ms on an H100 / H200)


def host_lag(budget_ms: float, host_busy_ms: float = HOST_BUSY_MS) -> HostLag:
    """A call that keeps the host busy before a tiny launch, timed without and with the lead."""
    import torch

    from kerngen.harness.gpu.timing import L2Flusher, bench

    a = torch.rand(1 << 20, device="cuda") + 0.5
    b = torch.rand(1 << 20, device="cuda") + 0.5
    out = torch.empty_like(a)
    stream = torch.cuda.Stream()

    def op() -> None:
        until = time.perf_counter() + host_busy_ms / 1000.0
        while time.perf_counter() < until:  # stands for Python and launch overhead
            pass
        torch.add(a, b, out=out)

    flusher = L2Flusher(a.device)
    with torch.cuda.stream(stream):
        off = bench(op, stream=stream, flusher=flusher, budget_ms=budget_ms, lead_tries=1)
        on = bench(op, stream=stream, flusher=flusher, budget_ms=budget_ms)
    return HostLag(host_busy_ms=host_busy_ms, without_lead_ms=off.median_ms, without_lead_late=off.late_reps,
                   without_lead_reps=off.reps, with_lead_ms=on.median_ms, with_lead_late=on.late_reps,
                   with_lead_reps=on.reps, lead_cycles=on.lead_cycles)
