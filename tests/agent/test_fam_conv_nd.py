"""The ``conv_nd`` family: 3-D and transposed convolutions (1-D, 2-D, 3-D; groups, stride, padding,
dilation, output padding) with a fused elementwise epilogue. Recognition on small problems and on
KernelBench's files, NVRTC compiles of every offered variant at the files' own sizes, and both kernels
against PyTorch on the CPU emulator (tests/emu): the direct one everywhere, the 3xTF32 implicit GEMM on
the 3-D convolutions, the transposed ones of stride 1 (flipped weights, low padding d*(k-1)-p, negative
where p is larger, output padding on the high side) and the strided transposed ones (one GEMM per output
phase; phases that no tap reaches where stride and dilation share a factor), and its refusal of one
input channel a group."""

from __future__ import annotations


import pytest
import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.conv.nd import CONV_ND as FAMILY, out_size
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import CONV_PROBLEM, problem_files
from tests.emu.runner import emulate
from tests.resources import kernelbench

KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench

# name -> (constructor, init lines, forward body, input) of family_checks.CONV_PROBLEM with forward(self, x):
# small shapes (the emulator runs them)
CASES = {
    "conv3d_bias_relu": ("nn.Conv3d(3, 4, 3)", "", "        return torch.relu(self.conv(x))",
                         "torch.rand(2, 3, 5, 6, 7)"),
    "conv3d_grouped_strided_dilated": ("nn.Conv3d(4, 8, (2, 3, 3), stride=(1, 2, 2), padding=(1, 0, 2), "
                                       "dilation=(2, 1, 2), groups=2, bias=False)", "", "        return self.conv(x)",
                                       "torch.rand(2, 4, 6, 9, 8)"),
    "convT1d_strided_dilated_outpad": ("nn.ConvTranspose1d(4, 6, 3, stride=3, padding=2, dilation=2, "
                                       "output_padding=1)", "", "        return self.conv(x) * 0.5",
                                       "torch.rand(2, 4, 11)"),
    "convT2d_grouped_channel_bias": ("nn.ConvTranspose2d(4, 8, (3, 2), stride=(2, 3), padding=(1, 1), groups=2)",
                                     "        self.b = nn.Parameter(torch.randn(8, 1, 1))",
                                     "        return torch.tanh(self.conv(x) + self.b)", "torch.rand(2, 4, 5, 6)"),
    # stride and dilation share a factor (KernelBench 75, 77, 79): an output column whose o + P is odd
    # meets no tap at all (the tap loop began past the first step there and read taps that miss)
    "convT2d_stride_dilation_common_factor": ("nn.ConvTranspose2d(3, 4, (3, 2), stride=(2, 4), padding=(1, 2), "
                                              "dilation=(2, 2), groups=1)", "", "        return self.conv(x)",
                                              "torch.rand(2, 3, 5, 4)"),
    "convT3d_strided_padded": ("nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, bias=False)", "",
                               "        return self.conv(x)", "torch.rand(1, 3, 3, 4, 5)"),
    # stride 1: the 3xTF32 implicit GEMM's too (output padding below the dilation; padding past d*(k-1))
    "convT1d_s1_dilated_outpad": ("nn.ConvTranspose1d(4, 6, 3, padding=1, dilation=2, output_padding=1)", "",
                                  "        return self.conv(x) * 0.5", "torch.rand(2, 4, 11)"),
    "convT2d_s1_grouped_channel_bias": ("nn.ConvTranspose2d(4, 8, (3, 2), padding=(1, 0), groups=2)",
                                        "        self.b = nn.Parameter(torch.randn(8, 1, 1))",
                                        "        return torch.tanh(self.conv(x) + self.b)", "torch.rand(2, 4, 5, 6)"),
    "convT3d_s1_overpadded": ("nn.ConvTranspose3d(3, 4, (3, 2, 3), padding=(3, 0, 1), bias=False)", "",
                              "        return self.conv(x)", "torch.rand(1, 3, 7, 4, 5)"),
    # one input channel a group: the direct kernel's alone
    "convT2d_depthwise_strided": ("nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, groups=4)", "",
                                  "        return self.conv(x)", "torch.rand(2, 4, 5, 6)"),
    # a 3-D stride with a kernel it does not divide (phases of 2 and 1 taps) and output padding
    "convT3d_strided_outpad_bias": ("nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 2), "
                                    "output_padding=(1, 0, 2))", "", "        return torch.relu(self.conv(x))",
                                    "torch.rand(2, 4, 3, 4, 3)"),
}
# the cases the 3xTF32 implicit GEMM takes: two or more input channels a group
TF32_CASES = sorted(set(CASES) - {"convT2d_depthwise_strided"})
TF32_SMALL = {"BM": 64, "BK": 16, "WM": 32, "WN": 16, "STAGES": 2}  # BN: the builder's channel tile


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return problem_files(tmp_path_factory.mktemp("conv_nd"), CONV_PROBLEM, CASES, ("ctor", "init", "body", "inputs"),
                         args="x")


