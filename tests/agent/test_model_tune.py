"""The model search's budget and per-region tune (issue 34) on the CPU: the roofline floor of a region, the
weights (share x time over the floor) and their re-split, the configurations a tune tries, and a search whose
tune finds a faster configuration keeps it (emulated kernels, a stand-in timer that favours one configuration)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kerngen.agent.model_search import search_model
from kerngen.agent.model_tune import Floor, RegionBudget, region_floor, tune_configs, weight
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.model.execute import PlanRunner
from kerngen.harness.results import GpuFacts
from kerngen.problems.load import load_problem
from tests.emu.runner import available, run_plan

PLAYBOOK = Path(__file__).resolve().parents[1] / "data" / "playbook"
H100 = GpuFacts(name="NVIDIA H100 80GB HBM3")


def test_a_region_near_its_floor_weighs_less_than_one_far_from_it():
    assert weight(0.5, 1.0, Floor(None)) == 0.5  # no floor known: the whole share
    near, far = weight(0.5, 1.0, Floor(0.9)), weight(0.3, 1.0, Floor(0.1))
    assert near == pytest.approx(0.05) and far == pytest.approx(0.27) and far > near
    assert weight(0.5, 1.0, Floor(2.0)) == 0.0  # over the floor by nothing: no gain left


def test_the_budget_splits_by_weight_and_gives_what_is_left_to_the_rest():
    b = RegionBudget({0: 3.0, 1: 1.0}, seconds=8.0)
    now = time.monotonic()
    assert b.deadline(0) - now == pytest.approx(6.0, abs=0.2)  # 3/4 of 8 s
    assert b.deadline(1) - now == pytest.approx(8.0, abs=0.2)  # the rest: all that is left
    assert not b.over


def test_the_floor_of_a_region_counts_its_flops_and_bytes():
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    planning = plan_model(problem)
    from kerngen.agent.playbook.model_plan import plan_partition

    eager = plan_partition(planning.partition, {}, pytorch={r.index: "eager" for r in planning.partition.regions}).plan
    runner = PlanRunner(eager, launcher=None)
    model, x = problem.build_model("cpu", 0), problem.make_inputs("cpu", 0)
    values = problem.bindings(model, x, [])
    with torch.no_grad():
        _, env = runner(values, keep=True)
        fl = region_floor(runner, 0, env, "cpu", H100, "float32")
    assert fl.flops == 2 * 2 * 8 * 10 * 10 * 8 * 9  # the 3x3 convolution, 2 FLOP per MAC
    # it reads x (2x8x10x10) and the weight (8x8x3x3) and the batch norm's 4 vectors, writes 2x8x10x10
    assert fl.min_bytes == 4 * (1600 + 576 + 4 * 8 + 1600)
    assert fl.ms is not None and fl.ms > 0 and fl.bound in ("memory", "compute")
    assert region_floor(runner, 0, env, "cpu", None, "float32").ms is None  # no GPU facts: no floor


def test_a_tune_tries_distinct_admissible_configurations_other_than_the_default():
    problem = load_problem(str(PLAYBOOK / "regions_mlp.py"))
    plan = plan_model(problem).plan
    step = plan.kernel_steps[0]
    shapes = {t.name: t.shape for t in (*plan.inputs, *plan.params)}
    tensors = {n: torch.empty(shapes[v]) for n, v in step.bindings.items()} | {"out": torch.empty(step.out.shape)}
    spec = step.spec
    cfgs = tune_configs(spec, dict(step.config), step.sizes, tensors, H100, 6)
    assert 0 < len(cfgs) <= 6 and dict(step.config) not in cfgs
    assert len({tuple(sorted(c.items())) for c in cfgs}) == len(cfgs)
    assert all(set(c) == set(spec.tunables) for c in cfgs)
    assert sum(sum(c[k] != step.config[k] for k in c) == 1 for c in cfgs) >= 1  # neighbours come first
    assert tune_configs(spec, dict(step.config), step.sizes, tensors, H100, 0) == []


@pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")
def test_a_search_keeps_the_configuration_its_tune_found_faster(tmp_path):
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    last: dict = {}

    def launch(i, spec, plan, tensors):
        last["config"] = dict(plan.config)
        run_plan(spec, plan, tensors, timeout_s=600)

    def timer(fn):  # PyTorch 1 ms; a kernel 0.5 ms, 0.25 ms at STAGES=2 (only a tune tries it)
        last.clear()
        fn()
        cfg = last.get("config")
        return 1.0 if cfg is None else 0.25 if cfg.get("STAGES") == 2 else 0.5

    lines: list[str] = []
    run = search_model(problem, tmp_path / "r", device="cpu", launcher=launch, timer=timer, compile=False,
                       log=lines.append, facts=H100, tune=3)
    assert run.check.ok
    for row in run.regions:
        tuned = [t for t in row.tried if t.config is not None]
        assert 0 < len(tuned) <= 3 and row.floor_ms is not None and row.budget_s > 0
        if any(t.config["STAGES"] == 2 and t.ok for t in tuned):
            assert row.config["STAGES"] == 2 and row.kernel_ms == 0.25
    assert any(" tune 1/3 " in line for line in lines) and any(line.startswith("[1/2] r") for line in lines)
    assert any(r.config["STAGES"] == 2 for r in run.regions)  # STAGES=2 is a neighbour of the default (4)
