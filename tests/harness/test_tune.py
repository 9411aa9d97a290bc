"""tune(): failing configs never stop it, the cache (keys, invalidation, resume after a kill),
the tuning curve, the CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerngen.harness.results import EvalResult, Verdict
from kerngen.harness.tune.cache import CacheRecord, TuneCache, TuneKey
from kerngen.harness.tune.tuner import TuneResult, protocol_of, tune

from tests.fakes.tuning import (
    BIG_TUNABLES, GPU, PROBLEM, SIZES, TENSORS, FakeEvaluator, FakeProbe, grid_optimum, make_spec, synthetic_ms,
)

REPO = Path(__file__).resolve().parents[2]


def _tune(ev, spec=None, **kw) -> TuneResult:
    kw.setdefault("probe", None)
    kw.setdefault("nvrtc", "13.0")
    kw.setdefault("gpu", GPU)
    return tune(ev, kw.pop("problem", PROBLEM), spec or make_spec(), sizes=SIZES, tensors=TENSORS, **kw)


def _ids(configs):
    return {json.dumps(c, sort_keys=True) for c in configs}


# ----- failures never stop the tuning -------------------------------------------------------
def test_failing_configs_are_scored_inf_and_tuning_goes_on():
    ev = FakeEvaluator(fail_share=0.3)
    res = _tune(ev, strategy="exhaustive", max_evals=1000, batch=5)
    assert len(res.evaluated) == 48 and len(ev.calls) == 48
    fails = res.failures()
    assert sum(fails.values()) >= 5 and len(fails) >= 2  # several verdicts
    for t in res.evaluated:
        if t.result.verdict is not Verdict.ok:
            assert t.ms == math.inf and t.result.message
    assert res.best.ok and res.best.ms == min(t.ms for t in res.evaluated)
    assert res.best_config == res.best.config


def test_an_evaluator_that_raises_once_does_not_stop_tuning():
    ev = FakeEvaluator(fail_share=0.0, raise_on_batch=2)
    res = _tune(ev, strategy="exhaustive", max_evals=1000, batch=8)
    assert len(res.evaluated) == 48
    broken = [t for t in res.evaluated if t.result.verdict is Verdict.runtime_error]
    assert len(broken) == 8 and "worker pool exploded" in broken[0].result.message
    assert any("evaluator failed" in n for n in res.notes)


def test_the_harness_running_out_of_memory_stops_tuning_and_is_not_cached(tmp_path):
    class OutOfMemory(FakeEvaluator):
        def evaluate(self, problem, candidates, options=None, on_result=None):
            self.batches.append(len(candidates))
            return [EvalResult(verdict=Verdict.harness_error, config=dict(c.config),
                               message="harness error: out of GPU memory: 12 GB") for c in candidates]

    ev = OutOfMemory(fail_share=0.0)
    cache = TuneCache(tmp_path)
    res = _tune(ev, strategy="exhaustive", max_evals=1000, batch=8, cache=cache)
    assert ev.batches == [8] and len(res.evaluated) == 8  # one batch, then it stops
    assert any(n.startswith("stopped: harness error: out of GPU memory") for n in res.notes)
    assert res.outcome() is None
    again = _tune(FakeEvaluator(fail_share=0.0), strategy="exhaustive", max_evals=1000, batch=8, cache=cache)
    assert not any(t.cached for t in again.evaluated)  # nothing of it was kept as a config's result


def test_model_strategy_through_tune_on_a_big_space_with_failures():
    spec = make_spec(BIG_TUNABLES, grid="cdiv(N, BLOCK * TILE)")
    ev = FakeEvaluator(fail_share=0.1)
    res = _tune(ev, spec, strategy="auto", max_evals=288, batch=16, seed=1)
    assert res.strategy == "model"
    assert len(res.evaluated) == 288 == len(ev.calls)
    assert len(_ids(ev.calls)) == 288
    assert res.best.ms <= 1.05 * grid_optimum(BIG_TUNABLES, 0.1)
    assert res.evals_per_minute > 0 and res.measured == 288


def test_budget_in_minutes_stops_between_batches():
    ev = FakeEvaluator(fail_share=0.0, delay_s=0.02)
    res = _tune(ev, strategy="exhaustive", max_evals=1000, batch=4, minutes=0.1 / 60)  # 0.1 s
    assert 4 <= len(res.evaluated) < 48
    assert any("time budget" in n for n in res.notes)


def test_the_deadline_reaches_the_evaluator_and_cancelled_configs_are_neither_recorded_nor_cached(tmp_path):
    """An evaluator that honours ``EvalOptions.deadline`` (as the pool does) cuts a batch in flight:
    its cancelled configs are no results, in the tuning or in the cache."""
    class Honouring(FakeEvaluator):
        def evaluate(self, problem, candidates, options=None, on_result=None):
            assert options is not None and options.deadline is not None
            out = []
            for i, cand in enumerate(candidates):
                if time.monotonic() >= options.deadline:
                    res = EvalResult(verdict=Verdict.cancelled, config=dict(cand.config))
                    out.append(res)
                    if on_result is not None:
                        on_result(i, res)
                else:
                    out.extend(super().evaluate(problem, [cand], options, lambda _, r, i=i: on_result(i, r)))
            return out

    ev = Honouring(fail_share=0.0, delay_s=0.05)
    cache = TuneCache(tmp_path)
    res = _tune(ev, strategy="exhaustive", max_evals=1000, batch=40, minutes=0.5 / 60, cache=cache)
    assert 0 < len(res.evaluated) == len(ev.calls) < 40  # the first batch was cut by the deadline
    assert all(t.result.verdict is not Verdict.cancelled for t in res.evaluated)
    assert any("time budget" in n for n in res.notes)
    lines = [ln for f in tmp_path.rglob("*") if f.is_file() for ln in f.read_text().splitlines() if ln.strip()]
    assert len(lines) == len(ev.calls)  # one cache line per measured config, none for the cancelled


def test_static_pruning_stops_at_its_deadline_with_the_default_examined_first():
    from kerngen.harness.tune.prune import static_prune

    spec = make_spec(BIG_TUNABLES)
    configs = spec.configs()
    survivors, pruned = static_prune(spec, configs, sizes=SIZES, tensors=TENSORS, gpu=GPU,
                                     deadline=time.monotonic() - 1.0)
    assert survivors == [] and pruned == []  # nothing examined past the deadline
    res = _tune(FakeEvaluator(fail_share=0.0), spec, strategy="exhaustive", max_evals=10, minutes=1e-9)
    assert any("static pruning stopped by the time budget" in n for n in res.notes)


def test_default_batch_is_eight_per_gpu():
    ev = FakeEvaluator(fail_share=0.0, n_gpus=2)
    _tune(ev, strategy="exhaustive", max_evals=40)
    assert ev.batches == [16, 16, 8]


def test_next_batch_compiles_while_the_gpu_measures_this_one():
    """The look-ahead: batch k+1 is asked and compiled (probe) while batch k is evaluated, so
    compile and GPU time overlap; the budget still holds exactly."""
    spans: dict[str, list[tuple[float, float]]] = {"probe": [], "eval": []}

    class SlowProbe(FakeProbe):
        def __call__(self, spec, items, gpu):
            t0 = time.monotonic()
            time.sleep(0.05)
            out = super().__call__(spec, items, gpu)
            spans["probe"].append((t0, time.monotonic()))
            return out

    class SlowEval(FakeEvaluator):
        def evaluate(self, problem, candidates, options=None, on_result=None):
            t0 = time.monotonic()
            out = super().evaluate(problem, candidates, options, on_result)
            spans["eval"].append((t0, time.monotonic()))
            return out

    ev = SlowEval(fail_share=0.0, delay_s=0.01)
    t0 = time.monotonic()
    res = _tune(ev, strategy="exhaustive", max_evals=40, batch=8, probe=SlowProbe())
    wall = time.monotonic() - t0
    assert len(res.evaluated) == 40 and ev.batches == [8] * 5
    # every probe after the first starts before the previous batch's evaluation ends
    for (p_start, _), (_, e_end) in zip(spans["probe"][1:], spans["eval"]):
        assert p_start < e_end
    serial = sum(b - a for a, b in spans["probe"]) + sum(b - a for a, b in spans["eval"])
    assert wall < serial - 0.15  # 4 of the 5 probes (0.05 s each) hidden behind evaluations


def test_model_strategy_treats_pending_configs_as_believed_points():
    """Asking 4 then 4 more before any result is told gives the batch of 8 asked at once: the
    pending configs shrink the model's uncertainty exactly as the batch's own picks do."""
    from kerngen.harness.tune.strategies import Space, make_strategy

    def primed():
        space = Space(BIG_TUNABLES, make_spec(BIG_TUNABLES).configs())
        strat = make_strategy("model", space, budget=200, seed=1)
        for cfg in strat.ask(30):
            strat.tell(cfg, synthetic_ms(cfg))
        return strat

    at_once = primed().ask(8)
    split = primed()
    first, second = split.ask(4), split.ask(4)
    assert _ids(first) == _ids(at_once[:4])
    assert _ids(second) == _ids(at_once[4:])


def test_curve_is_monotone_and_ends_at_the_best():
    ev = FakeEvaluator(fail_share=0.2)
    res = _tune(ev, strategy="random", max_evals=40, batch=8, seed=3)
    assert [p.evals for p in res.curve] == list(range(1, 41))
    bests = [p.best_ms for p in res.curve]
    assert all(b2 <= b1 for b1, b2 in zip(bests, bests[1:]))
    secs = [p.seconds for p in res.curve]
    assert all(s2 >= s1 for s1, s2 in zip(secs, secs[1:]))
    assert bests[-1] == res.best.ms


def test_on_result_sees_every_measurement():
    seen = []
    res = _tune(FakeEvaluator(), strategy="exhaustive", max_evals=20, on_result=seen.append)
    assert len(seen) == 20 and _ids(t.config for t in seen) == _ids(t.config for t in res.evaluated)


# ----- the cache ----------------------------------------------------------------------------
def test_cache_location_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "kc"))
    assert TuneCache().dir == tmp_path / "kc" / "tune"
    monkeypatch.delenv("KERNGEN_CACHE_DIR")
    assert TuneCache().dir == Path.home() / ".cache" / "kerngen" / "tune"


def test_every_result_is_one_line_written_as_it_lands(tmp_path):
    cache = TuneCache(tmp_path)
    lines_when_called = []

    def on_result(t):
        (path,) = list(cache.dir.glob("*.jsonl"))
        lines_when_called.append(len(path.read_text().splitlines()))

    _tune(FakeEvaluator(), strategy="exhaustive", max_evals=10, batch=5, cache=cache, on_result=on_result)
    assert lines_when_called == list(range(1, 11))


def test_second_run_reuses_cache_and_remeasures_only_the_top_three(tmp_path):
    cache = TuneCache(tmp_path)
    first = _tune(FakeEvaluator(), strategy="exhaustive", max_evals=1000, cache=cache)
    ev = FakeEvaluator(drift=0.01)  # this run measures 1% slower
    second = _tune(ev, strategy="exhaustive", max_evals=1000, cache=cache)
    top3 = [t.config for t in first.ranked()[:3]]
    assert ev.calls == top3 or sorted(map(str, ev.calls)) == sorted(map(str, top3))
    assert second.cache_hits == 48 and second.remeasured == 3 and second.measured == 3
    assert len(second.evaluated) == 48
    assert second.best_config == first.best_config
    assert second.best.ms == pytest.approx(first.best.ms * 1.01)  # the re-measured value wins
    assert {json.dumps(t.config, sort_keys=True) for t in second.evaluated if not t.cached} == _ids(top3)


@pytest.mark.parametrize("component", ["spec", "problem", "gpu_name", "nvrtc", "driver", "protocol"])
def test_a_change_to_any_key_component_retunes(tmp_path, component):
    cache = TuneCache(tmp_path)
    _tune(FakeEvaluator(), strategy="exhaustive", max_evals=1000, cache=cache)
    kw: dict = {}
    spec = None
    if component == "spec":
        spec = make_spec(source_extra="\n// a different kernel")
    elif component == "problem":
        kw["problem"] = PROBLEM.model_copy(update={"shape": (2048, 512)})
    elif component == "gpu_name":
        kw["gpu"] = GPU.model_copy(update={"name": "Fake H100"})
    elif component == "nvrtc":
        kw["nvrtc"] = "13.1"
    elif component == "driver":
        kw["gpu"] = GPU.model_copy(update={"driver": "590.00"})
    elif component == "protocol":
        from kerngen.harness.evaluator import EvalOptions

        kw["options"] = EvalOptions(budget_ms=25.0)  # the first run used the default protocol
    ev = FakeEvaluator()
    res = _tune(ev, spec, strategy="exhaustive", max_evals=1000, cache=cache, **kw)
    assert res.cache_hits == 0 and len(ev.calls) == 48
    assert len(list(cache.dir.glob("*.jsonl"))) == 2


def test_spec_name_and_description_do_not_change_the_key(tmp_path):
    cache = TuneCache(tmp_path)
    _tune(FakeEvaluator(), strategy="exhaustive", max_evals=1000, cache=cache)
    renamed = make_spec().model_copy(update={"name": "renamed", "description": "same kernel"})
    ev = FakeEvaluator()
    assert _tune(ev, renamed, strategy="exhaustive", max_evals=1000, cache=cache).cache_hits == 48
    assert len(ev.calls) == 3


def test_key_digest_differs_per_component():
    base = TuneKey(spec_hash="a", problem_key="b", gpu="c", nvrtc="d", driver="e")
    names = set()
    for field in TuneKey.model_fields:
        names.add(base.model_copy(update={field: "z"}).filename())
    assert len(names | {base.filename()}) == len(TuneKey.model_fields) + 1


def test_resume_after_a_truncated_last_line(tmp_path):
    cache = TuneCache(tmp_path)
    full = _tune(FakeEvaluator(), strategy="exhaustive", max_evals=1000, cache=cache)
    (path,) = list(cache.dir.glob("*.jsonl"))
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 48
    path.write_bytes(b"".join(lines[:20]) + lines[20][: len(lines[20]) // 2])  # killed mid-write
    key = TuneKey(spec_hash=make_spec().content_hash(), problem_key=PROBLEM.key(), gpu=GPU.name, nvrtc="13.0",
                  driver=GPU.driver, protocol=protocol_of(None))
    assert len(cache.load(key)) == 20
    ev = FakeEvaluator()
    res = _tune(ev, strategy="exhaustive", max_evals=1000, cache=cache)
    assert res.cache_hits == 20
    assert len(ev.calls) == 28 + 3  # the 28 missing configs, and the best 3 cached ones again
    assert len(res.evaluated) == 48 and res.best_config == full.best_config
    # the cut line did not corrupt what was appended after it
    assert len(cache.load(key)) == 48
    ev3 = FakeEvaluator()
    third = _tune(ev3, strategy="exhaustive", max_evals=1000, cache=cache)
    assert len(ev3.calls) == 3 and third.cache_hits == 48


def test_resume_continues_a_model_guided_run(tmp_path):
    spec = make_spec(BIG_TUNABLES)
    cache = TuneCache(tmp_path)
    first = _tune(FakeEvaluator(), spec, strategy="model", max_evals=60, batch=8, cache=cache)
    ev = FakeEvaluator()
    second = _tune(ev, spec, strategy="model", max_evals=100, batch=8, cache=cache)
    assert second.cache_hits == 60 and len(second.evaluated) == 100
    assert len(ev.calls) == 40 + 3
    assert not (_ids(ev.calls[3:]) & _ids(t.config for t in first.evaluated))  # nothing evaluated twice
    assert second.best.ms <= first.best.ms * 1.0001


def test_cache_tolerates_garbage_and_foreign_lines(tmp_path):
    cache = TuneCache(tmp_path)
    key = TuneKey(spec_hash="s", problem_key="p", gpu="g", nvrtc="n", driver="d")
    path = cache.path(key)
    path.parent.mkdir(parents=True)
    path.write_text('not json\n{"config": {"A": 1}, "v": 99}\n')
    from kerngen.harness.results import EvalResult

    cache.append(key, CacheRecord(config={"A": 2}, result=EvalResult(verdict=Verdict.timeout)))
    loaded = cache.load(key)
    assert list(loaded) == [json.dumps({"A": 2})]


def test_kill_9_mid_tuning_then_resume(tmp_path):
    """A real SIGKILL of a process in the middle of tuning: nothing it evaluated is lost."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.tuning", str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cache = TuneCache(tmp_path)
    key = TuneKey(spec_hash=make_spec().content_hash(), problem_key=PROBLEM.key(), gpu=GPU.name, nvrtc="13.0",
                  driver=GPU.driver, protocol=protocol_of(None))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if cache.path(key).exists() and len(cache.load(key)) >= 10:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done = len(cache.load(key))
    assert 10 <= done < 48
    ev = FakeEvaluator()
    res = _tune(ev, strategy="exhaustive", max_evals=1000, cache=TuneCache(tmp_path))
    assert res.cache_hits == done
    assert len(ev.calls) == (48 - done) + 3
    assert len(res.evaluated) == 48
    assert len(cache.load(key)) == 48


