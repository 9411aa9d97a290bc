"""The conv_epi playbook family (CPU tier): which problems it claims and which it leaves to the
built-in conv families, the facts it reads, its specs (resolution, NVRTC compilation for sm_90 at the
default and sampled configurations), its ideas, and (where the CPU emulator is there) its kernels'
results at small shapes against PyTorch."""

from __future__ import annotations


import pytest
import torch

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.conv.build_epi import SPEC_PREFIX, VARIANT_NAMES
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.epilogue import EpIndex, EpParam
from kerngen.agent.playbook.conv.epi import CONV_EPI as FAMILY
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.proposer import NodeSummary, SearchContext
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import EvalResult, GpuFacts, Verdict
from kerngen.harness.spec import plan
from tests.agent.family_checks import CONV_PROBLEM
from tests.agent.spec_samples import sampled_plans
from kerngen.problems.load import load_problem
from tests.resources import kernelbench
from tests.emu.runner import emulate


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)


KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench


# name -> (conv constructor, init lines, forward args, forward body, inputs): small shapes (the emulator runs them)
CASES = {
    "conv2d_bias_relu": ("nn.Conv2d(3, 8, 3)", "        self.bias = nn.Parameter(torch.randn(8, 1, 1))", "x",
                         "        return torch.relu(self.conv(x)) + self.bias", "torch.rand(2, 3, 9, 11)"),
    "conv2d_dilated_padded": ("nn.Conv2d(4, 8, (3, 5), padding=(2, 3), dilation=(2, 3), bias=False)", "", "x",
                              "        return self.conv(x)", "torch.rand(2, 4, 11, 13)"),
    "conv2d_grouped_residual": ("nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=4)", "", "x, y",
                                "        return torch.sigmoid(self.conv(x)) * y + 0.5",
                                "torch.rand(2, 8, 10, 9), torch.rand(2, 16, 5, 5)"),
    "conv2d_groups_of_3_channels": ("nn.Conv2d(6, 6, 3, groups=2)", "", "x", "        return self.conv(x) + 1.0",
                                    "torch.rand(2, 6, 7, 8)"),
    "conv1d_strided_dilated": ("nn.Conv1d(4, 8, 3, stride=3, dilation=4, bias=False)", "", "x",
                               "        return self.conv(x)", "torch.rand(2, 4, 61)"),
    "conv1d_scale_mish": ("nn.Conv1d(6, 16, 5, padding=2)", "        self.scale = nn.Parameter(torch.rand(16, 1))",
                          "x", "        return torch.nn.functional.mish(self.conv(x) * self.scale)",
                          "torch.rand(3, 6, 40)"),
    "depthwise": ("nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)", "", "x", "        return self.conv(x)",
                  "torch.rand(2, 4, 12, 19)"),
    "depthwise_mult_strided_tanh": ("nn.Conv2d(3, 6, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2), groups=3)",
                                    "", "x", "        return torch.tanh(self.conv(x) / 2.0)",
                                    "torch.rand(2, 3, 13, 10)"),
    "depthwise_1d_same": ("nn.Conv1d(4, 4, 5, padding='same', groups=4)", "", "x",
                          "        return torch.relu(self.conv(x))", "torch.rand(2, 4, 70)"),
    "conv2d_same_padding": ("nn.Conv2d(3, 8, 5, padding='same')", "", "x", "        return self.conv(x)",
                            "torch.rand(2, 3, 9, 7)"),
    "conv2d_binop_only": ("nn.Conv2d(3, 4, 3)", "", "x", "        return self.conv(x) * 2.0 - 1.0",
                          "torch.rand(2, 3, 8, 8)"),
}
# not conv_epi's: (conv constructor, init, args, body, inputs, the family explain gives or the refusal's words)
OTHERS = {
    "plain_conv2d": ("nn.Conv2d(3, 8, 3)", "", "x", "        return self.conv(x)", "torch.rand(2, 3, 9, 9)",
                     "family conv2d"),
    "conv_relu_maxpool": ("nn.Conv2d(3, 8, 3)", "        self.pool = nn.MaxPool2d(2)", "x",
                          "        return self.pool(torch.relu(self.conv(x)))", "torch.rand(2, 3, 10, 10)",
                          "family conv_relu_maxpool"),
    "conv_then_sum": ("nn.Conv2d(3, 8, 3)", "", "x", "        return self.conv(x).sum(dim=1)",
                      "torch.rand(2, 3, 9, 9)", "family conv_tail"),
    "reflect_padding": ("nn.Conv2d(3, 8, 3, padding=1, padding_mode='reflect')", "", "x",
                        "        return torch.relu(self.conv(x))", "torch.rand(2, 3, 9, 9)", "NotCovered: pad at pad"),
    "two_convs": ("nn.Conv2d(3, 3, 3, padding=1, groups=3)", "        self.pw = nn.Conv2d(3, 8, 1)", "x",
                  "        return self.pw(self.conv(x))", "torch.rand(2, 3, 9, 9)", "family regions"),
    "conv3d": ("nn.Conv3d(3, 8, 3)", "", "x", "        return torch.relu(self.conv(x))",
               "torch.rand(2, 3, 6, 6, 6)", "family conv_nd"),
    "scalar_forward_input": ("nn.Conv2d(3, 4, 3)", "", "x, alpha", "        return self.conv(x) * alpha",
                             "torch.rand(2, 3, 8, 8), 0.5", "family conv_epi"),  # alpha: a traced constant
}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = tmp_path_factory.mktemp("conv_epi")
    out = {}
    for name, (ctor, init, args, body, inputs, *_) in {**CASES, **OTHERS}.items():
        path = root / f"{name}.py"
        path.write_text(CONV_PROBLEM.format(ctor=ctor, init=init, args=args, body=body, inputs=inputs))
        out[name] = load_problem(str(path))
    return out



