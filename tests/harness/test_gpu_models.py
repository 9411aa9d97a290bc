"""Whole models on the GPU (issue 34, GPU tier): the test models' plans through the CUDA launcher, checked end to
end with the harness's rules; a wrong intermediate fails there too; the model search on a small model and its
loaded module in eager mode and under torch.compile (Inductor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.model.check import check_plan
from kerngen.harness.model.execute import cuda_launcher
from kerngen.problems.load import load_problem

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SMALL = [ROOT / "tests" / "data" / "models" / "tiny_gpt.py", ROOT / "tests" / "data" / "models" / "tiny_lstm.py",
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
                       minutes=1.0, compile=False, log=print)
    assert run.check is not None and run.check.ok, run.check
    assert run.timing is not None and run.timing.kerngen_ms > 0
    model = problem.build_model(dev, 3)
    x = problem.make_inputs(dev, 4)
    module = load_model_run(tmp_path / "run", model=model)
    with torch.no_grad():
        want = model(*x)
        assert torch.allclose(module(*x), want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(torch.compile(module)(*x), want, atol=1e-4, rtol=1e-4)
