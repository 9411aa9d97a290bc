"""Whole models as plans (issue 34, CPU tier): the partition of every test model (which regions get a kernel,
what falls back to PyTorch and why), the plan as data (allowlisted ATen ops only, JSON round trip), the assembled
plan through the CPU emulator against the model's own forward, and plans that must fail the end-to-end check (a
kernel reading the wrong intermediate, a wrong fallback step, a kernel that changes its input)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import partition, trace
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.agent.playbook.ops import OPS
from kerngen.harness.model.aten import ALLOWED, PlanError, resolve_op
from kerngen.harness.model.check import check_plan
from kerngen.harness.model.execute import PlanRunner
from kerngen.harness.model.plan import AtenStep, KernelStep, ModelPlan
from kerngen.problems.load import load_problem
from tests.emu.runner import available, run_plan
from tests.resources import tiny_model

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "tests" / "data" / "playbook"
needs_emulator = pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")

# model -> (regions a family covers, the ops that fall back to PyTorch)
MODELS = {
    "mlp": (3, set()),
    "resnet_block": (2, set()),
    "resnet18": (23, set()),
    "vgg_stack": (4, set()),
    "mobilenetv2_block": (3, set()),
    "vit_block": (7, {"permute", "unbind", "transpose"}),
    "gpt_block": (7, {"split", "transpose"}),
    "lstm": (2, {"select"}),  # the LSTM (and the zeros of its h0, c0) a kernel region since the lstm family
}


def emulated(i, spec, plan, tensors):
    run_plan(spec, plan, tensors, timeout_s=600)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_is_cut_into_regions_and_what_no_family_takes_is_named(name):
    part = partition(trace(load_problem(str(ROOT / "problems" / "models" / f"{name}.py"))))
    covered, fallback = MODELS[name]
    assert sum(r.match is not None for r in part.regions) == covered
    bare = [r for r in part.regions if r.match is None]
    assert {r.graph.node(r.nodes[0]).op for r in bare} == fallback
    for r in bare:  # named by op and node of the problem's own graph
        assert r.why.startswith(f"NotCovered: {r.graph.node(r.nodes[0]).op} at {r.nodes[0]}"), r.why


def test_a_plan_holds_kernel_steps_and_allowlisted_aten_steps_in_graph_order():
    mp = plan_model(load_problem(str(tiny_model("tiny_gpt"))))
    kinds = [(s.kind, s.family if isinstance(s, KernelStep) else s.op) for s in mp.plan.steps]
    assert kinds[:3] == [("kernel", "layernorm"), ("kernel", "gemm"), ("aten", "split")]
    assert [s.op for s in mp.plan.aten_steps if s.region is None] == ["view"] * 4  # views between regions
    sdpa = next(s for s in mp.plan.aten_steps if s.op == "scaled_dot_product_attention")
    assert "no variant admissible" in sdpa.why  # a region whose family offers nothing at its shapes falls back
    again = ModelPlan.model_validate_json(mp.plan.model_dump_json())
    assert again == mp.plan
    assert all(s.op in ALLOWED for s in mp.plan.aten_steps)
    assert any("split" in line and "PyTorch" in line for line in mp.lines())


def test_the_allowlist_holds_the_op_table_and_nothing_runs_outside_it():
    import torch

    aten = {op for op in OPS if hasattr(torch.ops.aten, op)}  # the table also names IR ops (gelu_tanh)
    assert len(aten) > 150 and aten <= ALLOWED
    with pytest.raises(ValueError, match="not one a model plan may run"):
        AtenStep(node="n", op="system", overload="default", args={})
    with pytest.raises(ValueError, match="none a plan may hold"):
        AtenStep(node="n", op="relu", overload="default", args={"self": {"python": "import os"}})
    with pytest.raises(PlanError, match="writes one of its arguments"):
        resolve_op("add", "out")
    with pytest.raises(PlanError, match="does not exist"):
        resolve_op("relu", "__class__")


@needs_emulator
@pytest.mark.parametrize("name", ["tiny_gpt", "tiny_lstm", "regions_resblock.py"])
def test_the_assembled_plan_agrees_with_the_forward_on_the_emulator(name):
    path = tiny_model(name) if name.startswith("tiny_") else PLAYBOOK / name
    problem = load_problem(str(path))
    mp = plan_model(problem)
    assert mp.kernels
    c = check_plan(problem, mp.plan, emulated, "cpu")
    assert c.ok, c.message
    assert c.sets == 4 and c.kernel_calls == 4 * len(mp.plan.kernel_steps)


@needs_emulator
def test_a_kernel_reading_the_wrong_intermediate_fails_end_to_end():
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    plan = plan_model(problem).plan
    second = plan.kernel_steps[1]
    assert second.bindings["relu"] == "relu" and second.bindings["x"] == "x"
    wrong = plan.with_kernel(1, second.model_copy(update={"bindings": {**second.bindings, "relu": "x"}}))
    c = check_plan(problem, wrong, emulated, "cpu")
    assert not c.ok and "set 0" in c.message


@needs_emulator
def test_a_wrong_fallback_step_fails_end_to_end():
    problem = load_problem(str(tiny_model("tiny_lstm")))
    plan = plan_model(problem).plan
    steps = [s.model_copy(update={"args": {**s.args, "index": 0}}) if isinstance(s, AtenStep) and s.op == "select"
             else s for s in plan.steps]  # the first time step instead of the last
    c = check_plan(problem, plan.model_copy(update={"steps": steps}), emulated, "cpu")
    assert not c.ok and "input set 0" in c.message, c.message


@needs_emulator
def test_a_kernel_that_changes_its_input_or_writes_nothing_is_not_correct():
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    plan = plan_model(problem).plan

    def zeroing(i, spec, rplan, tensors):
        emulated(i, spec, rplan, tensors)
        tensors["x"].zero_() if "x" in tensors else None

    c = check_plan(problem, plan, zeroing, "cpu")
    assert not c.ok and "changed 'x'" in c.message

    def idle(i, spec, rplan, tensors):
        return None  # the output keeps its poison

    c = check_plan(problem, plan, idle, "cpu")
    assert not c.ok


def test_a_plan_reading_a_value_no_step_makes_is_refused():
    plan = plan_model(load_problem(str(tiny_model("tiny_lstm")))).plan
    bad = plan.model_copy(update={"steps": plan.steps[1:]})
    with pytest.raises(PlanError, match="before any step makes it"):
        PlanRunner(bad, emulated)


def test_the_cuda_launcher_binds_each_spec_by_its_content_not_by_its_step_index(monkeypatch):
    """Every variant a region tries sits at the same step index of its trial plan; a launcher that kept its
    binder by index ran the first variant's source with the next one's configuration (on an H200: 'identifier TM
    is undefined' for every variant after the first)."""
    import torch

    from kerngen.harness.gpu import op_runtime
    from kerngen.harness.model.execute import cuda_launcher
    from kerngen.harness.spec.spec import KernelSpec

    bound: list[str] = []

    class Binder:
        def __init__(self, spec, cubin, descriptors):
            self.spec = spec

        def __call__(self, plan, device, slots):
            return lambda tensors, stream: bound.append(self.spec.source)

    monkeypatch.setattr(op_runtime, "CudaBinder", Binder)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    specs = [KernelSpec.model_validate({"source": f'extern "C" __global__ void k{n}(float* out) {{}}', "steps": [
        {"kernel": f"k{n}", "grid": [1], "block": [1], "args": [{"name": "out"}]}]}) for n in (1, 2)]
    launch = cuda_launcher()
    plan = type("Plan", (), {"config": {}})()
    for spec in (*specs, specs[0]):
        launch(0, spec, plan, {"out": torch.zeros(1)})
    assert bound == [specs[0].source, specs[1].source, specs[0].source]