def _why(p) -> str:
    try:
        return f"family {explain(p).family}"
    except NotCovered as exc:
        return str(exc)


# ----- recognition ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_claims_convolutions_with_elementwise_epilogues(problems, name):
    assert explain(problems[name]).family == "conv_epi"


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_leaves_or_refuses_what_is_not_its_own(problems, name):
    assert OTHERS[name][-1] in _why(problems[name])


def test_facts_of_a_grouped_conv_with_a_residual_input(problems):
    f = explain(problems["conv2d_grouped_residual"]).facts
    assert (f.dims, f.C, f.OC, f.G, f.SH, f.PW, f.DH) == (2, 8, 16, 4, 2, 1, 1)
    assert f.x == "x" and f.weight == "conv.weight" and f.bias == "conv.bias"
    assert f.epilogue.params == (EpParam("y", EpIndex.full),)


def test_facts_of_a_1d_conv_are_a_2d_conv_of_height_one(problems):
    f = explain(problems["conv1d_strided_dilated"]).facts
    assert (f.dims, f.KH, f.SH, f.PH, f.DH) == (1, 1, 1, 0, 1)
    assert (f.KW, f.SW, f.PW, f.DW, f.bias) == (3, 3, 0, 4, None)
    assert f.epilogue.empty
    same = explain(problems["depthwise_1d_same"]).facts
    assert (same.PW, same.G) == (2, 4)  # padding='same' read as 2 on each side


def test_a_python_number_passed_to_forward_is_a_constant_the_spec_checks(problems):
    m = explain(problems["scalar_forward_input"])
    assert "0.5f" in " ".join(m.facts.epilogue.statements)
    spec = family_of(m).build(m, "direct")
    assert "alpha == 0.5" in spec.constraints  # the value the trace took, checked against the problem's


def test_a_per_channel_parameter_of_a_1d_conv(problems):
    ep = explain(problems["conv1d_scale_mish"]).facts.epilogue
    assert ep.params == (EpParam("scale", EpIndex.channel),) and "ep0[ch]" in " ".join(ep.statements)


# ----- KernelBench -----------------------------------------------------------------------------
KB_MINE = ["level1/67_conv_standard_1D.py", "level1/76_conv_standard_1D_dilated_strided__.py",
           "level1/80_conv_standard_2D_square_input_asymmetric_kernel___dilated____padded__.py",
           "level1/82_conv_depthwise_2D_square_input_square_kernel.py",
           "level1/83_conv_depthwise_2D_square_input_asymmetric_kernel.py",
           "level1/84_conv_depthwise_2D_asymmetric_input_square_kernel.py",
           "level1/85_conv_depthwise_2D_asymmetric_input_asymmetric_kernel.py",
           "level2/1_Conv2D_ReLU_BiasAdd.py", "level2/4_Conv2d_Mish_Mish.py",
           "level2/54_Conv2d_Multiply_LeakyReLU_GELU.py", "level2/57_Conv2d_ReLU_HardSwish.py",
           "level2/69_Conv2d_HardSwish_ReLU.py", "level2/71_Conv2d_Divide_LeakyReLU.py",
           "level2/87_Conv2d_Subtract_Subtract_Mish.py", "level2/31_Conv2d_Min_Add_Multiply.py"]
