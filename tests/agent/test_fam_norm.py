"""The playbook's norm family (CPU tier): recognition of batch, instance and group norm (KernelBench
level 1's 33-35 and small stand-ins), which statistics the reference really uses (eval mode),
refusals, the launch plans, NVRTC compilation for sm_90 of every offered variant at its default and
other configurations, the proposer's round 0, and, where the CPU emulator (tests/emu) is ready,
the kernels' outputs against PyTorch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain, seed_specs
from kerngen.agent.playbook import family_of
from kerngen.agent.playbook.norm import family as fam_norm
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.errors import SpecError
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

from tests.emu.runner import emulate


KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
LEVEL1 = {
    "33_BatchNorm.py": dict(kind="running", module="BatchNorm2d", weight="bn.weight", bias="bn.bias",
                            running_mean="bn.running_mean", running_var="bn.running_var", groups=None),
    "34_InstanceNorm.py": dict(kind="instance", module="InstanceNorm2d", weight=None, bias=None, groups=None),
    "35_GroupNorm_.py": dict(kind="group", module="GroupNorm", weight="gn.weight", bias="gn.bias", groups=8),
}
OFFERED = {"33_BatchNorm.py": ["affine"], "34_InstanceNorm.py": ["split", "fused"], "35_GroupNorm_.py": ["split", "fused"]}

SOURCE = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = {init}

    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.randn({shape}) * 2.0 + 0.5]


def get_init_inputs():
    return []
"""


def _write(tmp_path: Path, name: str, init: str, shape: tuple[int, ...], forward: str = "self.norm(x)") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE.format(init=init, forward=forward, shape=", ".join(map(str, shape))))
    return path



def _compile(spec, resolved) -> None:
    compile_job(job_for(spec, resolved, "sm_90"), cache=None)  # raises on a compile error


# small stand-ins, one per kind and layout: (file name, module, input shape, expected kind)
SMALL = [
    ("bn2d_running", "nn.BatchNorm2d(6)", (3, 6, 5, 8), "running"),
    ("bn1d_rows", "nn.BatchNorm1d(10)", (16, 10), "running"),
    ("bn3d_batch_stats", "nn.BatchNorm3d(4, track_running_stats=False)", (2, 4, 3, 5, 4), "batch"),
    ("bn2d_batch_odd", "nn.BatchNorm2d(5, affine=False, track_running_stats=False)", (3, 5, 7, 9), "batch"),
    ("in2d_affine", "nn.InstanceNorm2d(6, affine=True)", (2, 6, 12, 12), "instance"),
    ("in1d_odd", "nn.InstanceNorm1d(3)", (4, 3, 37), "instance"),
    ("in2d_tracked", "nn.InstanceNorm2d(6, affine=True, track_running_stats=True)", (2, 6, 4, 4), "running"),
    ("gn_affine", "nn.GroupNorm(4, 12)", (2, 12, 6, 10), "group"),
    ("gn_odd_plain", "nn.GroupNorm(3, 9, affine=False, eps=1e-3)", (3, 9, 5, 7), "group"),
    # segments of several statistics chunks (merged by the finalize kernel) at the small configurations
    ("gn_long", "nn.GroupNorm(2, 4)", (2, 4, 40, 40), "group"),
    ("bn_batch_long", "nn.BatchNorm2d(3, track_running_stats=False)", (4, 3, 30, 40), "batch"),
]


# ---------------------------------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name", sorted(LEVEL1))
def test_kernelbench_level1_norms_are_recognised(name):
    m = explain(load_problem(str(KB / "level1" / name)))
    assert m.family == "norm"
    for key, value in LEVEL1[name].items():
        assert getattr(m.facts, key) == value, key
    assert m.facts.eps == 1e-5


