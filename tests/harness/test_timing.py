"""harness/gpu/timing.py: statistics, rep planning and the bench protocol (CPU), and the real thing
on a GPU (``@pytest.mark.gpu``)."""

from __future__ import annotations

import contextlib
import statistics

import pytest

from kerngen.harness.gpu import timing
from kerngen.harness.gpu.timing import flush_bytes, plan_reps, quantile, summarize

MiB = 1024 * 1024


# --- summarize(): pure statistics --------------------------------------------------------------


def test_summarize_odd_count():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], warmup=7, l2_flushed=True)
    assert t.median_ms == 3.0
    assert t.q25_ms == 2.0 and t.q75_ms == 4.0
    assert t.min_ms == 1.0 and t.max_ms == 5.0
    assert t.mean_ms == pytest.approx(3.0)
    assert t.reps == 5 and t.warmup == 7 and t.l2_flushed
    assert t.samples_ms == [5.0, 1.0, 3.0, 2.0, 4.0]  # raw order kept
    assert t.iqr_ms == 2.0 and t.spread == pytest.approx(2.0 / 3.0)


def test_summarize_even_count_interpolates():
    t = summarize([4.0, 1.0, 2.0, 3.0], warmup=3, l2_flushed=False)
    assert t.median_ms == pytest.approx(2.5)
    # numpy's linear method: h = (n-1) q -> 0.75 and 2.25
    assert t.q25_ms == pytest.approx(1.75)
    assert t.q75_ms == pytest.approx(3.25)
    assert t.mean_ms == pytest.approx(2.5)
    assert not t.l2_flushed


def test_summarize_matches_statistics_module():
    xs = [0.91, 1.07, 1.02, 0.99, 1.5, 1.01, 0.98, 1.0, 1.03, 0.97, 1.2]
    t = summarize(xs, warmup=3, l2_flushed=True)
    assert t.median_ms == pytest.approx(statistics.median(xs))
    q = statistics.quantiles(xs, n=4, method="inclusive")  # the same linear interpolation
    assert t.q25_ms == pytest.approx(q[0]) and t.q75_ms == pytest.approx(q[2])
    assert t.mean_ms == pytest.approx(statistics.fmean(xs))


def test_summarize_single_sample_and_drop_samples():
    t = summarize([0.25], warmup=3, l2_flushed=True, keep_samples=False)
    assert t.median_ms == t.q25_ms == t.q75_ms == t.min_ms == t.max_ms == 0.25
    assert t.samples_ms == [] and t.reps == 1


def test_summarize_rejects_empty_and_nan():
    with pytest.raises(ValueError):
        summarize([], warmup=3, l2_flushed=True)
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")], warmup=3, l2_flushed=True)


def test_quantile_edges():
    s = [1.0, 2.0, 10.0]
    assert quantile(s, 0.0) == 1.0 and quantile(s, 1.0) == 10.0 and quantile(s, 0.5) == 2.0
    assert quantile(s, 0.75) == pytest.approx(6.0)
    with pytest.raises(ValueError):
        quantile(s, 1.5)


# --- plan_reps(): pure planning ----------------------------------------------------------------


def test_plan_reps_from_estimate_and_budget():
    # 0.5 ms a call: 25 ms of warm-up = 50 calls, 200 ms of budget = 400 reps
    assert plan_reps(0.5, budget_ms=200.0, warmup_ms=25.0, min_reps=10, max_reps=1000) == (50, 400)


def test_plan_reps_slow_call_hits_minimums():
    # 21 ms a call (fp32 8192^3 matmul): warm-up at least 3, reps at least min_reps
    assert plan_reps(21.0, budget_ms=200.0, warmup_ms=25.0, min_reps=10, max_reps=1000) == (3, 10)


def test_plan_reps_fast_call_hits_max_reps():
    w, r = plan_reps(0.005, budget_ms=200.0, warmup_ms=25.0, min_reps=10, max_reps=1000)
    assert r == 1000 and w == 5000


