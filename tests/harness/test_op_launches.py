"""The exported op's path launches what the harness's launcher launches, CPU tier: for every variant the
playbook offers (joined multi-region specs among them: conv_nd direct / 3xTF32 / wgmma with pre-pass steps
into scratch, TMA descriptors with ``view`` and ``full_width`` off, then norms, reductions, pools), at several
configurations, the two paths' launch lists (kernel, grid, block, dynamic shared memory and its opt-in,
cooperative flag, every argument: which tensor by address, scalar dtype and value, each descriptor by what it
describes; memsets by address, value and size) are equal. tests/harness/launch_lists.py builds both lists.

Written for the KernelBench level-2 files whose exported ops did not match their kernels on an H200
(2026-11-28, ``kerngen suite``): they are compared here too, at their own sizes; the GPU side of the same
question is tests/harness/test_gpu_op_regions.py."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from kerngen.harness.spec.plan import ResolvedArg
from kerngen.problems.load import load_problem
from tests.harness.launch_lists import fake_tensors, harness_launches, harness_runner, offered_plans, op_launches
from tests.resources import kernelbench

DATA = Path(__file__).resolve().parents[1] / "data" / "playbook"
# the level-2 files whose exported op differed from its kernel (or raised an illegal instruction) on the H200
SUITE_MISMATCHES = ("6_Conv3d_Softmax_MaxPool_MaxPool", "8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum",
                    "11_ConvTranspose2d_BatchNorm_Tanh_MaxPool_GroupNorm", "13_ConvTranspose3d_Mean_Add_Softmax_Tanh_Scaling",
                    "23_Conv3d_GroupNorm_Mean", "27_Conv3d_HardSwish_GroupNorm_Mean",
                    "72_ConvTranspose3d_BatchNorm_AvgPool_AvgPool", "74_ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max",
                    "79_Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max")
REGIONS = ("regions_conv3d_softmax_pool", "regions_convt_views", "regions_resblock", "regions_two_gemms")
BUILT_IN = ("conv2d", "matmul", "softmax", "conv_relu_maxpool")


def _compare_all(problem, monkeypatch, per_variant: int) -> int:
    compared = 0
    for variant, spec, plan in offered_plans(problem, per_variant):
        tensors = fake_tensors(problem.info, plan)
        want = harness_launches(plan, tensors, monkeypatch)
        got = op_launches(spec, plan, problem.info, tensors)
        assert len(want) == len(plan.steps) and all(w[-1] for w in want if w[0] == "launch")
        assert got == want, (variant, plan.config, next((w, g) for w, g in zip(want, got) if w != g))
        compared += 1
    return compared


@pytest.mark.parametrize("name", REGIONS + BUILT_IN)
def test_the_op_launches_what_the_harness_launches(name, monkeypatch):
    problem = load_problem(str(DATA / f"{name}.py")) if name.startswith("regions") else load_problem(name)
    assert _compare_all(problem, monkeypatch, per_variant=3) >= 1


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", SUITE_MISMATCHES)
def test_the_suites_mismatched_regions_kernels_launch_the_same_on_both_paths(name, monkeypatch):
    problem = load_problem(str(kernelbench("level2", f"{name}.py")))
    assert _compare_all(problem, monkeypatch, per_variant=2) >= 2


def test_the_comparison_sees_a_wrong_argument_an_opt_in_and_a_descriptor(monkeypatch):
    """The normal form has teeth: a plan that differs in one scalar, one tensor, one box or one view, or a
    kernel launched with more shared memory than it was opted into, compares unequal."""
    problem = load_problem("conv2d")  # its wgmma variant: a pre-pass into scratch, a TMA view of it
    variant, spec, plan = next((v, s, p) for v, s, p in offered_plans(problem, 4)
                               if any(a.kind == "tensormap" and a.view is not None for st in p.launches for a in st.args))
    tensors = fake_tensors(problem.info, plan)
    want = harness_launches(plan, tensors, monkeypatch)
    assert op_launches(spec, plan, problem.info, tensors) == want

    def changed(edit) -> list[tuple]:
        other = plan.model_copy(deep=True)
        edit(other)
        return op_launches(spec, other, problem.info, tensors)

    launch = next(i for i, s in enumerate(plan.steps) if any(a.kind == "tensormap" for a in getattr(s, "args", [])))
    pos = next(i for i, a in enumerate(plan.steps[launch].args) if a.kind == "tensormap")
    tensor_pos = next(i for i, a in enumerate(plan.steps[launch].args) if a.kind == "tensor")
    scratch = next(s.name for s in plan.scratch if s.name != plan.steps[launch].args[tensor_pos].name)
    edits = {
        "view": lambda p: setattr(p.steps[launch].args[pos], "view", tuple(reversed(p.steps[launch].args[pos].view))),
        "box": lambda p: setattr(p.steps[launch].args[pos], "box", (p.steps[launch].args[pos].box[0], 8)),
        "full_width": lambda p: setattr(p.steps[launch].args[pos], "full_width", True),
        "tensor": lambda p: setattr(p.steps[launch].args[tensor_pos], "name", scratch),
        "scalar": lambda p: p.steps[launch].args.append(ResolvedArg(kind="int64", value=2**40)),
        "grid": lambda p: setattr(p.steps[launch], "grid", (1, 1, 1)),
    }
    for what, edit in edits.items():
        assert changed(edit) != want, what
    # one kernel launched twice, the larger need first: both launches must find it opted into enough
    twice = plan.model_copy(deep=True)
    twice.steps.insert(launch, twice.steps[launch].model_copy(update={"shared_mem": plan.steps[launch].shared_mem + 4096}))
    for path in (harness_launches(twice, tensors, monkeypatch), op_launches(spec, twice, problem.info, tensors)):
        assert [s[4] for s in path[launch:launch + 2]] == [plan.steps[launch].shared_mem + 4096,
                                                            plan.steps[launch].shared_mem]
        assert all(s[-1] for s in path if s[0] == "launch")


def test_a_harness_runner_keeps_the_buffers_its_launches_point_into(monkeypatch):
    """The cause of the suite's "the exported op's output differs" and its illegal instructions (H200,
    2026-11-28): op_bench made one runner per input set with scratch made for it in a loop and dropped, so
    every runner but the last launched into freed memory, which the caching allocator then gave to the op's
    outputs and descriptors. A runner holds what it was bound to for as long as it lives."""
    problem = load_problem("conv2d")
    _, _, plan = next(offered_plans(problem, 1))
    tensors = fake_tensors(problem.info, plan)
    alive = [weakref.ref(t) for t in tensors.values()]
    runner, _, _ = harness_runner(plan, tensors, monkeypatch)
    del tensors
    gc.collect()
    assert all(ref() is not None for ref in alive)
    del runner
    gc.collect()
    assert all(ref() is None for ref in alive)
