"""The playbook's ``lstm`` family (CPU tier): the model plan of problems/models/lstm.py runs its LSTM as a kernel
region; what it does not cover is refused with its reason; the joined specs (each layer's gemm projection and
recurrence) through the CPU emulator against torch.nn.LSTM at a small size, every variant and form (h0 / c0 given,
sequence first, no biases, three layers); a kernel with the gates' order swapped fails; NVRTC compiles the
model-size kernels for sm_90 without spills."""

from __future__ import annotations

import pytest
import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.agent.playbook.rnn.family import LSTM
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import problem_files
from tests.emu.runner import emulate
from tests.resources import ROOT

needs_emulator = pytest.mark.needs_cxx

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM({ctor})

    def forward(self, {args}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
FIELDS = ("ctor", "args", "body", "inputs")
# name -> (nn.LSTM arguments, forward's parameters, what it returns, get_inputs' tensors)
CASES = {
    "two_layers": ("8, 16, 2, batch_first=True", "x", "self.lstm(x)[0]", "torch.randn(2, 5, 8)"),
    "given_state": ("8, 10, 1, batch_first=True", "x, h0, c0", "self.lstm(x, (h0, c0))[0]",  # H % 4 != 0
                    "torch.randn(3, 4, 8), torch.randn(1, 3, 10), torch.randn(1, 3, 10)"),
    "seq_first_no_bias": ("6, 8, 3, bias=False", "x", "self.lstm(x)[0]", "torch.randn(4, 3, 6)"),
}
REFUSED = {
    "bidirectional": ("8, 16, 1, batch_first=True, bidirectional=True", "x", "self.lstm(x)[0]",
                      "torch.randn(2, 5, 8)"),
    "proj_size": ("8, 16, 1, batch_first=True, proj_size=4", "x", "self.lstm(x)[0]", "torch.randn(2, 5, 8)"),
    "h_n": ("8, 16, 1, batch_first=True", "x", "self.lstm(x)[1][0]", "torch.randn(2, 5, 8)"),
}
WHY = {"bidirectional": "bidirectional LSTM is not covered", "proj_size": "proj_size",
       "h_n": "reads the LSTM's h_n / c_n"}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return problem_files(tmp_path_factory.mktemp("lstm"), PROBLEM, {**CASES, **REFUSED}, FIELDS)


def test_the_model_plan_runs_the_lstm_as_a_kernel_region():
    problem = load_problem(str(ROOT / "problems" / "models" / "lstm.py"))
    first = next(r for r in plan_model(problem).regions if "lstm" in r.region.nodes)
    assert first.kernel and first.family == "lstm" and first.variant == "splitk", first.why  # test_fam_lstm_splitk.py
    mp = plan_model(problem, variants={first.region.index: "persistent"})
    lstm = next(r for r in mp.regions if "lstm" in r.region.nodes)
    assert lstm.kernel and lstm.variant == "persistent", lstm.why
    assert set(lstm.region.nodes) == {"zeros", "zeros_1", "lstm", "getitem"}  # nn.LSTM's zero state folded in
    # 2 x 65 launches a step at a time: past MAX_STEPS
    assert lstm.offered == ("splitk", "persistent", "persistent_ffma")
    step = next(s for s in mp.plan.kernel_steps if s.family == "lstm")
    spec = step.spec
    coop = [s for s in spec.steps if s.kernel.endswith("lstm_layer")]
    assert len(coop) == 2 and all(s.cooperative for s in coop)
    assert [s.kernel for s in spec.steps if not s.cooperative] == ["r0_sgemm_tf32x3", "r2_sgemm_tf32x3"]
    r = plan.resolve(spec, sizes={}, tensors=lstm.region.match.tensor_facts(), config=step.config)
    assert r.steps[1].grid == (128, 1, 1) and r.steps[1].block == (128, 1, 1)
    assert [line for line in mp.lines() if "kernel lstm persistent" in line]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_family_does_not_cover_is_refused_with_its_reason(problems, name):
    mp = plan_model(problems[name])
    bare = [r for r in mp.regions if "lstm" in r.region.nodes]
    assert len(bare) == 1 and not bare[0].kernel
    assert bare[0].why.startswith("NotCovered: lstm at lstm") and WHY[name] in bare[0].why, bare[0].why


def _reference(problem, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    model = problem.module.Model()
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5, generator=gen)
    inputs = [torch.randn(t.shape, generator=gen) for t in problem.module.get_inputs()]
    names = ("x", "h0", "c0")[:len(inputs)]
    tensors = dict(zip(names, inputs))
    tensors.update({k: v.detach().clone() for k, v in model.named_parameters()})
    with torch.no_grad():
        want = model(*inputs)
    tensors["out"] = torch.full(want.shape, 12345.0)  # every element must be written
    return tensors, want


def _emulated(spec, problem, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    tensors, want = _reference(problem, torch.Generator().manual_seed(seed))
    before = {k: v.clone() for k, v in tensors.items() if k != "out"}
    emulate(spec, tensors)
    assert all(torch.equal(before[k], tensors[k]) for k in before)  # inputs and weights untouched
    return tensors["out"], want


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4)) and ((got - want).norm() / want.norm()).item() < 1e-5


