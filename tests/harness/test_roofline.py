"""harness/gpu/roofline.py and peaks.py: the floor from the data sheet's peak for the precision a
problem allows (FFMA, 3xTF32, TF32 or tensor cores, named), the measured ceilings beside it, and
never a floor a correct kernel beats (every shipped run, issue 37)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kerngen.agent.tree import load_run
from kerngen.harness.gpu.peaks import peaks_of
from kerngen.harness.gpu.presets import PRESETS
from kerngen.harness.gpu.roofline import (compute_rate_tflops, floor_ms, pct_of_roofline, peak_bandwidth, peak_rate,
                                          refloor, roof)
from kerngen.harness.results import Baseline, GpuFacts, Timing

ROOT = Path(__file__).resolve().parents[2]
# measured on an H200 (the brief): copy 4.28 TB/s, cuBLAS fp32 51 TFLOP/s, bf16 800
H200 = GpuFacts(name="NVIDIA H200", copy_gbps=4280.0, fp32_tflops=51.0, bf16_tflops=800.0)
H100 = GpuFacts(name="NVIDIA H100 80GB HBM3", copy_gbps=3000.0, fp32_tflops=48.0, bf16_tflops=600.0)
MATMUL = 2.0 * 4096**3  # 137 GFLOP


def test_softmax_is_memory_bound_at_the_data_sheet_bandwidth():
    n = 4096 * 65536
    r = roof(5.0 * n, 2 * n * 4, "fp32", H200)
    assert r.bound == "memory" and r.ms == pytest.approx(2 * n * 4 / 4.8e12 * 1e3)
    assert "4800 GB/s" in r.basis and "data sheet" in r.basis
    assert r.measured_ms == pytest.approx(2 * n * 4 / 4.28e12 * 1e3)  # the measured copy, beside it
    assert r.measured_ms > r.ms


def test_fp32_matmul_floor_is_3xtf32_not_cublas():
    r = roof(MATMUL, 3 * 4096 * 4096 * 4, "float32", H200)
    assert r.bound == "compute" and "3xTF32" in r.basis
    assert r.ms == pytest.approx(MATMUL / (494.7e12 / 3) * 1e3)  # 0.83 ms
    assert r.measured_ms == pytest.approx(MATMUL / 51e12 * 1e3)  # 2.69 ms: what cuBLAS fp32 does
    assert r.ms < 2.313  # the shipped 3xTF32 kernel's time on an H100 (README) is above the floor


def test_tf32_precision_takes_the_full_tf32_rate():
    r = roof(MATMUL, None, "fp32", H100, precision="tf32")
    assert "TF32 tensor cores at 494.7" in r.basis and r.ms == pytest.approx(MATMUL / 494.7e12 * 1e3)


def test_half_precision_uses_the_tensor_cores():
    r = roof(0.55e12, 4 * 8 * 16 * 4096 * 128 * 2, "bf16", H200)
    assert r.bound == "compute" and "tensor cores at 989.4" in r.basis
    assert floor_ms(0.55e12, None, "float16", H200) == (r.ms, "compute")


@pytest.mark.parametrize("name,named", [("NVIDIA GeForce RTX 4090", "FFMA"), ("Tesla V100-SXM2-32GB", "FFMA"),
                                        ("NVIDIA A100-SXM4-80GB", "3xTF32"), ("NVIDIA L40S", "FFMA")])
def test_fp32_takes_whichever_is_faster(name, named):
    rate, what = peak_rate("fp32", GpuFacts(name=name))
    assert what.startswith(named)
    p = peaks_of(name)
    assert rate == pytest.approx(max(p.fp32_tflops, (p.tf32_tflops or 0) / 3))


@pytest.mark.parametrize("name,model", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"), ("NVIDIA L40S", "L40S"), ("NVIDIA H100 80GB HBM3 (preset, not measured)", "H100 SXM")])
def test_device_names_find_their_data_sheet(name, model):
    assert peaks_of(name).model == model


def test_a_gpu_without_a_data_sheet_falls_back_to_the_measured_ceilings_and_says_so():
    f = GpuFacts(name="Some Future GPU", copy_gbps=1000.0, fp32_tflops=1.0, bf16_tflops=2.0)
    assert peaks_of(f.name) is None
    assert floor_ms(None, 10**9, "fp32", f) == (pytest.approx(1.0), "memory")  # 1 GB at 1000 GB/s = 1 ms
    assert floor_ms(1e12, None, "fp32", f) == (pytest.approx(1000.0), "compute")  # 1 TFLOP at 1 TFLOP/s = 1 s
    assert floor_ms(1e12, None, "bf16", f) == (pytest.approx(500.0), "compute")
    assert "as measured" in roof(1e12, None, "fp32", f).basis and "may beat it" in roof(1e12, None, "fp32", f).basis
    assert floor_ms(1e9, 10**9, "fp32", f) == (pytest.approx(1.0), "memory")  # a tie is memory-bound
    assert floor_ms(3e9, 10**9, "fp32", f) == (pytest.approx(3.0), "compute")


def test_unknown_terms_are_left_out():
    none = GpuFacts(name="x")  # no data sheet, nothing measured
    assert floor_ms(1e12, 10**9, "fp32", none) == (None, "")
    assert roof(1e12, 10**9, "fp32", none).basis == ""
    assert floor_ms(None, None, "fp32", H200) == (None, "")
    assert floor_ms(0, 0, "fp32", H200) == (None, "")
    ms, bound = floor_ms(1e15, 10**9, "fp64", H200)  # fp64 / int8: no compute term, memory only
    assert bound == "memory" and ms == pytest.approx(1e9 / 4.8e12 * 1e3)
    assert compute_rate_tflops("int8", H200) is None and peak_rate("int8", H200) is None
    assert compute_rate_tflops(" FP32 ", H200) == 51.0


def test_an_older_baseline_is_refloored_and_keeps_its_measured_floor():
    t = Timing(median_ms=2.67, q25_ms=2.6, q75_ms=2.7, min_ms=2.6, max_ms=2.8, mean_ms=2.67, reps=10, warmup=1)
    old = Baseline(problem="matmul", gpu="NVIDIA H200", eager=t, floor_ms=2.68, floor_bound="compute", flops=MATMUL,
                   min_bytes=3 * 4096 * 4096 * 4)
    new = refloor(old, H200, "float32")
    assert new.floor_measured_ms == 2.68 and new.floor_ms == pytest.approx(0.8335, abs=1e-3) and "3xTF32" in new.floor_basis
    assert refloor(new, H200, "float32") == new  # a floor with a basis stays as recorded
    assert refloor(old, None, "float32") == old and refloor(old, H200, None) == old


def _correct_times(run) -> list[float]:
    b = run.baseline
    times = [n.ms for n in run.nodes.values() if n.ok] + [b.eager.median_ms]
    return times + ([b.compiled.median_ms] if b.compiled else [])


SHIPPED = sorted(p for p in (ROOT / "runs").iterdir() if (p / "events.jsonl").is_file())


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_no_correct_kernel_of_a_shipped_run_beats_its_floor(path):
    run = load_run(path)
    if run.started.demo:
        pytest.skip("a scripted demo: made-up times")
    b = run.baseline
    assert b.floor_ms and "data sheet" in b.floor_basis, b
    fastest = min(_correct_times(run))
    assert b.floor_ms <= fastest, (b.floor_ms, fastest, b.floor_basis)
    if b.floor_bound == "compute":  # the floor the measured ceilings gave was beaten: eager at 100.2% of it
        assert b.floor_measured_ms >= b.eager.median_ms


def test_pct_of_roofline():
    assert pct_of_roofline(1.0, 0.5) == pytest.approx(50.0)
    assert pct_of_roofline(0.5, 0.5) == pytest.approx(100.0)
    assert pct_of_roofline(1.0, None) == 0.0
    assert pct_of_roofline(math.inf, 0.5) == 0.0
    assert pct_of_roofline(0.0, 0.5) == 0.0
    assert pct_of_roofline(float("nan"), 0.5) == 0.0


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_a_dry_run_preset_takes_its_rates_from_the_data_sheet_table(key):
    """One table of data-sheet peaks (peaks.py): the dry run's presets show what the roofline uses."""
    facts = PRESETS[key]
    p = peaks_of(facts.name)
    assert p is not None and facts.datasheet
    assert (facts.copy_gbps, facts.fp32_tflops, facts.bf16_tflops) == (p.mem_gbps, p.fp32_tflops, p.bf16_tflops)
    assert peak_bandwidth(facts)[0] == p.mem_gbps  # the roofline of a dry run: the same numbers


def test_bf16_is_the_fp32_accumulating_rate_where_a_card_has_two():
    p = peaks_of("NVIDIA GeForce RTX 4090")
    assert p.bf16_tflops == 165.2 and p.half_tflops == 330.3  # the floor keeps the faster (fp16 accumulate)
    assert peaks_of("NVIDIA H100 80GB HBM3").bf16_tflops == peaks_of("NVIDIA H100 80GB HBM3").half_tflops
