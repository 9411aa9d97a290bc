"""GPU tier of the lstm family: at problems/models/lstm.py's own size (2 layers, input 256, hidden 512, 64 steps,
batch 64) every offered variant passes the harness's full checks (the cooperative launches resident at once), a
sequence-first LSTM with h0 / c0 given (odd batch, hidden 200) passes too, the ``splitk`` recurrence passes at other
configurations at both sizes (other tiles, warps, copy groups), and the model's plan (the LSTM region as kernels,
the head a gemm) is correct end to end through the CUDA launcher."""

from __future__ import annotations

import pytest

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.evaluator import Candidate
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


def _ref(tmp_path, name: str) -> ProblemRef:
    ctor, args, body, inputs = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(ctor=ctor, args=args, body=body, inputs=inputs))
    return ProblemRef(source=str(path))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_offered_variant_passes_the_harness(pool, tmp_path, name):
    ref = _ref(tmp_path, name)
    assert_all_pass(pool, ref, offered(ref, "lstm"), seeds_n=3)


SPLITK = {  # name -> splitk configurations past its default (JB, UJ, BR, KW, NG: lstm_splitk.cu.j2)
    "model_size": [{"KW": 16}, {"NG": 4, "KW": 4}, {"JB": 8, "UJ": 1, "BR": 8}, {"JB": 4, "UJ": 1, "BR": 8, "NG": 1}],
    "seq_first_state": [{"JB": 8, "UJ": 1, "BR": 1, "KW": 16, "NG": 2}, {"JB": 4, "UJ": 2, "BR": 1, "KW": 2, "NG": 4}],
}


@pytest.mark.parametrize("name", sorted(SPLITK))
def test_splitk_passes_the_harness_at_other_configurations(pool, tmp_path, name):
    ref = _ref(tmp_path, name)
    m = explain(load_problem(ref))
    spec = family_of(m).build(m, "splitk")
    assert_all_pass(pool, ref, [Candidate(spec=spec, config={**spec.default_config(), **c}) for c in SPLITK[name]],
                    seeds_n=2)


def test_the_lstm_model_plan_is_correct_end_to_end_on_the_gpu():
    problem = load_problem(str(ROOT / "problems" / "models" / "lstm.py"))
    mp = plan_model(problem)
    assert [s.family for s in mp.plan.kernel_steps] == ["lstm", "gemm"]
    c = check_plan(problem, mp.plan, cuda_launcher(), "cuda")
    assert c.ok, c.message
