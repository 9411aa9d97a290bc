"""The conv_tail playbook family (CPU tier): which problems it claims (a Conv2d, an elementwise epilogue,
then reductions, pools, norms) and which it leaves to conv_epi or refuses, the stages it reads, its specs
(resolution, NVRTC compilation for sm_90 at the default configuration), its ideas, and (where the CPU
emulator is there) its kernels' results at small shapes against PyTorch."""

from __future__ import annotations


import pytest
import torch
from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.conv.build_tail import SPEC_PREFIX, TAIL_TUNABLES, VARIANT_NAMES
from kerngen.agent.playbook.conv.tail_ir import Reduction
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.conv.tail import CONV_TAIL as FAMILY
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.proposer import SearchContext
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.resources import kernelbench
from tests.emu.runner import emulate


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)


KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench

PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F



class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
{init}
    def forward(self, x):
{body}


def get_inputs():
    return [torch.rand({shape})]


def get_init_inputs():
    return []
'''

# name -> (init lines, forward body, input shape, the stages' kinds): small shapes (the emulator runs them)
CASES = {
    "channel_min_tanh": ("", "        x = torch.min(self.conv(x), dim=1, keepdim=True)[0]\n"
                             "        return torch.tanh(torch.tanh(x))", "2, 3, 9, 11", ["channels"]),
    "scaled_channel_min": ("", "        return torch.min(self.conv(x) * 2.0, dim=1, keepdim=True)[0]", "2, 3, 8, 8",
                           ["channels"]),
    "channel_mean_no_keepdim": ("", "        return self.conv(x).mean(dim=1) + torch.tensor(1.5)", "2, 3, 7, 9",
                                ["channels"]),
    "groupnorm_residual_logsumexp": (
        "        self.gn = nn.GroupNorm(4, 8)",
        "        y = self.conv(x)\n        z = F.hardswish(torch.tanh(self.gn(y)))\n"
        "        return torch.logsumexp(y + z, dim=1, keepdim=True)", "2, 3, 10, 9", ["stats", "channels"]),
    "max_pool_mish": ("        self.pool = nn.MaxPool2d(2)",
                      "        x = F.hardswish(self.conv(x) - 0.5)\n        return F.mish(self.pool(x))",
                      "2, 3, 11, 12", ["window"]),
    "avg_pool_padded": ("        self.pool = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)",
                        "        return torch.relu(self.pool(self.conv(x)))", "2, 3, 11, 10", ["window"]),
    "global_avg_pool": ("", "        x = F.adaptive_avg_pool2d(F.gelu(self.conv(x)), 1)\n"
                            "        return x.squeeze(-1).squeeze(-1)", "2, 3, 12, 10", ["segment"]),
    "plane_amax_bias": ("        self.bias = nn.Parameter(torch.randn(8))",
                        "        return torch.amax(self.conv(x), dim=(2, 3)) + self.bias", "2, 3, 9, 8",
                        ["segment"]),
    "instance_norm_divide": ("        self.inorm = nn.InstanceNorm2d(8)",
                             "        return self.inorm(self.conv(x)) / 2.0", "2, 3, 10, 11", ["stats", "map"]),
    "sigmoid_group_norm": ("        self.bias = nn.Parameter(torch.randn(8, 1, 1))\n"
                           "        self.scale = nn.Parameter(torch.randn(8, 1, 1))\n"
                           "        self.gn = nn.GroupNorm(2, 8)",
                           "        x = torch.sigmoid((self.conv(x) + self.bias) * self.scale)\n"
                           "        return self.gn(x)", "2, 3, 9, 9", ["stats", "map"]),
    "group_norm_scale_max_pool_clamp": (
        "        self.gn = nn.GroupNorm(4, 8)\n        self.scale = nn.Parameter(torch.rand(8, 1, 1))\n"
        "        self.pool = nn.MaxPool2d(kernel_size=3)",
        "        x = self.pool(self.gn(self.conv(x)) * self.scale)\n        return torch.clamp(x, 0.0, 1.0)",
        "2, 3, 13, 11", ["stats", "window"]),
    "residual_read_before_the_norm": ("        self.gn = nn.GroupNorm(2, 8, affine=False)",
                                      "        y = self.conv(x)\n        a = torch.relu(y)\n"
                                      "        return self.gn(y) * a", "2, 3, 9, 10", ["stats", "map"]),
    "avg_pool_sigmoid_sum": ("        self.pool = nn.AvgPool2d(2)",
                             "        x = torch.sigmoid(self.pool(self.conv(x)))\n"
                             "        return torch.sum(x, dim=[1, 2, 3])", "2, 3, 12, 12", ["window", "segment"]),
}
# not conv_tail's: (init, body, shape, the family explain gives or the refusal's words)
OTHERS = {
    "elementwise_only": ("", "        return torch.relu(self.conv(x)) * 2.0", "2, 3, 9, 9", "family conv_epi"),
    "conv_relu_maxpool": ("        self.pool = nn.MaxPool2d(2)", "        return self.pool(torch.relu(self.conv(x)))",
                          "2, 3, 10, 10", "family conv_relu_maxpool"),
    "argmax": ("", "        return torch.argmax(self.conv(x), dim=1)", "2, 3, 9, 9", "argmax"),
    "indices": ("", "        return torch.max(self.conv(x), dim=1)[1].float()", "2, 3, 9, 9", "indices"),
    "two_reductions": ("", "        y = self.conv(x)\n        return y.amax(dim=1) + y.amin(dim=1)", "2, 3, 9, 9",
                       "do not form a chain"),
    "ceil_mode": ("        self.pool = nn.MaxPool2d(2, ceil_mode=True)", "        return self.pool(self.conv(x))",
                  "2, 3, 9, 9", "ceil_mode"),
    "value_before_the_stored_one": ("        self.gn = nn.GroupNorm(2, 8)",
                                    "        y = self.conv(x)\n        a = torch.tanh(y)\n        return self.gn(a) + y",
                                    "2, 3, 9, 9", "computed before the stage"),
    "reduce_everything": ("", "        return self.conv(x).sum()", "2, 3, 9, 9", "over every dim"),
}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = tmp_path_factory.mktemp("conv_tail")
    out = {}
    for name, (init, body, shape, *_) in {**CASES, **OTHERS}.items():
        path = root / f"{name}.py"
        path.write_text(PROBLEM.format(init=init, body=body, shape=shape))
        out[name] = load_problem(str(path))
    return out


def _why(p) -> str:
    try:
        return f"family {explain(p).family}"
    except NotCovered as exc:
        return str(exc)


# ----- recognition ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_claims_convolutions_with_a_tail_and_reads_its_stages(problems, name):
    m = explain(problems[name])
    assert m.family == "conv_tail"
    assert [s.kind.value for s in m.facts.tail.stages] == CASES[name][-1]


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_leaves_or_refuses_what_is_not_its_own(problems, name):
    """The family another problem is, or conv_tail's own reason (the partitioner may serve it as regions)."""
    want = OTHERS[name][-1]
    if want.startswith("family "):
        assert want == _why(problems[name])
    else:
        with pytest.raises(NotCovered, match=want):
            FAMILY.recognise(trace(problems[name]))


def test_a_norm_is_a_statistics_stage_applied_in_the_next_prologue(problems):
    tail = explain(problems["groupnorm_residual_logsumexp"]).facts.tail
    stats, chan = tail.stages
    assert (stats.groups, stats.eps, chan.op) == (4, 1e-5, Reduction.logsumexp)
    assert tail.conv.nodes == ()  # the conv's output itself is stored (the norm's input and the residual)
    body = " ".join(chan.pro.statements())
    assert "tanhf" in body and chan.epi.nodes == () and not chan.store


def test_the_epilogue_before_the_first_stage_goes_to_the_convolution(problems):
    m = explain(problems["sigmoid_group_norm"])
    ep = m.facts.epilogue
    assert [p.name for p in ep.params] == ["bias", "scale"] and "expf" in " ".join(ep.statements)
    pool = explain(problems["avg_pool_sigmoid_sum"]).facts.tail
    assert pool.stages[0].store and pool.stages[1].per_sample and pool.stages[1].op == Reduction.sum


def test_a_tensor_constant_is_a_literal(problems):
    tail = explain(problems["channel_mean_no_keepdim"]).facts.tail
    assert tail.formula(tail.stages[0].epi) == "r + 1.5"


# ----- KernelBench -----------------------------------------------------------------------------
KB_MINE = {"17_Conv2d_InstanceNorm_Divide.py": ["stats", "map"],
           "21_Conv2d_Add_Scale_Sigmoid_GroupNorm.py": ["stats", "map"],
           "25_Conv2d_Min_Tanh_Tanh.py": ["channels"], "32_Conv2d_Scaling_Min.py": ["channels"],
           "35_Conv2d_Subtract_HardSwish_MaxPool_Mish.py": ["window"],
           "46_Conv2d_Subtract_Tanh_Subtract_AvgPool.py": ["window"],
           "65_Conv2d_AvgPool_Sigmoid_Sum.py": ["window", "segment"], "67_Conv2d_GELU_GlobalAvgPool.py": ["segment"],
           "82_Conv2d_Tanh_Scaling_BiasAdd_Max.py": ["window"],
           "85_Conv2d_GroupNorm_Scale_MaxPool_Clamp.py": ["stats", "window"],
           "92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp.py": ["stats", "channels"]}


# which variants are offered at the KernelBench size (sm_90 limits): one file per kind of stage
KB_OFFERED = ("25_Conv2d_Min_Tanh_Tanh.py", "65_Conv2d_AvgPool_Sigmoid_Sum.py",
              "85_Conv2d_GroupNorm_Scale_MaxPool_Clamp.py")


@needs_kb
@pytest.mark.parametrize("name", sorted(KB_MINE))
def test_kernelbench_files_it_claims(name):
    m = explain(load_problem(str(KB / "level2" / name)))
    assert m.family == "conv_tail"
    assert [s.kind.value for s in m.facts.tail.stages] == KB_MINE[name]


@needs_kb
@pytest.mark.parametrize("name", KB_OFFERED)
def test_variants_offered_at_the_kernelbench_size(name):
    m = explain(load_problem(str(KB / "level2" / name)))
    got = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in got.offered] == ["igemm", "direct", "wgmma"]  # sm_90 limits: Hopper's too
    for v in got.offered:
        plan.resolve(v.spec, sizes={}, tensors=m.tensor_facts())


@needs_kb
def test_kernelbench_elementwise_convolutions_stay_conv_epis():
    for name in ("1_Conv2D_ReLU_BiasAdd.py", "54_Conv2d_Multiply_LeakyReLU_GELU.py"):
        assert explain(load_problem(str(KB / "level2" / name))).family == "conv_epi"
    # torch.min(x, torch.tensor(c)): the one-element tensor made in forward is a literal of the epilogue
    m = explain(load_problem(str(KB / "level2" / "31_Conv2d_Min_Add_Multiply.py")))
    assert m.family == "conv_epi" and "kg_fmin(v, 0.5f)" in " ".join(m.facts.epilogue.statements)


# ----- specs --------------------------------------------------------------------------------------
def test_specs_compile_for_sm90_at_their_defaults(problems):
    """Every template, every mode: the direct conv's spec of each case (its tail kernels differ), the
    implicit GEMM's of one."""
    compiled = 0
    for name in sorted(CASES):
        m = explain(problems[name])
        for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered:
            if v.variant == "igemm" and name != "groupnorm_residual_logsumexp":
                continue
            spec = v.spec
            assert spec.name == FAMILY.spec_name(v.variant) == SPEC_PREFIX + v.variant
            assert variant_of_spec(spec) == v.variant
            assert all(vals == sorted(vals) for vals in spec.tunables.values())
            r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
            for launch in r.launches:
                for arg in launch.args:
                    assert arg.name in m.tensors() or arg.name in {s.name for s in r.scratch}, (name, arg.name)
            compile_job(job_for(spec, r, "sm_90"), cache=None)
            compiled += 1
    assert compiled == len(CASES) + 1


def test_one_launch_per_stage_after_the_convolution(problems):
    m = explain(problems["group_norm_scale_max_pool_clamp"])
    spec = family_of(m).build(m, "direct")
    kernels = [s.kernel for s in spec.steps]
    assert kernels == ["conv_epi_direct", "conv_tail_k1_stats", "conv_tail_k2_window"]
    assert [s.name for s in spec.scratch] == ["ct_b0", "ct_s0"]
    assert "ct_b0" in [a.name for a in spec.steps[0].args] and "out" not in [a.name for a in spec.steps[0].args]
    assert spec.steps[-1].args[-1].name == "out"


# ----- ideas ----------------------------------------------------------------------------------
def test_every_idea_names_a_variant_and_every_variant_has_a_first_idea():
    assert set(FAMILY.variants) == set(VARIANT_NAMES)
    for e in FAMILY.ideas:
        assert e.variant in FAMILY.variants and e.after <= set(FAMILY.variants), e.id
    assert {e.variant for e in FAMILY.ideas if e.round0} == set(VARIANT_NAMES)
    assert len({e.id for e in FAMILY.ideas}) == len(FAMILY.ideas)
    assert len({e.category for e in FAMILY.ideas}) == 6


def test_idea_branches_name_tunables_of_their_variant(problems):
    for variant in ("igemm", "direct"):
        spec = _build(explain(problems["group_norm_scale_max_pool_clamp"]), variant)
        for e in FAMILY.ideas:
            if e.variant == variant:
                for branch in e.branches:
                    assert set(branch) <= set(spec.tunables), (e.id, branch)
        assert set(TAIL_TUNABLES) <= set(spec.tunables)


def test_proposer_starts_with_the_offered_variants(problems):
    prop = PlaybookProposer(problems["max_pool_mish"])
    m = prop.match
    ctx = SearchContext(problem_name="max_pool_mish", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in m.tensors().items()}, gpu=GpuFacts(name="H100"))
    by_text = {e.text: e for e in FAMILY.ideas}
    round0 = prop.ideas(ctx, None, 5)
    assert {by_text[i.text].id for i in round0} == {"ctail-igemm", "ctail-direct"}
    branches = prop.implement(ctx, None, round0[0], 2)
    assert branches and all(b.spec is not None and b.spec.name.startswith(SPEC_PREFIX) for b in branches)


# ----- results on the CPU emulator ------------------------------------------------------------

# the igemm through its plain-load path (the emulator cannot run cp.async's inline PTX); odd tail blocks
EMU_CONFIGS = {
    "igemm": ({"ASYNC": 0},),
    "direct": ({}, {"TAIL_BLOCK": 128, "TAIL_ILP": 1}),
}
EMU_RUNS = [(n, v, cfg) for n in sorted(CASES) for v in EMU_CONFIGS for cfg in EMU_CONFIGS[v]]


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name,variant,config", EMU_RUNS, ids=[f"{n}-{v}-{len(c)}" for n, v, c in EMU_RUNS])
def test_kernels_match_pytorch_on_the_emulator(problems, name, variant, config):
    p = problems[name]
    m = explain(p)
    offered = offer(m, sizes={}, tensors=m.tensor_facts()).get(variant)
    spec = family_of(m).build(m, variant, {**offered.defaults, **config})
    model = p.build_model("cpu", 0)
    inputs = p.make_inputs("cpu", 0)
    ref = p.run_reference(model, inputs)[0]
    tensors = {k: v.contiguous() for k, v in p.bindings(model, inputs, [torch.full_like(ref, float("nan"))]).items()}
    emulate(spec, tensors, config=spec.default_config())
    torch.testing.assert_close(tensors["out"], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.needs_cxx
def test_a_broken_tail_fails_the_check(problems):
    """The emulator check is not vacuous: a logsumexp that forgets its running max is wrong."""
    p = problems["groupnorm_residual_logsumexp"]
    m = explain(p)
    spec = family_of(m).build(m, "direct")
    source = spec.source.replace("(inf ? mx[u] : mx[u] + logf(se[u]))", "logf(se[u])")
    broken = spec.model_copy(update={"source": source})
    assert broken.source != spec.source
    model = p.build_model("cpu", 0)
    inputs = p.make_inputs("cpu", 0)
    ref = p.run_reference(model, inputs)[0]
    tensors = {k: v.contiguous() for k, v in p.bindings(model, inputs, [torch.full_like(ref, float("nan"))]).items()}
    emulate(broken, tensors, config=broken.default_config())
    assert not torch.allclose(tensors["out"], ref, atol=1e-4, rtol=1e-4)
