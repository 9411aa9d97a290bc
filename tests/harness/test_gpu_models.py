"""Whole models on the GPU (issue 34, GPU tier): the test models' plans through the CUDA launcher, checked end to
end with the harness's rules; a wrong intermediate fails there too; the model search on a small model and its
loaded module in eager mode and under torch.compile (Inductor), its regions' floors and tuned configurations; a
model run replayed and exported, the export loaded and called by keyword."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.model.check import check_plan
from kerngen.harness.model.execute import cuda_launcher
from kerngen.problems.load import load_problem
from tests.resources import tiny_model

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SMALL = [tiny_model("tiny_gpt"), tiny_model("tiny_lstm"),
         ROOT / "tests" / "data" / "playbook" / "regions_resblock.py", ROOT / "tests" / "data" / "playbook" /
         "regions_mlp.py", ROOT / "tests" / "data" / "playbook" / "regions_vit_block.py"]


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_a_small_model_plan_is_correct_end_to_end_on_the_gpu(path):
    problem = load_problem(str(path))
    mp = plan_model(problem)
    c = check_plan(problem, mp.plan, cuda_launcher(), "cuda")
    assert c.ok, c.message
    assert c.kernel_calls == c.sets * len(mp.plan.kernel_steps) > 0


def test_a_wrong_intermediate_fails_on_the_gpu():
    problem = load_problem(str(ROOT / "tests" / "data" / "playbook" / "regions_resblock.py"))
    plan = plan_model(problem).plan
    second = plan.kernel_steps[1]
    wrong = plan.with_kernel(1, second.model_copy(update={"bindings": {**second.bindings, "relu": "x"}}))
    assert not check_plan(problem, wrong, cuda_launcher(), "cuda").ok


@pytest.mark.parametrize("name", ["resnet_block", "mlp"])
def test_a_model_run_at_the_real_size_and_its_loaded_module(tmp_path, name):
    import torch

    from kerngen.agent.model_search import search_model
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.results.model_run import load_model_run

    problem = load_problem(str(ROOT / "problems" / "models" / f"{name}.py"))
    dev = torch.device("cuda", torch.cuda.current_device())
    run = search_model(problem, tmp_path / "run", device=dev, launcher=cuda_launcher(), timer=cuda_timer(dev, 30.0),
                       minutes=0.75, compile=False, log=print)
    assert run.check is not None and run.check.ok, run.check
    assert run.timing is not None and run.timing.kerngen_ms > 0
    model = problem.build_model(dev, 3)
    x = problem.make_inputs(dev, 4)
    module = load_model_run(tmp_path / "run", model=model)
    with torch.no_grad():
        want = model(*x)
        assert torch.allclose(module(*x), want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(torch.compile(module)(*x), want, atol=1e-4, rtol=1e-4)
    # the budget and the tune: floors from the data sheet, configurations tried beyond the defaults
    from kerngen.harness.gpu.peaks import peaks_of

    covered = [r for r in run.regions if r.family]
    if peaks_of(torch.cuda.get_device_name(dev)) is not None:
        assert all(r.floor_ms is not None and 0 < r.floor_ms for r in covered)
    assert any(t.config is not None for r in covered for t in r.tried), [r.tried for r in covered]
    tuned = [t for r in covered for t in r.tried if t.config is not None]
    print(f"{name}: {len(tuned)} tuned configurations, {sum(t.ok for t in tuned)} correct; chosen: "
          + "; ".join(f"r{r.region} {r.variant} {r.kernel_ms} ms (eager {r.eager_ms:.4f}, floor {r.floor_ms})"
                      for r in covered))


def test_a_model_run_replays_and_exports_on_the_gpu(tmp_path):
    import torch

    import kerngen
    from kerngen.agent.model_run import read_model_run
    from kerngen.agent.model_search import replay_model, search_model
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.results.model_run import export_model_run

    problem = load_problem(str(ROOT / "tests" / "data" / "playbook" / "regions_resblock.py"))
    dev = torch.device("cuda", torch.cuda.current_device())
    run = search_model(problem, tmp_path / "run", device=dev, launcher=cuda_launcher(), timer=cuda_timer(dev, 20.0),
                       minutes=0.25, compile=False, tune=2, log=print)
    again = replay_model(read_model_run(tmp_path / "run"), problem, tmp_path / "replay", device=dev,
                         launcher=cuda_launcher(), timer=cuda_timer(dev, 20.0), compile=False, log=print)
    assert again.check.ok and again.timing is not None and again.replay_of == run.id
    export_model_run(tmp_path / "run", tmp_path / "exp")
    model = problem.build_model(dev, 5)
    (x,) = problem.make_inputs(dev, 6)
    module = kerngen.load(str(tmp_path / "exp"), model=model)
    with torch.no_grad():
        assert torch.allclose(module(x=x), model(x), atol=1e-4, rtol=1e-4)