@needs_emulator
@pytest.mark.parametrize("case,variant", [("two_layers", "persistent"), ("two_layers", "step"),
                                          ("given_state", "persistent_ffma"), ("given_state", "step"),
                                          ("seq_first_no_bias", "persistent")])
def test_the_kernels_match_torch_lstm_on_the_emulator(problems, case, variant):
    m = explain(problems[case])
    assert m.family == "lstm"
    got, want = _emulated(family_of(m).build(m, variant), problems[case])
    assert _close(got, want), (got - want).abs().max()


@needs_emulator
def test_other_configurations_match_too(problems):
    m = explain(problems["two_layers"])
    spec = family_of(m).build(m, "persistent", {"JB": 2, "BR": 2, "KC": 16})
    got, want = _emulated(spec, problems["two_layers"], seed=5)
    assert _close(got, want), (got - want).abs().max()


@needs_emulator
def test_a_kernel_with_the_gates_swapped_fails(problems):
    m = explain(problems["two_layers"])
    spec = family_of(m).build(m, "persistent")
    i_gate, f_gate = "lstm_sigmoid(g[0] + acc[0][i])", "lstm_sigmoid(g[H] + acc[1][i])"
    assert spec.source.count(i_gate) == 2 and spec.source.count(f_gate) == 2
    swapped = spec.source.replace(i_gate, "@I@").replace(f_gate, i_gate).replace("@I@", f_gate)  # i <-> f
    got, want = _emulated(spec.model_copy(update={"source": swapped}), problems["two_layers"])
    assert not _close(got, want)


@pytest.mark.parametrize("variant", ["persistent", "persistent_ffma"])
def test_the_model_size_kernels_compile_for_sm_90(variant):
    problem = load_problem(str(ROOT / "problems" / "models" / "lstm.py"))
    index = next(r.region.index for r in plan_model(problem).regions if r.family == "lstm")
    mp = plan_model(problem, variants={index: variant})
    step = next(s for s in mp.plan.kernel_steps if s.family == "lstm")
    m = next(r for r in mp.regions if r.family == "lstm").region.match
    assert step.spec.name == LSTM.spec_name(variant)
    for config in (step.config, {**step.config, "BR": 4, "KC": 128}):
        r = plan.resolve(step.spec, sizes={}, tensors=m.tensor_facts(), config=config)
        compiled = compile_job(job_for(step.spec, r, "sm_90"), cache=None)
        assert compiled.info is not None and len(compiled.info.kernels) == 4
        assert all(k.spill_stores == 0 for k in compiled.info.kernels.values())
