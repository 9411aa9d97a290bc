"""harness/gpu/facts.py and harness/gpu/ceilings.py: pure parts and the disk cache on the CPU; the
real device's facts and ceilings on a GPU."""

from __future__ import annotations

import time

import pytest

from kerngen.harness.gpu import ceilings, clocks, facts as gpu_facts
from kerngen.harness.gpu.ceilings import Ceilings, cache_path, gbps, measure_ceilings, tflops
from kerngen.harness.gpu.facts import arch_from_cc
from kerngen.harness.results import ClockReading


def test_arch_from_cc():
    assert arch_from_cc(9, 0) == "sm_90"
    assert arch_from_cc(8, 6) == "sm_86"
    assert arch_from_cc(10, 0) == "sm_100"


def test_units():
    assert gbps(2 * 2**30, 0.5) == pytest.approx(4294.967296)  # 2 GiB in 0.5 ms
    assert tflops(2.0 * 8192**3, 1.4) == pytest.approx(785.4, abs=0.1)


def test_cache_dir_env_and_key(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    p = cache_path("NVIDIA H200", "580.159.04", "2.11.0+cu130")
    assert p.parent == tmp_path / "ceilings"
    assert p.suffix == ".json" and " " not in p.name and "/" not in p.name
    assert p != cache_path("NVIDIA H200", "580.159.03", "2.11.0+cu130")
    assert p != cache_path("NVIDIA H200", "580.159.04", "2.12.0+cu130")
    assert p != cache_path("NVIDIA H100 80GB HBM3", "580.159.04", "2.11.0+cu130")
    monkeypatch.delenv("KERNGEN_CACHE_DIR")
    assert ".cache/kerngen/ceilings" in str(cache_path("a", "b", "c"))


@pytest.fixture
def fake_device(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(gpu_facts, "driver_version", lambda: "999.1")
    monkeypatch.setattr(clocks, "driver_version", lambda: "999.1")  # what ceilings reads
    calls = []

    def fake_measure(i):
        calls.append(i)
        return 4280.0 + len(calls), 51.0, 800.0, {"bf16": ClockReading(sm_mhz_before=1980, sm_mhz_after=1500)}

    monkeypatch.setattr(ceilings, "_measure", fake_measure)
    return calls


def test_ceilings_cached_on_disk(fake_device, tmp_path):
    a = measure_ceilings(0)
    assert fake_device == [0]
    assert (a.gpu, a.driver, a.copy_gbps) == ("Fake GPU", "999.1", 4281.0)
    assert a.clocks["bf16"].sm_mhz_after == 1500
    files = list((tmp_path / "ceilings").glob("*.json"))
    assert len(files) == 1 and Ceilings.model_validate_json(files[0].read_text()) == a
    b = measure_ceilings(0)
    assert fake_device == [0] and b == a  # from the cache
    c = measure_ceilings(0, refresh=True)
    assert fake_device == [0, 0] and c.copy_gbps == 4282.0
    assert measure_ceilings(0) == c  # the refresh replaced the cache


def test_corrupt_cache_is_remeasured(fake_device, tmp_path):
    a = measure_ceilings(0)
    next((tmp_path / "ceilings").glob("*.json")).write_text("{not json")
    b = measure_ceilings(0)
    assert fake_device == [0, 0] and b.copy_gbps != a.copy_gbps


# --- the GPU tier ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch


@pytest.mark.gpu
def test_gpu_facts_of_the_device(cuda):
    f = gpu_facts.gpu_facts(0, with_ceilings=False)
    p = cuda.cuda.get_device_properties(0)
    assert f.name == p.name and f.arch == f"sm_{p.major}{p.minor}"
    assert f.sm_count == p.multi_processor_count > 0
    assert f.l2_bytes > 1024 * 1024 and f.mem_bytes > 2**30
    assert 48 * 1024 <= f.max_shared_per_block <= f.max_shared_per_block_optin <= f.shared_per_sm
    assert f.regs_per_block >= 32768 and f.regs_per_sm >= 32768
    assert f.max_threads_per_block == 1024
    assert f.driver and f.driver != "unknown"
    assert f.copy_gbps is None
    if f.arch == "sm_90":  # H100 / H200
        assert f.max_shared_per_block_optin == 227 * 1024 and f.shared_per_sm == 228 * 1024


@pytest.mark.gpu
def test_ceilings_plausible_and_cached(cuda, monkeypatch, tmp_path):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    tf32_before = cuda.backends.cuda.matmul.allow_tf32
    t0 = time.perf_counter()
    c = measure_ceilings(0)
    first_s = time.perf_counter() - t0
    assert cuda.backends.cuda.matmul.allow_tf32 == tf32_before  # the flag is restored
    assert c.copy_gbps > 1000
    assert 20 < c.fp32_tflops < 100  # TF32 really off (TF32 would be several hundred)
    assert c.bf16_tflops > 300
    assert first_s < 60
    t0 = time.perf_counter()
    again = measure_ceilings(0)
    assert again == c and time.perf_counter() - t0 < 1.0  # from the cache
    assert len(list((tmp_path / "ceilings").glob("*.json"))) == 1
    f = gpu_facts.gpu_facts(0)  # with ceilings, from the same cache
    assert (f.copy_gbps, f.fp32_tflops, f.bf16_tflops) == (c.copy_gbps, c.fp32_tflops, c.bf16_tflops)
    print(f"\nceilings: {c.model_dump()} (measured in {first_s:.1f} s)")
