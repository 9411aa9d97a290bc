"""kerngen/results/bench_table.py: the rows of `kerngen bench` (ratios from medians of the same run, flags)."""

from __future__ import annotations

import pytest

from kerngen.results.bench_table import bench_rows, ratio
from kerngen.harness.results import Baseline, EvalResult, Verdict
from kerngen.harness.gpu.timing import summarize


def _timing(ms: float, late: int = 0):
    t = summarize([ms] * 100, warmup=3, l2_flushed=True)
    t.late_reps = late
    return t


def test_ratio_guards():
    assert ratio(2.0, 1.0) == 2.0
    assert ratio(None, 1.0) is None and ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None and ratio(1.0, float("inf")) is None


def test_rows_ratios_roofline_and_host_bound_flag():
    base = Baseline(problem="p", gpu="g", eager=_timing(1.0), compiled=_timing(0.5, late=2), floor_ms=0.2,
                    floor_bound="memory")
    result = EvalResult(verdict=Verdict.ok, message="ok", timing=_timing(0.25))
    eager, compiled, kernel = bench_rows(base, result)
    assert kernel["speedup_vs_eager"] == pytest.approx(4.0) and kernel["speedup_vs_compile"] == pytest.approx(2.0)
    assert kernel["pct_of_roofline"] == pytest.approx(80.0)
    # 2 late reps of 100 is above the 1% that bench() tolerates: flagged, the others not
    assert compiled["host_bound"] and not eager["host_bound"] and not kernel["host_bound"]


def test_rows_without_compile_or_kernel_timing():
    base = Baseline(problem="p", gpu="g", eager=_timing(1.0), compile_error="RuntimeError: no compiler")
    failed = EvalResult(verdict=Verdict.incorrect, message="mismatch")
    rows = bench_rows(base, failed)
    assert rows[1]["verdict"] == "failed" and rows[1]["note"].startswith("RuntimeError")
    assert rows[2]["median_ms"] is None and rows[2]["speedup_vs_eager"] is None and not rows[2]["host_bound"]
