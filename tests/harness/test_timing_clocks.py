"""harness/gpu/clocks.py with a fake NVML (CPU), and a real reading on a GPU."""

from __future__ import annotations

import sys

import pytest

from kerngen.harness.gpu import clocks
from kerngen.harness.gpu.clocks import ClockMonitor, is_sagged, reason_names


@pytest.fixture(autouse=True)
def _fresh_nvml():
    clocks._reset_nvml()
    yield
    clocks._reset_nvml()


class FakeNvml:
    """Just the reads ClockMonitor makes; every setter is absent, so a call to one fails."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, sm=(1980, 1980), reasons=0x0, event_api=True):
        self._sm = list(sm)
        self._reasons = reasons
        self.calls: list[str] = []
        if not event_api:  # an older NVML: only the "throttle" name
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._get_reasons
        else:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._get_reasons

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetHandleByUUID(self, u):
        return ("h", u)

    def nvmlDeviceGetClockInfo(self, h, kind):
        if kind == self.NVML_CLOCK_SM:
            return self._sm.pop(0)
        return 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 40 + len(self._sm)

    def nvmlDeviceGetPowerUsage(self, h):
        return 512_345  # mW

    def _get_reasons(self, h):
        if isinstance(self._reasons, list):
            return self._reasons.pop(0)
        return self._reasons


def _monitor(monkeypatch, fake) -> ClockMonitor:
    monkeypatch.setattr(clocks, "_nvml", lambda: fake)
    return ClockMonitor(0)


def test_reason_names():
    assert reason_names(0) == []
    assert reason_names(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal"]
    assert reason_names(0x8 | 0x20 | 0x80) == ["hw_slowdown", "sw_thermal", "hw_power_brake"]
    assert reason_names(1 << 20) == ["bit_0x100000"]


def test_is_sagged_pure():
    assert not is_sagged(1980, 1980, [])
    assert not is_sagged(1980, 1800, [])  # 91%: within 10%
    assert is_sagged(1980, 1700, [])  # 86%
    assert not is_sagged(345, 1980, [])  # clocks rose (idle before)
    assert not is_sagged(1980, 1980, ["gpu_idle", "applications_clocks", "sync_boost"])
    for r in ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"):
        assert is_sagged(1980, 1980, [r]), r
    assert not is_sagged(None, 1500, [])  # nothing to compare
    assert is_sagged(None, None, ["hw_thermal"])


def test_monitor_steady_clocks(monkeypatch):
    m = _monitor(monkeypatch, FakeNvml(sm=(1980, 1980), reasons=0x1))
    m.start()
    r = m.stop()
    assert r.available and not r.sagged
    assert (r.sm_mhz_before, r.sm_mhz_after, r.sm_mhz_max, r.mem_mhz) == (1980, 1980, 1980, 2619)
    assert r.temp_c_before == 41 and r.temp_c_after == 40
    assert r.power_w == pytest.approx(512.345)
    assert r.throttle_reasons == ["gpu_idle"]


def test_monitor_clock_drop_is_a_sag(monkeypatch):
    m = _monitor(monkeypatch, FakeNvml(sm=(1980, 1410)))
    m.start()
    r = m.stop()
    assert r.available and r.sagged and r.throttle_reasons == []


def test_monitor_thermal_reason_is_a_sag_old_api(monkeypatch):
    m = _monitor(monkeypatch, FakeNvml(sm=(1980, 1980), reasons=0x20, event_api=False))
    m.start()
    r = m.stop()
    assert r.sagged and r.throttle_reasons == ["sw_thermal"]


def test_monitor_sag_seen_only_in_a_sample(monkeypatch):
    """A power cap while the work runs, gone by stop(): still a sag, with its reason."""
    fake = FakeNvml(sm=(1980, 1500, 1515, 1980), reasons=[0x4, 0x4, 0x0])
    power = iter([90_000, 650_000, 700_000, 400_000])
    fake.nvmlDeviceGetPowerUsage = lambda h: next(power)
    m = _monitor(monkeypatch, fake)
    m.start()
    m.sample()
    m.sample()
    r = m.stop()
    assert r.sagged and r.throttle_reasons == ["sw_power_cap"]
    assert (r.sm_mhz_before, r.sm_mhz_after) == (1980, 1980)
    assert r.power_w == pytest.approx(700.0)  # the highest reading


def test_sample_before_start_is_ignored(monkeypatch):
    m = _monitor(monkeypatch, FakeNvml(sm=(1980, 1980)))
    m.sample()  # no start: nothing read
    m.start()
    assert not m.stop().sagged


def test_monitor_read_failure_is_not_a_crash(monkeypatch):
    fake = FakeNvml()

    def boom(h, kind):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    fake.nvmlDeviceGetClockInfo = boom
    m = _monitor(monkeypatch, fake)
    m.start()
    assert m.stop().available is False


def test_stop_without_start(monkeypatch):
    m = _monitor(monkeypatch, FakeNvml())
    assert m.stop().available is False


def test_nvml_missing_gives_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    m = ClockMonitor(0)
    m.start()
    r = m.stop()
    assert r.available is False and not r.sagged
    assert clocks.nvml_driver_version() is None


def test_nvml_init_failure_gives_unavailable(monkeypatch):
    class Broken:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    m = ClockMonitor(0)
    m.start()
    assert m.stop().available is False


def test_monitor_never_sets_anything():
    """The module only reads: no NVML setter, reset or persistence call appears in it."""
    import inspect

    src = inspect.getsource(clocks)
    for bad in ("nvmlDeviceSet", "nvmlDeviceReset", "PersistenceMode", "ApplicationsClocks(", "PowerManagementLimit"):
        assert bad not in src, bad


@pytest.mark.gpu
def test_real_clock_reading():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    r = clocks.read_clocks(0)
    if not r.available:
        pytest.skip("NVML not usable here")
    assert r.sm_mhz_after and r.sm_mhz_max and r.sm_mhz_after <= r.sm_mhz_max * 1.05
