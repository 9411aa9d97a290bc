"""Search strategies on a synthetic 1440-config grid: smooth cost with noise and local optima,
10% of the configs failing with a verdict (scored inf)."""

from __future__ import annotations

import itertools
import math

import pytest

from kerngen.harness.tune.strategies import Exhaustive, ModelGuided, RandomSearch, Space, make_strategy
from kerngen.harness.results import Verdict

from tests.fakes.tuning import BIG_TUNABLES, grid_optimum, synthetic_ms, synthetic_verdict

FAIL = 0.1


def _configs(tunables):
    names = list(tunables)
    return [dict(zip(names, combo)) for combo in itertools.product(*tunables.values())]


def _cost(cfg):
    return synthetic_ms(cfg) if synthetic_verdict(cfg, FAIL) is Verdict.ok else math.inf


def _drive(strategy, budget, batch=8):
    seen, best = [], math.inf
    while len(seen) < budget:
        asked = strategy.ask(min(batch, budget - len(seen)))
        if not asked:
            break
        for cfg in asked:
            ms = _cost(cfg)
            strategy.tell(cfg, ms)
            seen.append(cfg)
            best = min(best, ms)
    return seen, best


@pytest.fixture(scope="module")
def space():
    return Space(BIG_TUNABLES, _configs(BIG_TUNABLES))


@pytest.fixture(scope="module")
def optimum():
    return grid_optimum(BIG_TUNABLES, FAIL)


def test_grid_is_large_and_has_failures(space):
    assert len(space) == 1440
    fails = sum(1 for k in space.keys if not math.isfinite(_cost(space.config(k))))
    assert 0.05 * 1440 < fails < 0.15 * 1440


def test_exhaustive_finds_the_optimum(space, optimum):
    seen, best = _drive(Exhaustive(space), 10_000)
    assert len(seen) == len(space)
    assert len({tuple(sorted(c.items())) for c in seen}) == len(space)
    assert best == optimum


def test_exhaustive_starts_with_the_default(space):
    default = {"BLOCK": 256, "TILE": 4, "UNROLL": 2, "VEC": 4, "STAGES": 3}
    assert Exhaustive(space, default=default).ask(1) == [default]


def test_random_respects_budget_no_repeats_and_seed(space):
    seen, _ = _drive(RandomSearch(space, seed=3, budget=100), 100)
    assert len(seen) == 100
    assert len({tuple(sorted(c.items())) for c in seen}) == 100
    again, _ = _drive(RandomSearch(space, seed=3, budget=100), 100)
    other, _ = _drive(RandomSearch(space, seed=4, budget=100), 100)
    assert again == seen and other != seen
    everything, _ = _drive(RandomSearch(space, seed=0), 10_000)
    assert len(everything) == len(space)  # then it is exhausted: ask() -> []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("batch", [8, 32])
def test_model_within_5pct_with_20pct_of_evals(space, optimum, seed, batch):
    budget = int(0.2 * len(space))  # 288 of 1440
    strat = ModelGuided(space, seed=seed, budget=budget)
    seen, best = _drive(strat, budget, batch=batch)
    assert len(seen) == budget
    assert len({tuple(sorted(c.items())) for c in seen}) == budget
    assert best <= 1.05 * optimum, f"seed {seed}: {best:.4f} vs optimum {optimum:.4f}"


def test_model_beats_random_on_a_small_budget(space, optimum):
    """With 7% of the space the model strategy is usually at the optimum; random is not."""
    budget = 100
    model = [_drive(ModelGuided(space, seed=s, budget=budget), budget)[1] for s in range(5)]
    rand = [_drive(RandomSearch(space, seed=s, budget=budget), budget)[1] for s in range(5)]
    assert sum(model) < sum(rand)
    assert sum(1 for m in model if m <= 1.05 * optimum) >= 4


def test_model_survives_mostly_failing_space(space):
    """80% failures: it keeps asking new configs and never repeats one."""
    def cost(cfg):
        return synthetic_ms(cfg) if synthetic_verdict(cfg, 0.8) is Verdict.ok else math.inf

    strat = ModelGuided(space, seed=1, budget=200)
    seen = []
    while len(seen) < 200:
        asked = strat.ask(8)
        assert asked
        for cfg in asked:
            strat.tell(cfg, cost(cfg))
            seen.append(tuple(sorted(cfg.items())))
    assert len(set(seen)) == 200


def test_model_exhausts_a_small_space_without_repeats():
    tun = {"A": [1, 2, 4], "B": [8, 16]}
    sp = Space(tun, _configs(tun))
    strat = ModelGuided(sp, seed=0, budget=100)
    seen = []
    for _ in range(20):
        asked = strat.ask(4)
        if not asked:
            break
        for cfg in asked:
            strat.tell(cfg, float(cfg["A"] * cfg["B"]))
            seen.append(tuple(sorted(cfg.items())))
    assert sorted(seen) == sorted({tuple(sorted(c.items())) for c in _configs(tun)})


def test_dropped_configs_are_not_proposed_again(space):
    strat = ModelGuided(space, seed=0, budget=50)
    first = strat.ask(8)
    for cfg in first:
        strat.drop(cfg)
    later = []
    for _ in range(5):
        batch = strat.ask(8)
        later += batch
        for cfg in batch:
            strat.tell(cfg, _cost(cfg))
    assert not {tuple(sorted(c.items())) for c in first} & {tuple(sorted(c.items())) for c in later}


def test_auto_picks_by_space_size(space):
    assert make_strategy("auto", space, budget=2000).name == "exhaustive"
    assert make_strategy("auto", space, budget=200).name == "model"
    with pytest.raises(ValueError):
        make_strategy("annealing", space, budget=10)