def test_plan_reps_degenerate_estimates():
    w, r = plan_reps(0.0, budget_ms=200.0, warmup_ms=25.0, min_reps=10, max_reps=1000)
    assert r == 1000 and 3 <= w <= timing.MAX_WARMUP
    assert plan_reps(float("nan"), min_reps=10, max_reps=1000) == (3, 10)
    assert plan_reps(float("inf"), min_reps=10, max_reps=1000) == (3, 10)
    with pytest.raises(ValueError):
        plan_reps(1.0, min_reps=20, max_reps=10)


def test_flush_bytes_at_least_256mib_and_twice_l2():
    assert flush_bytes(0) == 256 * MiB
    assert flush_bytes(50 * MiB) == 256 * MiB
    assert flush_bytes(200 * MiB) == 400 * MiB
    assert flush_bytes(60_000_001) % 4 == 0


# --- bench(): the protocol, with a fake CUDA ---------------------------------------------------


class _FakeStream:
    device = "cuda:0"

    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("sync")

    def wait_stream(self, other):
        self.log.append("wait")


def _fake_cuda(monkeypatch, log, per_call_ms, host_late=lambda log: False):
    """Events alternate start, end (bench makes them in pairs). A start's query() says whether
    the GPU already passed it when the call was enqueued (``host_late``); an end's query() is the
    clock poll, done at its third call."""
    torch = pytest.importorskip("torch")
    made = {"n": 0}

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.is_start = made["n"] % 2 == 0
            made["n"] += 1

        def record(self, stream):
            assert isinstance(stream, _FakeStream)
            log.append("rec")

        def elapsed_time(self, end):
            return per_call_ms

        def query(self):
            if self.is_start:
                log.append("late?")
                return host_late(log)
            log.append("query")
            return len([x for x in log if x == "query"]) > 2  # done at the third poll

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep{cycles}"))


def test_bench_protocol_order(monkeypatch):
    log: list[str] = []
    _fake_cuda(monkeypatch, log, per_call_ms=1.0)

    class Flusher:
        def flush(self, stream):
            assert isinstance(stream, _FakeStream)
            log.append("flush")

    class Clocks:
        def start(self):
            log.append("clk0")

        def sample(self):
            log.append("sample")

        def stop(self):
            log.append("clk1")
            from kerngen.harness.results import ClockReading

            return ClockReading(sm_mhz_before=1980, sm_mhz_after=1980)

    t = timing.bench(
        lambda: log.append("fn"),
        stream=_FakeStream(log),
        before_each=lambda: log.append("pre"),
        flusher=Flusher(),
        budget_ms=20.0,
        warmup_ms=5.0,
        min_reps=4,
        max_reps=100,
        clocks=Clocks(),
    )
    # 1 ms a call: warm-up 5, reps 20
    assert (t.warmup, t.reps) == (5, 20)
    assert t.median_ms == 1.0 and len(t.samples_ms) == 20 and t.l2_flushed
    assert t.clocks is not None and t.clocks.sm_mhz_after == 1980
    rep = ["pre", "flush", "rec", "fn", "late?", "rec"]
    expect = (
        ["wait", "pre", "fn", "sync"]  # the untimed first call
        + rep * timing.ESTIMATE_CALLS
        + ["sync"]  # the estimate
        + ["pre", "fn"] * 5  # warm-up
        + ["clk0"]
        + rep * 20
        + ["query", "sample"] * 2  # clocks sampled while the reps run
        + ["query", "clk1", "sync"]  # one synchronize for all timed reps
    )
    assert log == expect


def test_bench_measures_again_with_a_lead_when_the_host_falls_behind(monkeypatch):
    """A sample whose start the GPU reached before the call was enqueued holds host time: above
    1% of such reps, the series is redone with a GPU spin queued before every rep's flush."""
    log: list[str] = []
    # the host is late on every rep until a lead is queued
    _fake_cuda(monkeypatch, log, per_call_ms=1.0, host_late=lambda log: not any(x.startswith("sleep") for x in log))

    class Flusher:
        def flush(self, stream):
            log.append("flush")

    t = timing.bench(lambda: log.append("fn"), stream=_FakeStream(log), flusher=Flusher(), budget_ms=20.0,
                     warmup_ms=5.0, min_reps=4, max_reps=100)
    # the lead is the minimum, or more where this host's own time per rep is longer (a loaded machine: it was a
    # flake when the test asked for exactly the minimum)
    assert t.lead_cycles >= timing.LEAD_CYCLES and (t.late_reps, t.reps) == (0, 20)
    lead = f"sleep{t.lead_cycles}"
    kept = log[log.index(lead):]
    assert kept[:6] == [lead, "flush", "rec", "fn", "late?", "rec"] and kept.count(lead) == 20
    assert log.count("sync") == 4  # first call, estimate, the late series, the kept series