# ----- the CLI ------------------------------------------------------------------------------
def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kerngen", "tune", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


def test_cli_missing_spec_is_one_line_exit_2(tmp_path):
    r = _cli("softmax", "--kernel", str(tmp_path / "missing.json"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "missing.json" in lines[0]


def test_cli_bad_spec_and_bad_strategy_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"source": "x"}')
    r = _cli("softmax", "--kernel", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "error:" in r.stderr
    spec = tmp_path / "ok.json"
    make_spec().dump(spec)
    r = _cli("softmax", "--kernel", str(spec), "--strategy", "annealing")
    assert r.returncode == 2 and "annealing" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_without_gpu_is_one_line_exit_2(tmp_path):
    spec = tmp_path / "ok.json"
    make_spec().dump(spec)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", KERNGEN_CACHE_DIR=str(tmp_path / "c"))
    r = _cli("softmax", "--shape", "256x512", "--kernel", str(spec), env=env)
    if r.returncode == 0:  # pragma: no cover - a GPU host
        pytest.skip("a GPU is visible")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")


class _FakePool(FakeEvaluator):
    def __init__(self, *a, **kw) -> None:
        super().__init__(fail_share=0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _softmax_spec(path: Path) -> None:
    from kerngen.harness.spec.spec import KernelSpec

    KernelSpec(
        name="softmax-rows", source='extern "C" __global__ void k(const float* x, float* out, int r, int c) {}',
        tunables={"BLOCK": [32, 64, 128, 256, 512, 1024], "TILE": [1, 2, 4, 8, 16], "VEC": [1, 2, 4]},
        constraints=["cols % VEC == 0"],
        steps=[{"kernel": "k", "grid": ["rows"], "block": ["BLOCK"], "shared_mem": "BLOCK * 4",
                "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "rows"},
                         {"kind": "int32", "value": "cols"}]}],
    ).dump(path)


@pytest.fixture
def fake_pool(monkeypatch, tmp_path):
    import kerngen.harness.pool.local as pool_mod

    monkeypatch.setattr(pool_mod, "WorkerPool", _FakePool)
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    spec = tmp_path / "softmax.json"
    _softmax_spec(spec)
    return spec


def _run_app(*args):
    from typer.testing import CliRunner

    from kerngen.cli.app import app

    return CliRunner().invoke(app, ["tune", *args])


def test_cli_table_and_json_with_a_fake_pool(fake_pool, monkeypatch):
    import kerngen.harness.tune.tuner as tuner_mod

    real = tuner_mod.tune
    monkeypatch.setattr(tuner_mod, "tune", lambda *a, **kw: real(*a, **{**kw, "probe": None}))
    r = _run_app("softmax", "--shape", "256x512", "--kernel", str(fake_pool), "--max-evals", "30", "--top", "3")
    assert r.exit_code == 0, r.output
    assert "evals/min" in r.output and "vs eager" in r.output and "% roofline" in r.output
    assert "cache hits" in r.output
    r = _run_app("softmax", "--shape", "256x512", "--kernel", str(fake_pool), "--max-evals", "30", "--json")
    assert r.exit_code == 0, r.output
    payload = json.loads(r.output)
    assert payload["summary"]["cache_hits"] == 30 and payload["summary"]["remeasured"] == 3
    assert len(payload["top"]) == 5 and payload["top"][0]["speedup_vs_eager"] > 0
    assert payload["top"][0]["pct_of_roofline"] > 0


def test_cli_compare_exhaustive(fake_pool, monkeypatch):
    import kerngen.harness.tune.tuner as tuner_mod

    real = tuner_mod.tune
    monkeypatch.setattr(tuner_mod, "tune", lambda *a, **kw: real(*a, **{**kw, "probe": None}))
    r = _run_app("softmax", "--shape", "256x512", "--kernel", str(fake_pool), "--compare-exhaustive", "--json")
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["exhaustive"]["evals"] == 90
    assert p["model"]["evals"] == 18
    assert p["gap_pct"] is not None and len(p["replay_gaps_pct"]) == 5
    r = _run_app("softmax", "--shape", "256x512", "--kernel", str(fake_pool), "--compare-exhaustive")
    assert r.exit_code == 0, r.output
    assert "exhaustive vs model-guided" in r.output and "gap" in r.output


def test_an_evaluator_that_keeps_raising_stops_with_its_error(tmp_path):
    class Dead(FakeEvaluator):
        def evaluate(self, *a, **kw):
            raise RuntimeError("pool is gone")

    with pytest.raises(RuntimeError, match="pool is gone"):
        _tune(Dead(), strategy="exhaustive", max_evals=1000, batch=8)


def test_huge_spaces_are_sampled_with_the_default_kept(monkeypatch):
    import kerngen.harness.tune.tuner as tuner_mod
    from kerngen.harness.tune.prune import enumerate_configs

    spec = make_spec(BIG_TUNABLES)
    sample = enumerate_configs(spec, seed=1, limit=100)
    assert len(sample) == 100 and len(_ids(sample)) == 100
    assert spec.default_config() in sample
    monkeypatch.setattr(tuner_mod, "ENUM_LIMIT", 200)
    ev = FakeEvaluator()
    res = _tune(ev, spec, strategy="auto", max_evals=50)
    assert res.feasible <= 200 and res.space_size == 1440 and len(ev.calls) == 50
    assert any("sampled" in n for n in res.notes)