KB_NOT_MINE = {"level1/50_conv_standard_2D__square_input__square_kernel.py": "family conv2d",
               "level1/87_conv_pointwise_2D.py": "family conv2d",
               "level2/25_Conv2d_Min_Tanh_Tanh.py": "family conv_tail",
               "level2/17_Conv2d_InstanceNorm_Divide.py": "family conv_tail",
               "level2/47_Conv3d_Mish_Tanh.py": "family conv_nd",
               "level1/86_conv_depthwise_separable_2D.py": "family regions"}
# which variants each kind of KernelBench problem is offered at its own size (sm_90 limits: wgmma too, except for
# depthwise convolutions and for 76, whose x (2^31 fp32 elements) is past the wgmma pre-pass's scratch limit)
KB_OFFERED = {"level1/82_conv_depthwise_2D_square_input_square_kernel.py": ["depthwise"],
              "level1/76_conv_standard_1D_dilated_strided__.py": ["igemm", "direct", "tf32x3"],
              "level2/54_Conv2d_Multiply_LeakyReLU_GELU.py": ["igemm", "direct", "tf32x3", "wgmma", "wgmma_s2d"]}


@needs_kb
@pytest.mark.parametrize("name", KB_MINE)
def test_kernelbench_files_it_claims(name):
    m = explain(load_problem(str(KB / name)))
    assert m.family == "conv_epi"
    assert (m.facts.G == m.facts.C) == ("depthwise" in name)


@needs_kb
@pytest.mark.parametrize("name", sorted(KB_NOT_MINE))
def test_kernelbench_files_it_does_not_claim(name):
    assert KB_NOT_MINE[name] in _why(load_problem(str(KB / name)))


@needs_kb
@pytest.mark.parametrize("name", sorted(KB_OFFERED))
def test_variants_offered_at_the_kernelbench_size(name):
    p = load_problem(str(KB / name))
    m = explain(p)
    got = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in got.offered] == KB_OFFERED[name]
    for v in got.offered:
        plan.resolve(v.spec, sizes={}, tensors=m.tensor_facts())  # the offered default resolves at this size


# ----- specs --------------------------------------------------------------------------------------

def _offered_specs(problems):
    for name in sorted(CASES):
        m = explain(problems[name])
        for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered:
            yield name, v.variant, m, v.spec