@needs_kb
@pytest.mark.parametrize("name", sorted(OFFERED))
def test_offered_variants_follow_the_kind(name):
    prop = PlaybookProposer(load_problem(str(KB / "level1" / name)))
    assert prop.match is not None, prop.reason
    assert [v.variant for v in prop.offer.offered] == OFFERED[name]
    for dropped in prop.offer.dropped:
        assert "statistics" in dropped.why


@needs_kb
@pytest.mark.parametrize("level, name", [("level1", "40_LayerNorm.py"), ("level1", "36_RMSNorm_.py"),
                                         ("level1", "19_ReLU.py"), ("level2", "17_Conv2d_InstanceNorm_Divide.py"),
                                         ("level2", "73_Conv2d_BatchNorm_Scaling.py"),
                                         ("level2", "85_Conv2d_GroupNorm_Scale_MaxPool_Clamp.py")])
def test_other_problems_are_not_claimed(level, name):
    p = load_problem(str(KB / level / name))
    assert fam_norm.NORM.recognise(trace(p)) is None
    try:
        assert explain(p).family != "norm"
    except NotCovered:
        pass  # nobody covers it: also not claimed by the norm family


@pytest.mark.parametrize("name, init, shape, kind", SMALL, ids=[s[0] for s in SMALL])
def test_kind_is_read_from_the_module(tmp_path, name, init, shape, kind):
    p = load_problem(str(_write(tmp_path, name, init, shape)))
    m = explain(p)
    assert m.family == "norm" and m.facts.kind == kind
    module = p.build_model("meta", 0).norm
    assert m.facts.eps == module.eps
    affine = getattr(module, "affine", False)
    assert (m.facts.weight is not None) == affine and (m.facts.bias is not None) == affine
    if kind == "group":
        assert m.facts.groups == module.num_groups
    assert (m.facts.running_mean == "norm.running_mean") == (kind == "running")


def _reference(path: Path, seed: int = 3):
    p = load_problem(str(path))
    model = p.build_model("cpu", seed)
    inputs = p.make_inputs("cpu", seed)
    return p, model, inputs, p.run_reference(model, inputs)[0]


def _batch_stats(x, w, b, eps):
    dims = [0] + list(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=False, keepdim=True)
    shape = [1, -1] + [1] * (x.dim() - 2)
    return (x - mean) / torch.sqrt(var + eps) * w.view(shape) + b.view(shape)


def test_the_reference_runs_in_eval_mode_so_batch_norm_uses_running_statistics(tmp_path):
    _, model, (x,), ref = _reference(_write(tmp_path, "bn_eval", "nn.BatchNorm2d(6)", (4, 6, 5, 7)))
    bn = model.norm
    assert not bn.training
    shape = (1, -1, 1, 1)
    running = (x - bn.running_mean.view(shape)) / torch.sqrt(bn.running_var.view(shape) + bn.eps) \
        * bn.weight.view(shape) + bn.bias.view(shape)
    assert torch.allclose(ref, running, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ref, _batch_stats(x, bn.weight, bn.bias, bn.eps), atol=1e-2)


def test_batch_norm_without_running_statistics_uses_the_batch(tmp_path):
    path = _write(tmp_path, "bn_batch", "nn.BatchNorm2d(6, track_running_stats=False)", (4, 6, 5, 7))
    _, model, (x,), ref = _reference(path)
    bn = model.norm
    assert torch.allclose(ref, _batch_stats(x, bn.weight, bn.bias, bn.eps), atol=1e-5, rtol=1e-5)
    assert explain(load_problem(str(path))).facts.kind == "batch"


class _TrainingProblem:
    """A problem-shaped stand-in whose model stays in training mode (the loader always evals)."""

    def __init__(self, path: Path) -> None:
        self._p = load_problem(str(path))
        self.info, self.name = self._p.info, "training_bn"

    def source(self) -> str:
        return self._p.source()

    def build_model(self, device, seed):
        return self._p.build_model(device, seed).train()

    def make_inputs(self, device, seed):
        return self._p.make_inputs(device, seed)


