"""GPU tier of the lstm family: at problems/models/lstm.py's own size (2 layers, input 256, hidden 512, 64 steps,
batch 64) every offered variant passes the harness's full checks (the cooperative launches resident at once), a
sequence-first LSTM with h0 / c0 given passes too, and the model's plan (the LSTM region as kernels, the head a
gemm) is correct end to end through the CUDA launcher."""

from __future__ import annotations

import pytest

from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.model.check import check_plan
from kerngen.harness.model.execute import cuda_launcher
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.agent.test_fam_lstm import PROBLEM
from tests.resources import ROOT

pytestmark = pytest.mark.gpu

CASES = {  # name -> (nn.LSTM arguments, forward's parameters, what it returns, get_inputs' tensors)
    "model_size": ("256, 512, 2, batch_first=True", "x", "self.lstm(x)[0]", "torch.randn(64, 64, 256)"),
    "seq_first_state": ("96, 200, 1", "x, h0, c0", "self.lstm(x, (h0, c0))[0]",
                        "torch.randn(33, 7, 96), torch.randn(1, 7, 200), torch.randn(1, 7, 200)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_offered_variant_passes_the_harness(pool, tmp_path, name):
    ctor, args, body, inputs = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(ctor=ctor, args=args, body=body, inputs=inputs))
    ref = ProblemRef(source=str(path))
    assert_all_pass(pool, ref, offered(ref, "lstm"), seeds_n=3)


def test_the_lstm_model_plan_is_correct_end_to_end_on_the_gpu():
    problem = load_problem(str(ROOT / "problems" / "models" / "lstm.py"))
    mp = plan_model(problem)
    assert [s.family for s in mp.plan.kernel_steps] == ["lstm", "gemm"]
    c = check_plan(problem, mp.plan, cuda_launcher(), "cuda")
    assert c.ok, c.message
