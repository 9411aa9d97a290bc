"""``kerngen calibrate``: how far the harness itself can be trusted on this GPU, measured.

1. Overhead per candidate for a millisecond-scale kernel (a naive 3-pass softmax on 4096x65536):
   compile uncached and cached, load, check, bench, end to end through the worker pool.
2. Run-to-run spread of a median: the same kernel evaluated several times.
3. Agreement of our timing of a PyTorch op with ``triton.testing.do_bench`` (median, same op).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from pydantic import BaseModel

from .spec import KernelSpec

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


class CalibrationReport(BaseModel):
    gpu: str
    overhead: list[OverheadRow]
    medians_ms: list[float]
    spread_pct: float
    ours_ms: float
    do_bench_ms: float | None
    agreement_pct: float | None
    note: str = ""


def run_calibration(repeats: int = 5, budget_ms: float = 200.0) -> CalibrationReport:
    from kerngen.problems.problem import load_problem
    from kerngen.problems.ref import ProblemRef

    from .evaluator import Candidate, EvalOptions
    from .pool import WorkerPool

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
        ours_ms=ours, do_bench_ms=theirs, agreement_pct=agreement,
    )


def _timed_eval(pool, ref, spec, opts, label, config) -> OverheadRow:
    from .evaluator import Candidate

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

    from .timing import L2Flusher, bench

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