def test_a_module_in_training_mode_is_refused_with_the_reason(tmp_path):
    """In training mode a batch norm also updates its running statistics: a forward that changes a buffer."""
    prob = _TrainingProblem(_write(tmp_path, "bn_train", "nn.BatchNorm2d(6)", (4, 6, 5, 7)))
    with pytest.raises(NotCovered, match="num_batches_tracked.* in place"):
        trace(prob)


def test_an_unbatched_norm_is_not_the_norm_familys(tmp_path):
    """torch runs an unbatched instance norm as a batch of one between two views: not one op alone."""
    p = load_problem(str(_write(tmp_path, "refused", "nn.InstanceNorm1d(8)", (8, 50), "self.norm(x)")))
    assert fam_norm.NORM.recognise(trace(p)) is None


def test_the_functional_form_is_the_same_op(tmp_path):
    p = load_problem(str(_write(tmp_path, "functional", "nn.GroupNorm(2, 8)", (2, 8, 4, 4), "F.group_norm(x, 2)")))
    m = explain(p)
    assert m.family == "norm" and m.facts.kind == "group" and m.facts.groups == 2 and m.facts.weight is None


def test_a_norm_inside_a_longer_forward_is_not_claimed(tmp_path):
    p = load_problem(str(_write(tmp_path, "gn_scaled", "nn.GroupNorm(2, 8)", (2, 8, 4, 4), "self.norm(x) * 2.0")))
    assert fam_norm.NORM.recognise(trace(p)) is None


# ---------------------------------------------------------------------------------------------
def _small_match(tmp_path, name):
    entry = next(s for s in SMALL if s[0] == name)
    return explain(load_problem(str(_write(tmp_path, *entry[:3]))))


def test_split_plan_for_group_norm(tmp_path):
    m = _small_match(tmp_path, "gn_affine")  # (2, 12, 6, 10), 4 groups of 3 channels
    spec = family_of(m).build(m, "split")
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    stats, fin, app = r.launches
    assert [stats.kernel, fin.kernel, app.kernel] == ["norm_stats", "norm_finalize", "norm_apply"]
    assert fin.grid[0] == 2 * 4  # a block per (sample, group)
    scratch = {s.name: s.size for s in r.scratch}
    assert scratch["part"] == 2 * stats.grid[0] and scratch["coef"] == 2 * 2 * 12
    assert [a.name for a in fin.args] == ["part", "norm.weight", "norm.bias", "coef"]
    segment_vectors = 3 * 60 // r.config["VEC"]
    assert stats.grid[0] == 2 * 4 * math.ceil(segment_vectors / (r.config["BLOCK"] * r.config["ITEMS"]))
    with pytest.raises(SpecError):  # 64 floats a thread in 1024 threads: spills, so not admitted
        plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config={"VEC": 4, "BLOCK": 1024, "ITEMS": 16})


def test_batch_statistics_merge_per_channel(tmp_path):
    m = _small_match(tmp_path, "bn3d_batch_stats")  # (2, 4, 3, 5, 4)
    r = plan.resolve(family_of(m).build(m, "split"), sizes={}, tensors=m.tensor_facts())
    assert r.launches[1].grid[0] == 4  # a block per channel, over every sample's plane
    assert {s.name: s.size for s in r.scratch}["coef"] == 2 * 4
    fused = plan.resolve(family_of(m).build(m, "fused"), sizes={}, tensors=m.tensor_facts())
    assert fused.launches[0].grid[0] == 4


def test_affine_binds_the_running_buffers(tmp_path):
    m = _small_match(tmp_path, "bn2d_running")
    (launch,) = plan.resolve(family_of(m).build(m, "affine"), sizes={}, tensors=m.tensor_facts()).launches
    assert [a.name for a in launch.args] == ["x", "norm.running_mean", "norm.running_var", "norm.weight",
                                             "norm.bias", "out"]
    with pytest.raises(ValueError, match="statistics"):
        family_of(m).build(m, "split")


