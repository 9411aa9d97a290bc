"""harness/gpu/roofline.py: pure floor arithmetic, checked against the brief's H200 figures."""

from __future__ import annotations

import math

import pytest

from kerngen.harness.results import GpuFacts
from kerngen.harness.gpu.roofline import compute_rate_tflops, floor_ms, pct_of_roofline

# The brief's H200 (measured copy 4.28 TB/s; ~67 TFLOP/s fp32 peak, 800 bf16)
H200 = GpuFacts(name="NVIDIA H200", copy_gbps=4280.0, fp32_tflops=67.0, bf16_tflops=800.0)


def test_softmax_memory_bound():
    n = 4096 * 65536
    nbytes = 2 * n * 4  # read once, write once, fp32: 2.1 GB
    assert nbytes == pytest.approx(2.1e9, rel=0.03)
    flops = 5.0 * n  # max, sub, exp, sum, div: far under the memory time
    ms, bound = floor_ms(flops, nbytes, "fp32", H200)
    assert bound == "memory"
    assert ms == pytest.approx(0.50, abs=0.01)
    assert ms == pytest.approx(nbytes / 4.28e12 * 1e3)


def test_matmul_fp32_compute_bound():
    N = 4096
    flops = 2.0 * N**3  # 137 GFLOP
    nbytes = 3 * N * N * 4
    ms, bound = floor_ms(flops, nbytes, "float32", H200)
    assert bound == "compute"
    assert ms == pytest.approx(2.05, abs=0.01)


def test_conv2d_fp32_compute_bound():
    ms, bound = floor_ms(21.1e9, 100 * 3 * 224 * 224 * 4 + 100 * 96 * 55 * 55 * 4, "fp32", H200)
    assert bound == "compute" and ms == pytest.approx(0.315, abs=0.01)


def test_attention_bf16_uses_bf16_rate():
    ms, bound = floor_ms(0.55e12, 4 * 8 * 16 * 4096 * 128 * 2, "bf16", H200)
    assert bound == "compute" and ms == pytest.approx(0.69, abs=0.01)
    # fp16 uses the bf16 rate too
    assert floor_ms(0.55e12, None, "float16", H200) == (ms, "compute")


def test_rmsnorm_bf16_memory_bound():
    n = 8192 * 8192
    ms, bound = floor_ms(4.0 * n, 2 * n * 2, "torch.bfloat16", H200)
    assert bound == "memory" and ms == pytest.approx(0.063, abs=0.002)


def test_units_one_gb_one_tflop():
    f = GpuFacts(name="x", copy_gbps=1000.0, fp32_tflops=1.0, bf16_tflops=2.0)
    assert floor_ms(None, 10**9, "fp32", f) == (pytest.approx(1.0), "memory")  # 1 GB at 1000 GB/s = 1 ms
    assert floor_ms(1e12, None, "fp32", f) == (pytest.approx(1000.0), "compute")  # 1 TFLOP at 1 TFLOP/s = 1 s
    assert floor_ms(1e12, None, "bf16", f) == (pytest.approx(500.0), "compute")


def test_tie_is_memory_and_max_wins():
    f = GpuFacts(name="x", copy_gbps=1000.0, fp32_tflops=1.0)
    assert floor_ms(1e9, 10**9, "fp32", f) == (pytest.approx(1.0), "memory")
    assert floor_ms(3e9, 10**9, "fp32", f) == (pytest.approx(3.0), "compute")


def test_unknown_terms_are_left_out():
    none = GpuFacts(name="x")  # no ceilings measured
    assert floor_ms(1e12, 10**9, "fp32", none) == (None, "")
    assert floor_ms(None, None, "fp32", H200) == (None, "")
    assert floor_ms(0, 0, "fp32", H200) == (None, "")
    # fp64 / int8 have no measured rate: memory only
    ms, bound = floor_ms(1e15, 10**9, "fp64", H200)
    assert bound == "memory" and ms == pytest.approx(1e9 / 4.28e12 * 1e3)
    assert compute_rate_tflops("int8", H200) is None
    assert compute_rate_tflops(" FP32 ", H200) == 67.0


def test_pct_of_roofline():
    assert pct_of_roofline(1.0, 0.5) == pytest.approx(50.0)
    assert pct_of_roofline(0.5, 0.5) == pytest.approx(100.0)
    assert pct_of_roofline(1.067, 0.50) == pytest.approx(46.86, abs=0.01)  # eager softmax, H200
    assert pct_of_roofline(1.0, None) == 0.0
    assert pct_of_roofline(math.inf, 0.5) == 0.0
    assert pct_of_roofline(0.0, 0.5) == 0.0
    assert pct_of_roofline(float("nan"), 0.5) == 0.0
