"""The autotuner: tune the launch parameters (tunables) of one kernel spec on one problem.

Flow of :func:`tune`:

1. Enumerate the spec's configurations (a seeded sample of :data:`ENUM_LIMIT` when the product
   is larger) and prune them on the CPU (:mod:`kerngen.harness.tune.prune`): constraints, launch plans
   that do not resolve, threads and dynamic shared memory over the GPU's limits.
2. Load what the on-disk cache (:mod:`kerngen.harness.tune.cache`) holds for this key; re-measure
   the best few cached configs on this run (``confirm``) and tell the rest to the strategy.
3. Ask the strategy (:mod:`kerngen.harness.tune.strategies`) for batches sized to keep every GPU busy;
   compile each batch with NVRTC first (``compile_many``; the compile layer caches cubins on disk,
   so the evaluator's own compile is a cache hit) and prune configs whose registers or static +
   dynamic shared memory cannot fit a block; evaluate the rest through the Evaluator, which runs
   the FULL correctness check on every config, then times it.
4. A config that fails to compile, crashes, hangs or is wrong scores ``inf`` with its verdict and
   tuning goes on. Each result is appended (fsync'ed) to the cache as it lands, and the tuning
   curve (best-so-far against evaluations and seconds) is recorded.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping

from pydantic import BaseModel, Field

from kerngen.problems.ref import ProblemRef

from kerngen.errors import KerngenError
from kerngen.harness.compile.nvrtc_info import nvrtc_version
from kerngen.harness.evaluator import Candidate, EvalOptions, Evaluator
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.tune.prune import (KINDS, PrunedConfig, ResourceProbe, compile_probe, enumerate_configs, examples,
                                        resource_reason, static_prune, summarize)
from kerngen.harness.results import CompileInfo, EvalResult, GpuFacts, Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.strategies import STRATEGIES, Space, make_strategy
from kerngen.harness.tune.cache import CacheRecord, TuneCache, TuneKey, config_id
from kerngen.harness.tune.outcome import TuneOutcome, TunePoint

# larger spaces are sampled (seeded) down to this many configs: a tuning run measures a few hundred,
# and static pruning of 100,000 (the earlier limit) took 15-40 s of CPU before the first measurement
ENUM_LIMIT = 25_000
PER_GPU_BATCH = 8
CONFIRM_TOP = 3  # cached configs re-measured on a run that reuses the cache


class TunedConfig(BaseModel):
    config: dict[str, int]
    result: EvalResult | None = None
    pruned: str = ""  # the reason, when the config was pruned
    prune_kind: str = ""  # one of prune.KINDS
    cached: bool = False  # result taken from the cache, not measured on this run

    @property
    def ms(self) -> float:
        return self.result.ms if self.result is not None else math.inf


CurvePoint = TunePoint  # one point of the tuning curve: THE type (kerngen.harness.tune.outcome)


class TuneResult(BaseModel):
    best_config: dict[str, int] | None
    best: EvalResult | None
    evaluated: list[TunedConfig]
    pruned: list[TunedConfig]
    curve: list[CurvePoint]
    strategy: str
    seconds: float
    evals_per_minute: float
    cache_hits: int
    space_size: int = 0  # configurations of the spec (product of the tunables' values)
    feasible: int = 0  # after static pruning
    measured: int = 0  # evaluations run on this run (re-measurements included)
    remeasured: int = 0  # cached configs re-measured on this run
    notes: list[str] = Field(default_factory=list)

    def pruned_counts(self) -> dict[str, int]:
        return summarize(PrunedConfig(config=p.config, kind=p.prune_kind, reason=p.pruned) for p in self.pruned)

    def pruned_examples(self) -> dict[str, str]:
        return examples(PrunedConfig(config=p.config, kind=p.prune_kind, reason=p.pruned) for p in self.pruned)

    def ranked(self) -> list[TunedConfig]:
        """Correct configs, fastest first."""
        ok = [t for t in self.evaluated if t.result is not None and t.result.ok]
        return sorted(ok, key=lambda t: t.ms)

    def phase_medians(self) -> dict[str, float]:
        """Median seconds of each phase (compile, load, check, bench, ..., round_trip) over the
        configs measured on this run: where an evaluation's time goes."""
        spans: dict[str, list[float]] = {}
        for t in self.evaluated:
            if t.result is not None and not t.cached:
                for name, sec in t.result.phases_s.items():
                    spans.setdefault(name, []).append(sec)
        return {name: round(statistics.median(v), 5) for name, v in spans.items()}

    def outcome(self) -> TuneOutcome | None:
        """THE tuning outcome the search records (None when no configuration was correct)."""
        if self.best_config is None or self.best is None:
            return None
        return TuneOutcome(config=self.best_config, result=self.best, evaluated=len(self.evaluated),
                           curve=list(self.curve), seconds=float(self.seconds))

    def failures(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.evaluated:
            if t.result is not None and not t.result.ok:
                out[t.result.verdict.value] = out.get(t.result.verdict.value, 0) + 1
        return out


def protocol_of(options: EvalOptions | None) -> str:
    """The parts of the evaluation protocol that change a cached result: input sets checked,
    whether and how long it was timed, the timeout that may have failed it."""
    o = options or EvalOptions()
    return f"seeds={o.seeds},bench={int(o.bench)},budget_ms={o.budget_ms:g},timeout_s={o.timeout_s:g}"


def gpu_count(evaluator: Evaluator) -> int:
    """How many candidates the evaluator runs at once (its ``concurrency``), at least 1."""
    return max(1, int(evaluator.concurrency))


def _failed(config: dict[str, int], spec_hash: str, verdict: Verdict, message: str, log: str = "") -> EvalResult:
    return EvalResult(verdict=verdict, message=message, spec_hash=spec_hash, config=config, log=log)


class _Run:
    """Mutable state of one tune() call (results, curve, cache writes), thread-safe for the
    evaluator's ``on_result`` callback."""

    def __init__(self, cache: TuneCache | None, key: TuneKey, on_result) -> None:
        self.cache, self.key, self.on_result = cache, key, on_result
        self.t0 = time.monotonic()
        self.evaluated: dict[str, TunedConfig] = {}
        self.pruned: list[TunedConfig] = []
        self.curve: list[CurvePoint] = []
        self.best_ms = math.inf
        self.measured = 0
        self.n_results = 0  # results seen (cached ones and re-measurements included)
        self.lock = threading.Lock()
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def record(self, config: dict[str, int], result: EvalResult, *, cached: bool = False) -> None:
        with self.lock:
            cid = config_id(config)
            self.evaluated[cid] = TunedConfig(config=config, result=result, cached=cached)
            if not cached:
                self.measured += 1
                if self.cache is not None and result.verdict is not Verdict.harness_error:  # not the config's
                    try:
                        self.cache.append(self.key, CacheRecord(config=config, result=result))
                    except OSError as exc:  # a full disk must not stop the tuning
                        if not any(n.startswith("cache write failed") for n in self.notes):
                            self.notes.append(f"cache write failed: {exc}")
            self.best_ms = min(self.best_ms, result.ms)
            self.n_results += 1
            self.curve.append(TunePoint(evals=self.n_results, seconds=0.0 if cached else round(self.elapsed(), 4),
                                        best_ms=self.best_ms, config=dict(config),
                                        ms=result.ms if result.ok else None, verdict=result.verdict.value,
                                        wall_s=0.0 if cached else result.wall_s, cached=cached))
        if self.on_result is not None and not cached:
            self.on_result(self.evaluated[cid])

    def prune(self, config: dict[str, int], kind: str, reason: str, *, write: bool) -> None:
        with self.lock:
            self.pruned.append(TunedConfig(config=config, pruned=reason, prune_kind=kind))
            if write and self.cache is not None:
                try:
                    self.cache.append(self.key, CacheRecord(config=config, pruned=reason, prune_kind=kind))
                except OSError:
                    pass


def tune(
    evaluator: Evaluator,
    problem: ProblemRef,
    spec: KernelSpec,
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    gpu: GpuFacts,
    strategy: str = "auto",
    max_evals: int = 200,
    minutes: float | None = None,
    batch: int | None = None,
    cache: TuneCache | None = None,
    seed: int = 0,
    on_result: Callable[[TunedConfig], None] | None = None,
    options: EvalOptions | None = None,
    probe: ResourceProbe | None = compile_probe,
    confirm: int = CONFIRM_TOP,
    nvrtc: str | None = None,
) -> TuneResult:
    """Tune ``spec`` on ``problem``; see the module docstring. ``probe=None`` skips the
    compile-time resource pruning; ``nvrtc`` overrides the NVRTC version of the cache key."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    max_evals = max(1, int(max_evals))
    deadline = None if minutes is None else time.monotonic() + minutes * 60.0  # pruning counts too
    key = TuneKey(spec_hash=spec.content_hash(), problem_key=problem.key(), gpu=gpu.name,
                  nvrtc=nvrtc or nvrtc_version(), driver=gpu.driver, protocol=protocol_of(options))
    run = _Run(cache, key, on_result)
    cached = cache.load(key) if cache is not None else {}
    # 1. static pruning
    plans = _feasible(spec, run, cached, seed=seed, sizes=sizes, tensors=tensors, gpu=gpu, deadline=deadline)
    space = Space(spec.tunables, [plans[cid][0] for cid in plans])
    default = spec.default_config()
    strat = make_strategy(strategy, space, budget=max_evals, seed=seed,
                          default=default if config_id(default) in plans else None)
    if deadline is not None:  # the evaluator starts nothing past it (a batch in flight is cut)
        options = (options or EvalOptions()).model_copy(update={"deadline": deadline})
    tuning = _Tuning(evaluator, problem, spec, options, run, strat, plans, gpu, probe)
    # 2. the cache: reuse what was measured, re-measure the best few on this run
    hits, to_confirm = _seed_from_cache(cached, plans, run, strat, confirm)
    tuning.evaluate(to_confirm)
    # 3. the search loop
    tuning.loop(max_evals, batch or PER_GPU_BATCH * gpu_count(evaluator), deadline, minutes)
    # 4. the result
    return _result(run, strat.name, spec, len(space), hits, len(to_confirm))


def _feasible(spec: KernelSpec, run: "_Run", cached: Mapping[str, CacheRecord], *, seed: int,
              sizes: Mapping[str, int | float], tensors: Mapping[str, TensorFacts],
              gpu: GpuFacts, deadline: float | None = None) -> dict[str, tuple[dict[str, int], ResolvedPlan]]:
    """config id -> (config, resolved plan) of every config that survives static pruning (the
    pruned ones are recorded on ``run``). A sampled space keeps what an earlier run measured.
    Pruning that reaches ``deadline`` keeps the survivors found so far (the default config is
    examined first, so it is among them when it is feasible)."""
    all_configs = enumerate_configs(spec, seed=seed, limit=ENUM_LIMIT)
    sampled = len(all_configs) < spec.space_size()
    if sampled:
        run.notes.append(f"space of {spec.space_size()} configs sampled down to {len(all_configs)}")
    default = spec.default_config()
    all_configs.sort(key=lambda c: c != default)  # stable: the default first, the rest as enumerated
    survivors, static_pruned = static_prune(spec, all_configs, sizes=sizes, tensors=tensors, gpu=gpu,
                                            deadline=deadline)
    examined = len(survivors) + len(static_pruned)
    if examined < len(all_configs):
        run.notes.append(f"static pruning stopped by the time budget after {examined} of {len(all_configs)} configs")
    for p in static_pruned:
        run.prune(p.config, p.kind, p.reason, write=False)
    plans = {config_id(c): (c, plan) for c, plan in survivors}
    if sampled:
        extra = []
        for cid, rec in cached.items():
            if cid not in plans and set(rec.config) == set(spec.tunables):
                try:
                    extra.append(spec.full_config(rec.config))
                except KerngenError:
                    continue
        more, _ = static_prune(spec, extra, sizes=sizes, tensors=tensors, gpu=gpu)
        plans.update({config_id(c): (c, plan) for c, plan in more})
    return plans


def _seed_from_cache(cached: Mapping[str, CacheRecord], plans: Mapping, run: "_Run", strat,
                     confirm: int) -> tuple[int, list[dict[str, int]]]:
    """Record the cached results of this space; tell the strategy all but the best ``confirm``
    correct ones, which are returned to be re-measured. Returns (cache hits, to re-measure)."""
    for cid, rec in cached.items():
        if cid not in plans:
            continue  # not in this space (e.g. sampled differently): ignore
        if rec.pruned:
            run.prune(rec.config, rec.prune_kind or "registers", rec.pruned, write=False)
            strat.drop(rec.config)
        elif rec.result is not None:
            run.record(rec.config, rec.result, cached=True)
    hits = len(run.evaluated)
    to_confirm: list[dict[str, int]] = []
    if hits and confirm > 0:
        ok = [t for t in run.evaluated.values() if t.result is not None and t.result.ok]
        to_confirm = [t.config for t in sorted(ok, key=lambda t: t.ms)[:confirm]]
    confirm_ids = {config_id(c) for c in to_confirm}
    for t in list(run.evaluated.values()):
        if config_id(t.config) not in confirm_ids:
            strat.tell(t.config, t.ms)
    return hits, to_confirm


class _Tuning:
    """The evaluation side of one tune() call: batches through the evaluator (failures become
    verdicts), compile-time screening, and the ask/tell loop."""

    def __init__(self, evaluator, problem, spec, options, run: "_Run", strat, plans, gpu, probe) -> None:
        self.evaluator, self.problem, self.spec, self.options = evaluator, problem, spec, options
        self.run, self.strat, self.plans, self.gpu, self.probe = run, strat, plans, gpu, probe
        self.spec_hash = spec.content_hash()
        self.failures_in_a_row = 0
        self.strat_lock = threading.Lock()  # the look-ahead thread asks while this one tells
        self.harness_error = ""  # the harness could not evaluate (out of GPU memory): tuning stops

    def evaluate(self, configs: list[dict[str, int]]) -> None:
        if not configs:
            return
        landed: set[int] = set()

        def landed_cb(i: int, result: EvalResult) -> None:
            if 0 <= i < len(configs) and i not in landed:
                landed.add(i)
                if result.verdict is not Verdict.cancelled:  # never run: nothing to record or cache
                    self.run.record(configs[i], result)

        cands = [Candidate(spec=self.spec, config=c) for c in configs]
        try:
            results = list(self.evaluator.evaluate(self.problem, cands, self.options, landed_cb))
            self.failures_in_a_row = 0
        except Exception as exc:  # noqa: BLE001 - one broken batch must not stop the tuning
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= 2:
                raise
            msg = f"evaluator failed: {type(exc).__name__}: {exc}"[:300]
            results = [_failed(c, self.spec_hash, Verdict.runtime_error, msg) for c in configs]
            self.run.notes.append(msg)
        for i, cfg in enumerate(configs):
            if i in landed:
                continue
            # the returned list is used only when it is complete (its order is then the candidates')
            res = results[i] if len(results) == len(configs) else _failed(
                cfg, self.spec_hash, Verdict.runtime_error, "the evaluator returned no result for this config")
            landed.add(i)
            if res.verdict is not Verdict.cancelled:
                self.run.record(cfg, res)
        with self.strat_lock:
            for cfg in configs:
                if config_id(cfg) not in self.run.evaluated:  # cancelled by the deadline
                    self._stopped(None)
                    continue
                res = self.run.evaluated[config_id(cfg)].result
                self.strat.tell(cfg, res.ms)
                if res.verdict is Verdict.harness_error and not self.harness_error:
                    self.harness_error = res.message
                    self.run.notes.append(f"stopped: {res.message}"[:300])

    def screen(self, asked: list[dict[str, int]]) -> list[dict[str, int]]:
        """Compile ``asked`` and keep what can run: a compile error is recorded as its verdict,
        a config whose registers or shared memory cannot fit a block is pruned."""
        infos = self._probe(asked)
        go: list[dict[str, int]] = []
        for cfg, info in zip(asked, infos):
            if isinstance(info, BaseException):
                log = getattr(info, "log", "") or ""
                self.run.record(cfg, _failed(cfg, self.spec_hash, Verdict.compile_error,
                                             f"compile error: {info}"[:300], log))
                with self.strat_lock:
                    self.strat.tell(cfg, math.inf)
                continue
            if isinstance(info, CompileInfo):
                kind, reason = resource_reason(self.plans[config_id(cfg)][1], info, self.gpu)
                if kind:
                    self.run.prune(cfg, kind, reason, write=True)
                    with self.strat_lock:
                        self.strat.drop(cfg)
                    continue
            go.append(cfg)
        return go

    def _probe(self, asked: list[dict[str, int]]) -> list:
        if self.probe is None:
            return [None] * len(asked)
        try:
            infos = list(self.probe(self.spec, [(c, self.plans[config_id(c)][1]) for c in asked], self.gpu))
        except Exception as exc:  # noqa: BLE001 - no compiler here: the evaluator compiles
            self.probe = None
            self.run.notes.append(f"resource pruning off (compile failed: {type(exc).__name__}: {exc})"[:300])
            return [None] * len(asked)
        return infos + [None] * (len(asked) - len(infos))

    def loop(self, max_evals: int, batch: int, deadline: float | None, minutes: float | None) -> None:
        """Ask, compile and screen the next batch on a helper thread while the GPUs measure
        this one: NVRTC on the CPU cores and the check + timing on the GPU overlap."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kerngen-tune-ahead") as ahead:
            nxt = self._next(ahead, max_evals, batch, deadline, minutes, in_flight=0)
            while nxt is not None:
                asked, go = nxt.result()
                if not asked:
                    return
                nxt = self._next(ahead, max_evals, batch, deadline, minutes, in_flight=len(go))
                if deadline is not None and time.monotonic() >= deadline:
                    self._stopped(minutes)  # compiled in time, but no time is left to measure it
                    return
                self.evaluate(go)
                if self.harness_error:
                    return

    def _next(self, ahead: ThreadPoolExecutor, max_evals: int, batch: int, deadline: float | None,
              minutes: float | None, *, in_flight: int) -> Future | None:
        left = max_evals - len(self.run.evaluated) - in_flight
        if left <= 0:
            return None
        n = min(batch, left)
        if deadline is not None:
            now = time.monotonic()
            if now >= deadline:
                self._stopped(minutes)
                return None
            if self.run.measured:  # cut the batch to what fits the time left after the one in flight
                per = self.run.elapsed() / self.run.measured
                fit = int((deadline - now) / per) - in_flight
                if fit <= 0:
                    self._stopped(minutes)
                    return None
                n = min(n, fit)
        return ahead.submit(self._ask_screen, n)

    def _stopped(self, minutes: float | None) -> None:
        note = f"stopped by the time budget ({minutes:g} min)" if minutes is not None else "stopped by the time budget"
        if note not in self.run.notes:
            self.run.notes.append(note)

    def _ask_screen(self, n: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        with self.strat_lock:
            asked = self.strat.ask(n)
        return asked, self.screen(asked)


def _result(run: "_Run", strategy: str, spec: KernelSpec, feasible: int, hits: int, remeasured: int) -> TuneResult:
    evaluated = list(run.evaluated.values())
    ok = [t for t in evaluated if t.result is not None and t.result.ok]
    best = min(ok, key=lambda t: t.ms) if ok else None
    seconds = run.elapsed()
    return TuneResult(
        best_config=best.config if best else None,
        best=best.result if best else None,
        evaluated=evaluated,
        pruned=run.pruned,
        curve=run.curve,
        strategy=strategy,
        seconds=round(seconds, 3),
        evals_per_minute=round(run.measured / (seconds / 60.0), 2) if seconds > 0 and run.measured else 0.0,
        cache_hits=hits,
        space_size=spec.space_size(),
        feasible=feasible,
        measured=run.measured,
        remeasured=remeasured,
        notes=run.notes,
    )


def replay_strategy(table: TuneResult, spec: KernelSpec, strategy: str, *, budget: int, seed: int = 0,
                    batch: int = PER_GPU_BATCH) -> float:
    """Best ms a strategy finds with ``budget`` evaluations when every evaluation is a look-up in
    an exhaustive run's measurements (no GPU time): how good the strategy is, free of noise."""
    times = {config_id(t.config): t.ms for t in table.evaluated}
    space = Space(spec.tunables, [t.config for t in table.evaluated])
    default = spec.default_config()
    strat = make_strategy(strategy, space, budget=budget, seed=seed,
                          default=default if config_id(default) in times else None)
    best, n = math.inf, 0
    while n < budget:
        asked = strat.ask(min(batch, budget - n))
        if not asked:
            break
        for cfg in asked:
            ms = times[config_id(cfg)]
            strat.tell(cfg, ms)
            best = min(best, ms)
            n += 1
    return best


__all__ = [
    "KINDS", "CurvePoint", "TuneOutcome", "TunePoint", "TuneResult", "TunedConfig", "gpu_count",
    "nvrtc_version", "replay_strategy", "tune",
]