def test_output_sizes_are_torchs():
    assert out_size(11, 3, 3, 2, 2, 1, True) == tuple(torch.nn.ConvTranspose1d(1, 1, 3, 3, 2, 1, dilation=2)(
        torch.rand(1, 1, 11)).shape)[2] == 32
    assert out_size(9, 3, 2, 0, 1, 0, False) == 4


@pytest.mark.parametrize("name", sorted(CASES))
def test_claims_3d_and_transposed_convs_with_epilogues(problems, name):
    m = explain(problems[name])
    assert m.family == FAMILY.name, m.reason
    f = m.facts
    assert len(f.K) == len(f.S) == len(f.P) == len(f.D) == len(f.OP) == 3
    assert f.transposed == ("convT" in name)


@pytest.mark.needs_cxx
@pytest.mark.parametrize("config", [{}, {"OCT": 2, "BLOCK": 128}])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_pytorch_on_the_emulator(problems, name, config):
    _matches_pytorch(problems[name], "direct", config)


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name", TF32_CASES)
def test_tf32x3_implicit_gemm_matches_pytorch_on_the_emulator(problems, name):
    _matches_pytorch(problems[name], "tf32x3", TF32_SMALL)


def test_tf32x3_is_offered_wherever_a_group_has_two_input_channels(problems):
    for name, p in problems.items():
        m = explain(p)
        o = offer(m, sizes={}, tensors=m.tensor_facts())
        assert (o.get("tf32x3") is not None) == (name in TF32_CASES), (name, o.why_not("tf32x3"))
    why = offer(m := explain(problems["convT2d_depthwise_strided"]), sizes={}, tensors=m.tensor_facts()).why_not("tf32x3")
    assert "x.shape[1] // 4 >= 2" in why, why


def _matches_pytorch(p, variant: str, config: dict) -> None:
    m = explain(p)
    spec = family_of(m).build(m, variant, config)
    model = p.build_model("cpu", 0)
    inputs = p.make_inputs("cpu", 0)
    ref = p.run_reference(model, inputs)[0]
    tensors = {k: v.contiguous() for k, v in p.bindings(model, inputs, [torch.full_like(ref, float("nan"))]).items()}
    emulate(spec, tensors, config=spec.default_config())
    torch.testing.assert_close(tensors["out"], ref, atol=1e-4, rtol=1e-4)


LEVEL1 = ["54_conv_standard_3D__square_input__square_kernel.py", "57_conv_transposed_2D__square_input__square_kernel.py",
          "64_conv_transposed_1D.py", "74_conv_transposed_1D_dilated.py",
          "72_conv_transposed_3D_asymmetric_input_asymmetric_kernel___strided_padded_grouped_.py",
          "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__.py"]


@needs_kb
@pytest.mark.parametrize("name", LEVEL1)
def test_kernelbench_files_compile_at_their_own_size(name):
    m = explain(load_problem(str(KB / "level1" / name)))
    assert m.family == FAMILY.name
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    strided_transposed = m.facts.transposed and set(m.facts.S) != {1}  # phases: not on wgmma (sm_90 limits)
    assert [v.variant for v in o.offered] == ["direct", "tf32x3"] + ([] if strided_transposed else ["wgmma"])
    if strided_transposed:
        assert "output phases are the tf32x3 variant's" in o.why_not("wgmma")
    for v in o.offered:
        r = plan.resolve(v.spec, sizes={}, tensors=m.tensor_facts())
        res = compile_job(job_for(v.spec, r, "sm_90"), cache=None).info.worst()
        assert 0 < res.registers <= 255 and res.spill_stores == 0, (v.variant, res)


@needs_kb
def test_a_transposed_conv_followed_by_a_norm_is_refused_with_the_reason_and_served_as_regions():
    p = load_problem(str(KB / "level2" / "3_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU.py"))
    with pytest.raises(NotCovered, match="conv_nd cannot fuse as an elementwise epilogue"):
        FAMILY.recognise(trace(p))
    m = explain(p)
    assert [r.match.family for r in m.facts.partition.regions] == ["conv_nd", "layernorm", "pool", "elementwise"]
