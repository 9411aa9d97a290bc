"""GPU tier of the loss family: its default kernels (every offered variant at its offered default
configuration) pass the harness's full checks on two KernelBench losses at their own size and on
KernelBench-format files at odd shapes (a term count not a multiple of 4, broadcast inputs in each
layout, rows of a length that is not a multiple of 4, ignored targets, the swap option)."""

from __future__ import annotations


import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench("level1")
KB_FILES = ["94_MSELoss.py", "95_CrossEntropyLoss.py"]

ODD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {body}


def get_inputs():
    {inputs}


def get_init_inputs():
    return []
'''
ODD_CASES = {  # name -> (forward args, returned expression, get_inputs body)
    "mse_odd": ("p, t", "torch.mean((p - t) ** 2)", "return [torch.rand(1000, 1001), torch.rand(1000, 1001)]"),
    "hinge_odd": ("p, t", "torch.mean(torch.clamp(1 - p * t, min=0))",
                  "return [torch.rand(999, 37), torch.randint(0, 2, (37,)).float() * 2 - 1]"),
    "row_and_column": ("p, t, w", "torch.sum(torch.abs(p - t) * w) / 7",
                       "return [torch.rand(300, 64), torch.rand(300, 1), torch.rand(64)]"),
    "column_odd": ("p, t", "torch.mean(torch.abs(p - t))", "return [torch.rand(301, 63), torch.rand(301, 1)]"),
    "smooth_l1_odd": ("p, t", "F.smooth_l1_loss(p * 3, t, beta=0.5)",
                      "return [torch.rand(257, 129), torch.rand(257, 129)]"),
    "kl_odd": ("p, t", "F.kl_div(torch.log(p), t, reduction='batchmean')",
               "return [torch.rand(129, 77).softmax(-1), torch.rand(129, 77).softmax(-1)]"),
    "ce_odd": ("x, t", "F.cross_entropy(x, t)",
               "t = torch.randint(0, 1001, (1000,))\n    t[::7] = -100\n    return [torch.randn(1000, 1001) * 4, t]"),
    "triplet_odd": ("a, p, n", "F.triplet_margin_loss(a, p, n, margin=0.5, swap=True)",
                    "return [torch.rand(333, 1003), torch.rand(333, 1003), torch.rand(333, 1003)]"),
}


def _check(pool, ref: ProblemRef) -> None:
    assert_all_pass(pool, ref, offered(ref, "loss"), seeds_n=3)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", KB_FILES)
def test_kernelbench_losses_at_their_own_size(pool, name):
    _check(pool, ProblemRef(source=str(KB / name)))


@pytest.mark.parametrize("name", sorted(ODD_CASES))
def test_odd_shapes(pool, tmp_path, name):
    args, body, inputs = ODD_CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(ODD.format(args=args, body=body, inputs=inputs))
    _check(pool, ProblemRef(source=str(path)))