def test_lead_is_sized_from_the_host_time_per_rep(monkeypatch):
    """A host that needs 1 ms a rep gets a lead of at least twice that, not the minimum."""
    import time

    log: list[str] = []
    # on time only behind a spin of >= 2 ms at the assumed clock
    need = int(2e-3 * timing.LEAD_CLOCK_HZ)
    _fake_cuda(monkeypatch, log, per_call_ms=1.0,
               host_late=lambda log: not any(x.startswith("sleep") and int(x[5:]) >= need for x in log))
    t = timing.bench(lambda: time.sleep(1e-3), stream=_FakeStream(log), flusher=None, budget_ms=20.0,
                     warmup_ms=5.0, min_reps=4, max_reps=100)
    assert t.late_reps == 0 and need <= t.lead_cycles < 4 * need


def test_bench_reports_a_host_that_stays_behind(monkeypatch):
    log: list[str] = []
    _fake_cuda(monkeypatch, log, per_call_ms=1.0, host_late=lambda log: True)
    t = timing.bench(lambda: log.append("fn"), stream=_FakeStream(log), flusher=None, budget_ms=20.0,
                     warmup_ms=5.0, min_reps=4, max_reps=100)
    assert t.late_reps == t.reps == 20 and t.lead_cycles == 2 * timing.LEAD_CYCLES  # every try spent
    assert log.count(f"sleep{timing.LEAD_CYCLES}") == 20 and log.count(f"sleep{2 * timing.LEAD_CYCLES}") == 20


def test_bench_without_flusher_or_before_each(monkeypatch):
    log: list[str] = []
    _fake_cuda(monkeypatch, log, per_call_ms=50.0)
    t = timing.bench(lambda: log.append("fn"), stream=_FakeStream(log), flusher=None, keep_samples=False)
    assert not t.l2_flushed and t.samples_ms == [] and t.clocks is None
    assert (t.warmup, t.reps) == (3, 10)
    assert "flush" not in log and log.count("sync") == 3


def test_side_by_side_interleaves_the_calls_rep_by_rep(monkeypatch):
    """Two calls in one series: each rep times both, A B then B A (a clock that moves during the series
    weighs on both alike); each gets its own samples, and the reps come from the summed estimate."""
    torch = pytest.importorskip("torch")
    log: list[str] = []
    ms = {"A": 1.0, "B": 3.0}

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self, stream):
            self.at = len(log)
            log.append("rec")

        def elapsed_time(self, end):  # the call logged between this start and that end
            (ran,) = [x for x in log[self.at:end.at] if x in ms]
            return ms[ran]

        def query(self):  # the host is never late
            return False

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: None)
    a, b = timing.bench_side_by_side([lambda: log.append("A"), lambda: log.append("B")], stream=_FakeStream(log),
                                     flusher=None, budget_ms=40.0, warmup_ms=8.0, min_reps=4, max_reps=100)
    assert (a.median_ms, b.median_ms) == (1.0, 3.0)
    assert a.reps == b.reps == 10 and a.warmup == 3  # 4 ms a rep: 40 ms of budget, warm-up at least 3 reps
    calls = [x for x in log if x in ms]
    assert calls[-20:] == ["A", "B", "B", "A"] * 5  # the timed series: 10 reps of two calls
    assert len(calls) == 2 + 2 * timing.ESTIMATE_CALLS + 2 * 3 + 20  # first calls, estimate, warm-up, reps
    with pytest.raises(ValueError, match="at least one call"):
        timing.bench_side_by_side([], stream=_FakeStream(log), flusher=None)


# --- the GPU tier ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch


def _add_op(torch, nbytes):
    n = nbytes // 4
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand(n, device="cuda", generator=g)
    b = torch.rand(n, device="cuda", generator=g)
    out = torch.empty_like(a)
    torch.cuda.synchronize()
    return (lambda: torch.add(a, b, out=out)), out