@pytest.mark.parametrize("name", sorted(CASES))
def test_depthwise_problems_get_the_depthwise_kernel_only(problems, name):
    m = explain(problems[name])
    offered = [v.variant for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered]
    # Hopper's wgmma (sm_90 limits) wherever a group has at least 16 output channels
    assert ("wgmma" in offered) == (m.facts.OC // m.facts.G >= 16 and m.facts.C != m.facts.G), offered
    # and the space-to-depth one where it is also ungrouped and undilated (build_s2d.py)
    plain = m.facts.G == 1 and (m.facts.DH, m.facts.DW) == (1, 1)
    assert ("wgmma_s2d" in offered) == ("wgmma" in offered and plain), offered
    offered = [v for v in offered if v not in ("wgmma", "wgmma_s2d")]
    if m.facts.C == m.facts.G:
        assert offered == ["depthwise"]
    elif (m.facts.OC // m.facts.G) % 4:  # the direct kernel reads its channels' weights as float4
        assert offered == ["igemm", "tf32x3"]
    else:
        assert offered == ["igemm", "direct", "tf32x3"]


def test_specs_compile_for_sm90_at_default_and_sampled_configs(problems):
    compiled = 0
    for name, variant, m, spec in _offered_specs(problems):
        assert spec.name == FAMILY.spec_name(variant) == SPEC_PREFIX + variant
        assert variant_of_spec(spec) == variant
        assert all(v == sorted(v) for v in spec.tunables.values())
        facts = m.tensor_facts()
        resolved = [plan.resolve(spec, sizes={}, tensors=facts)] + sampled_plans(spec, facts, 2)
        for r in resolved:
            for launch in r.launches:
                for arg in launch.args:
                    assert arg.name in m.tensors() or arg.name in {s.name for s in r.scratch}, (name, arg.name)
            compile_job(job_for(spec, r, "sm_90"), cache=None)
            compiled += 1
    assert compiled >= 3 * len(CASES)


def test_igemm_without_cp_async_compiles(problems):
    m = explain(problems["conv2d_grouped_residual"])
    spec = family_of(m).build(m, "igemm", {"ASYNC": 0})
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    assert r.config["ASYNC"] == 0
    compile_job(job_for(spec, r, "sm_90"), cache=None)


def test_the_epilogue_and_its_operands_reach_the_kernel(problems):
    m = explain(problems["conv2d_grouped_residual"])
    spec = family_of(m).build(m, "igemm")
    assert "__global__" in spec.source and "sigmoid" not in spec.source  # C, not the formula's words
    assert "1.f / (1.f + expf(-v))" in spec.source and "ep0[idx]" in spec.source
    main = spec.steps[-1]
    assert [a["name"] for a in main.model_dump()["args"]][-2:] == ["out", "y"]


def test_constraints_follow_the_module_geometry(problems):
    m = explain(problems["conv2d_grouped_residual"])
    facts = m.tensor_facts()
    spec = offer(m, sizes={}, tensors=facts).get("direct").spec
    plan.resolve(spec, sizes={}, tensors=facts)
    wrong = dict(facts, x=TensorFacts((2, 6, 10, 9)))  # 6 input channels do not split into the 4 groups' 2 each
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(spec, sizes={}, tensors=wrong)


# ----- ideas ----------------------------------------------------------------------------------
def test_every_idea_names_a_variant_and_every_variant_has_a_first_idea():
    assert set(FAMILY.variants) == {*VARIANT_NAMES, "wgmma", "wgmma_s2d"}
    for e in FAMILY.ideas:
        assert e.variant in FAMILY.variants and e.after <= set(FAMILY.variants), e.id
    assert {e.variant for e in FAMILY.ideas if e.round0} == {*VARIANT_NAMES, "wgmma", "wgmma_s2d"}
    assert len({e.id for e in FAMILY.ideas}) == len(FAMILY.ideas)


def test_idea_branches_name_tunables_of_their_variant(problems):
    for name, variant in (("conv2d_bias_relu", "igemm"), ("conv2d_bias_relu", "direct"), ("depthwise", "depthwise")):
        spec = _build(explain(problems[name]), variant)
        for e in FAMILY.ideas:
            if e.variant == variant:
                for branch in e.branches:
                    assert set(branch) <= set(spec.tunables), (e.id, branch)


@pytest.mark.parametrize("name, first", [("conv2d_bias_relu", {"cepi-igemm", "cepi-direct", "cepi-tf32x3"}),
                                         ("depthwise_mult_strided_tanh", {"cepi-depthwise"})])
def test_proposer_starts_with_the_offered_variants_and_refines_its_parent(problems, name, first):
    prop = PlaybookProposer(problems[name])
    m = prop.match
    ctx = SearchContext(problem_name=name, problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in m.tensors().items()}, gpu=GpuFacts(name="H100"))
    by_text = {e.text: e for e in FAMILY.ideas}
    round0 = prop.ideas(ctx, None, 5)
    assert {by_text[i.text].id for i in round0} == first
    branches = prop.implement(ctx, None, round0[0], 2)
    assert branches and all(b.spec is not None and b.spec.name.startswith(SPEC_PREFIX) for b in branches)
    parent = NodeSummary(node_id=1, idea=round0[0], spec=branches[0].spec, result=EvalResult(verdict=Verdict.ok))
    variant = variant_of_spec(parent.spec)
    later = prop.ideas(ctx, parent, 5)
    assert later and all(by_text[i.text].variant == variant for i in later if not by_text[i.text].round0)
    assert any(not by_text[i.text].round0 for i in later)


# ----- results on the CPU emulator ------------------------------------------------------------

# per variant, configurations beyond the offered default: the igemm through its plain-load path (the
# emulator cannot run cp.async's inline PTX)
EMU_CONFIGS = {
    "igemm": ({"ASYNC": 0}, {"ASYNC": 0, "BM": 64, "BN": 16, "TM": 4, "TN": 4, "BK": 8, "STAGES": 2}),
    "direct": ({}, {"OCT": 4, "PTX": 2}),
    "depthwise": ({}, {"VEC": 0, "PTX": 2}),
}
# the variants each case is offered (test_depthwise_problems_get_the_depthwise_kernel_only checks them)
EMU_VARIANTS = {n: ("depthwise",) if n.startswith("depthwise") else ("igemm",) if n == "conv2d_groups_of_3_channels"
                else ("igemm", "direct") for n in CASES}
EMU_RUNS = [(n, v, cfg) for n in sorted(CASES) for v in EMU_VARIANTS[n] for cfg in EMU_CONFIGS[v]]


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name,variant,config", EMU_RUNS, ids=[f"{n}-{v}-{i % 2}" for i, (n, v, _) in
                                                               enumerate(EMU_RUNS)])
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
