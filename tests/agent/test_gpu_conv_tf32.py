"""GPU tier of the 3xTF32 convolution (``tf32x3`` of the conv2d and conv_epi families, #19): the
offered kernel passes the harness's full checks (atol/rtol 1e-4, relative error 1e-5, fresh inputs)
on the suite's conv2d, an odd shape, conv2d_wide, a KernelBench level-1 conv2d file and a level-2
conv + epilogue file at their own size, and its time sits beside PyTorch eager's (printed with -s;
the issue's target on the suite shape is 2.5x eager). Plain TF32 (TERMS 1) is rejected on
conv2d_wide. The error against an fp64 convolution is measured beside PyTorch's fp32 (cuDNN, TF32
off), printed, and held to at most twice PyTorch's."""

from __future__ import annotations


import pytest
import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.conv.build_tf32 import VARIANT
from kerngen.agent.playbook.gemm.build_tf32 import TERMS_PLAIN
from kerngen.agent.playbook.coverage import offer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import Verdict
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.gpu_runs import conv_fp64_errors, run_spec
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
SUITE = ProblemRef(source="conv2d")  # (100, 3, 224, 224) k11 s4 p2 -> 96 channels, bias
WIDE = ProblemRef(source="conv2d_wide")
KB_FILES = ["level1/50_conv_standard_2D__square_input__square_kernel.py", "level2/54_Conv2d_Multiply_LeakyReLU_GELU.py"]

ODD = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(7, 13, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(5, 7, 37, 41)]


def get_init_inputs():
    return []
'''


def _spec(ref: ProblemRef, defaults: dict | None = None):
    """The offered tf32x3 kernel (its admissible default), with ``defaults`` on top."""
    m = explain(load_problem(ref))
    offered = offer(m, sizes={}, tensors=m.tensor_facts()).get(VARIANT)
    assert offered is not None, f"{VARIANT} not offered for {ref.label()}"
    return family_of(m).build(m, VARIANT, {**offered.defaults, **(defaults or {})})


def _passes(pool, ref: ProblemRef) -> None:
    (res,) = pool.evaluate(ref, [Candidate(spec=_spec(ref))], EvalOptions(seeds=3, budget_ms=200, timeout_s=600))
    assert res.ok, f"{res.verdict.value}: {res.message}\n{res.log[-2000:]}"
    base = pool.baseline(ref, budget_ms=200, with_compile=False)
    print(f"\n{ref.label()}: tf32x3 {res.ms:.4f} ms, eager {base.eager.median_ms:.4f} ms "
          f"({base.eager.median_ms / res.ms:.2f}x); config {res.config}; {res.message}")


@pytest.mark.parametrize("ref", [SUITE, WIDE], ids=["conv2d", "conv2d_wide"])
def test_passes_the_harness_on_the_suite_problems(pool, ref):
    _passes(pool, ref)


def test_passes_the_harness_on_an_odd_shape(pool, tmp_path):
    path = tmp_path / "odd_conv.py"  # 7 channels, 37 x 41, k3 s2 p1, 13 output channels: every edge partial
    path.write_text(ODD)
    _passes(pool, ProblemRef(source=str(path)))


@needs_kb
@pytest.mark.parametrize("name", KB_FILES)
def test_passes_the_harness_on_kernelbench_files_at_their_own_size(pool, name):
    _passes(pool, ProblemRef(source=str(KB / name)))


def test_plain_tf32_is_rejected_on_conv2d_wide(pool):
    (res,) = pool.evaluate(WIDE, [Candidate(spec=_spec(WIDE, {"TERMS": TERMS_PLAIN}))],
                           EvalOptions(seeds=3, bench=False, timeout_s=600))
    assert res.verdict is Verdict.incorrect, f"{res.verdict.value}: {res.message}"
    print(f"\nTERMS 1 on conv2d_wide: {res.message}")


def _run(spec, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    conv = model.conv
    out = torch.empty_like(conv(x))
    run_spec(spec, {"x": x, "conv.weight": conv.weight, "conv.bias": conv.bias, "out": out})
    return out


@pytest.mark.parametrize("ref", [SUITE, WIDE], ids=["conv2d", "conv2d_wide"])
def test_error_against_fp64_is_at_most_twice_pytorch_fp32(ref):
    spec = _spec(ref)
    ours, theirs = conv_fp64_errors(load_problem(ref), lambda model, x: _run(spec, model, x))
    print(f"\n{ref.label()} vs fp64: tf32x3 max {ours[0]:.3g} rel {ours[1]:.3g}; "
          f"torch fp32 max {theirs[0]:.3g} rel {theirs[1]:.3g}")
    assert ours[1] <= 2 * theirs[1] and ours[0] <= 2 * theirs[0]