@pytest.mark.gpu
def test_l2_flusher_size(cuda):
    f = timing.L2Flusher(cuda.device("cuda", 0))
    l2 = cuda.cuda.get_device_properties(0).L2_cache_size
    assert f.nbytes >= max(2 * l2, 256 * MiB)
    s = cuda.cuda.Stream()
    f.flush(s)
    f.flush(s)
    s.synchronize()
    assert int(f._buf[0].item()) == 2  # non-zero values


@pytest.mark.gpu
def test_bench_agrees_with_triton_do_bench(cuda):
    triton_testing = pytest.importorskip("triton.testing")
    fn, _ = _add_op(cuda, 256 * MiB)
    stream = cuda.cuda.Stream()
    flusher = timing.L2Flusher(cuda.device("cuda", 0))
    ours = timing.bench(fn, stream=stream, flusher=flusher).median_ms
    with cuda.cuda.stream(stream):
        theirs = triton_testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    print(f"\nadd 256 MiB: bench {ours:.4f} ms, triton do_bench {theirs:.4f} ms")
    assert abs(ours - theirs) / theirs <= 0.03, (ours, theirs)


@pytest.mark.gpu
def test_bench_run_to_run_spread(cuda):
    fn, out = _add_op(cuda, 256 * MiB)
    stream = cuda.cuda.Stream()
    flusher = timing.L2Flusher(cuda.device("cuda", 0))
    poison = lambda: out.fill_(float("nan"))  # noqa: E731  (what the harness does there)
    meds = [timing.bench(fn, stream=stream, before_each=poison, flusher=flusher).median_ms for _ in range(5)]
    spread = (max(meds) - min(meds)) / statistics.median(meds)
    print(f"\nmedians of 5 bench() calls: {[round(m, 4) for m in meds]}, spread {spread:.2%}")
    assert spread <= 0.02, meds
    assert not cuda.isnan(out).any()  # the timed call overwrote the poison


@pytest.mark.gpu
def test_l2_flush_makes_l2_resident_op_slower_or_equal(cuda):
    fn, _ = _add_op(cuda, 8 * MiB)  # 3 x 8 MiB: fits in L2
    stream = cuda.cuda.Stream()
    flusher = timing.L2Flusher(cuda.device("cuda", 0))
    warm = timing.bench(fn, stream=stream, flusher=None, budget_ms=100.0)
    cold = timing.bench(fn, stream=stream, flusher=flusher, budget_ms=100.0)
    print(f"\nadd 8 MiB: warm L2 {warm.median_ms:.4f} ms, flushed {cold.median_ms:.4f} ms")
    assert not warm.l2_flushed and cold.l2_flushed
    assert cold.median_ms >= 0.98 * warm.median_ms, (cold.median_ms, warm.median_ms)


@pytest.mark.gpu
def test_bench_records_clocks(cuda):
    from kerngen.harness.gpu.clocks import ClockMonitor

    fn, _ = _add_op(cuda, 64 * MiB)
    t = timing.bench(
        fn, stream=cuda.cuda.Stream(), flusher=None, budget_ms=50.0, clocks=ClockMonitor(0)
    )
    assert t.clocks is not None
    print(f"\nclocks: {t.clocks.model_dump()}")
    if t.clocks.available:  # NVML may be missing in a sandbox; never a failure then
        assert t.clocks.sm_mhz_after and t.clocks.sm_mhz_after > 0


@pytest.mark.gpu
def test_host_time_is_detected_and_kept_out_of_the_samples(cuda):
    """0.2 ms of host work before a ~5 us add: the flush alone cannot hide it, so without the
    retry every rep is late and the median holds host time; with it the GPU lead keeps it out."""
    from kerngen.harness.gpu.calibrate import host_lag

    lag = host_lag(budget_ms=50.0)
    assert lag.without_lead_late >= 0.9 * lag.without_lead_reps, lag
    assert lag.with_lead_late <= 0.01 * lag.with_lead_reps and lag.lead_cycles > 0, lag
    assert lag.with_lead_ms < 0.5 * lag.without_lead_ms, lag