def test_odd_planes_use_scalar_loads(tmp_path):
    m = _small_match(tmp_path, "gn_odd_plain")  # planes of 35 floats
    spec = family_of(m).build(m, "split")
    assert spec.default_config()["VEC"] == 1
    with pytest.raises(SpecError):
        plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config={"VEC": 4})


def _configs(variant: str) -> list[dict[str, int]]:
    """The default and two other corners of each variant (VEC 1 is admissible at every shape)."""
    if variant == "affine":
        return [{}, {"VEC": 1, "FLAT": 1, "CACHE_HINT": 1, "UNROLL": 2}, {"VEC": 1, "FLAT": 0, "ABLOCK": 1024}]
    if variant == "split":  # the middle one: many chunks a segment, many apply blocks a plane
        return [{}, {"VEC": 1, "BLOCK": 128, "ITEMS": 1, "ABLOCK": 128, "UNROLL": 1, "FLAT": 0, "REV": 0},
                {"VEC": 1, "BLOCK": 1024, "ITEMS": 16, "CACHE_HINT": 1, "ABLOCK": 128, "FLAT": 1}]
    return [{}, {"VEC": 1, "REV": 0, "CACHE_HINT": 1, "UNROLL": 1, "BLOCK": 128}, {"VEC": 1, "BLOCK": 128, "UNROLL": 8}]


@needs_kb
@pytest.mark.parametrize("name", sorted(LEVEL1))
def test_kernelbench_variants_compile(name):
    prop = PlaybookProposer(load_problem(str(KB / "level1" / name)))
    for offered in prop.offer.offered:
        for config in _configs(offered.variant):
            _compile(offered.spec, plan.resolve(offered.spec, sizes={}, tensors=prop.match.tensor_facts(), config=config))


@pytest.mark.parametrize("name", ["bn1d_rows", "bn2d_batch_odd", "in1d_odd", "in2d_tracked", "gn_affine"])
def test_small_variants_compile(tmp_path, name):
    m = _small_match(tmp_path, name)
    prop = PlaybookProposer(load_problem(str(tmp_path / f"{name}.py")))
    assert prop.offer.offered
    for offered in prop.offer.offered:
        _compile(offered.spec, plan.resolve(offered.spec, sizes={}, tensors=m.tensor_facts()))


@needs_kb
def test_round0_seeds_carry_their_variant():
    specs = seed_specs(load_problem(str(KB / "level1" / "35_GroupNorm_.py")))
    assert {s.name for s in specs} == {"playbook-norm-split", "playbook-norm-fused"}
    assert {variant_of_spec(s) for s in specs} == {"split", "fused"}


# ---------------------------------------------------------------------------------------------
# outputs against PyTorch on the CPU emulator (tests/emu), at small shapes
EMULATED = ["bn2d_running", "bn1d_rows", "bn2d_batch_odd", "in2d_affine", "in1d_odd", "in2d_tracked",
            "gn_affine", "gn_odd_plain", "bn3d_batch_stats", "gn_long", "bn_batch_long"]


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name", EMULATED)
def test_kernels_match_pytorch_on_the_emulator(tmp_path, name):
    entry = next(s for s in SMALL if s[0] == name)
    path = _write(tmp_path, *entry[:3])
    p, model, inputs, ref = _reference(path)
    prop = PlaybookProposer(p)
    assert prop.offer.offered
    ran = 0
    for offered in prop.offer.offered:
        for config in _configs(offered.variant):
            full = {**offered.spec.default_config(), **config}
            if not plan.constraints_hold(offered.spec, plan.build_env({}, prop.match.tensor_facts(), full))[0]:
                continue
            tensors = p.bindings(model, inputs, [torch.full_like(ref, float("nan"))])
            emulate(offered.spec, tensors, config=full)
            torch.testing.assert_close(tensors["out"], ref, atol=1e-4, rtol=1e-4,
                                       msg=lambda s: f"{offered.variant} {full}: {s}")
            ran += 1
    assert ran >= 2
