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


def _defaults_base(same: bool = False) -> Baseline:
    return Baseline(problem="conv", gpu="g", eager=_timing(4.0), compiled=_timing(3.0), eager_defaults=_timing(1.0),
                    compiled_defaults=_timing(0.8), defaults_label="PyTorch defaults (TF32 conv)", defaults_same=same)


def test_rows_at_pytorch_defaults_beside_true_fp32():
    result = EvalResult(verdict=Verdict.ok, message="ok", timing=_timing(2.0))
    rows = bench_rows(_defaults_base(), result)
    assert [r["name"] for r in rows] == ["PyTorch eager (true fp32)", "torch.compile (true fp32)",
                                         "PyTorch eager (PyTorch defaults (TF32 conv))",
                                         "torch.compile (PyTorch defaults (TF32 conv))", "kernel"]
    kernel = rows[-1]
    assert kernel["speedup_vs_compile"] == pytest.approx(1.5)  # faster than true fp32 PyTorch ...
    assert kernel["speedup_vs_compile_defaults"] == pytest.approx(0.4)  # ... slower than TF32 convolutions
    # the same outputs at the defaults (no TF32 op): one pair of rows, the ratios still given
    same = bench_rows(_defaults_base(same=True), result)
    assert len(same) == 3 and same[-1]["speedup_vs_eager_defaults"] == pytest.approx(0.5)


def test_the_op_row_and_its_gap_warning():
    from kerngen.harness.results import OpTiming

    result = EvalResult(verdict=Verdict.ok, message="ok", timing=_timing(1.0))
    close = OpTiming(kernel=_timing(1.0), op=_timing(1.02), gap_pct=2.0, host_us=12.0, matches=True)
    far = OpTiming(kernel=_timing(1.0), op=_timing(1.10), gap_pct=10.0, host_us=40.0, matches=True)
    differs = OpTiming(kernel=_timing(1.0), op=_timing(1.0), gap_pct=0.0, host_us=12.0, matches=False)
    assert close.warning() == "" and not close.slow
    assert far.slow and far.warning() == ("the exported op is 10.0% slower than its kernel (1.1000 ms against "
                                          "1.0000; host 40 us a call)")
    assert "differs from its kernel's" in differs.warning()
    op = bench_rows(_defaults_base(), result, far)[-1]
    assert op["name"] == "exported op (torch.ops)" and op["median_ms"] == pytest.approx(1.1)
    assert op["gap_pct"] == 10.0 and op["note"] == far.warning() and op["kernel_ms_beside"] == 1.0
    assert bench_rows(_defaults_base(), result, differs)[-1]["verdict"] == "differs"


def test_speedup_line_says_which_pytorch():
    from kerngen.results.speedups import speedup_line

    f = {"speedup_eager": 1.36, "speedup_compile": 1.2, "speedup_eager_defaults": 0.74,
         "speedup_compile_defaults": 0.7, "defaults_label": "PyTorch defaults (TF32 conv)"}
    assert speedup_line(f) == ("1.36x eager, 1.20x torch.compile vs PyTorch (true fp32); 0.74x eager, 0.70x "
                               "torch.compile vs PyTorch defaults (TF32 conv)")
    old = {"speedup_eager": 2.0, "speedup_compile": None}  # a run from before the defaults were measured
    assert speedup_line(old) == "2.00x eager vs PyTorch (true fp32)" and speedup_line({}) == ""


def test_a_16bit_problems_pytorch_rows_say_the_dtype_they_ran_in(capsys, monkeypatch):
    from kerngen.harness.results import GpuFacts
    from kerngen.results.bench_table import print_bench

    base = Baseline(problem="p", gpu="g", eager=_timing(1.0), compiled=_timing(0.5))
    result = EvalResult(verdict=Verdict.ok, message="ok", timing=_timing(0.25))
    assert [r["name"] for r in bench_rows(base, result)][:2] == ["PyTorch eager (true fp32)",
                                                                 "torch.compile (true fp32)"]
    assert [r["name"] for r in bench_rows(base, result, dtype="bfloat16")][:2] == ["PyTorch eager (bf16)",
                                                                                   "torch.compile (bf16)"]
    monkeypatch.setenv("COLUMNS", "200")  # rich's width: one line per row and header
    print_bench("linear_gelu", GpuFacts(name="H200", arch="sm_90"), base, result, dtype="float16")
    out = capsys.readouterr().out
    assert "true fp32" not in out and "fp16: vs PyTorch (fp16)" in out and "fp16 eager" in out
