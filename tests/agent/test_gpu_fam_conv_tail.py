"""GPU tier of the conv_tail family: each offered variant's default kernels (the convolution into
scratch, then one launch per stage of the tail) pass the harness's full checks on two KernelBench files
at their own size (group norm + residual + logsumexp over the channels; group norm + scale + max pool +
clamp) and on an odd shape (a strided, padded conv, a group norm, a padded average pool without the
padding in its count, a maximum over each plane plus a per-channel bias)."""

from __future__ import annotations


import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
KB_FILES = ["level2/92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp.py",
            "level2/85_Conv2d_GroupNorm_Scale_MaxPool_Clamp.py"]

ODD = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(5, 12, (3, 5), stride=2, padding=(1, 2))
        self.gn = nn.GroupNorm(3, 12)
        self.pool = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.bias = nn.Parameter(torch.randn(12))

    def forward(self, x):
        x = self.pool(torch.relu(self.gn(self.conv(x))))
        return torch.amax(x, dim=(2, 3)) + self.bias


def get_inputs():
    return [torch.rand(3, 5, 37, 53)]


def get_init_inputs():
    return []
'''


def _check(pool, ref: ProblemRef) -> None:
    assert_all_pass(pool, ref, offered(ref, "conv_tail"), seeds_n=2)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", KB_FILES)
def test_kernelbench_files_at_their_own_size(pool, name):
    _check(pool, ProblemRef(source=str(KB / name)))


def test_odd_shape(pool, tmp_path):
    path = tmp_path / "odd_conv_tail.py"
    path.write_text(ODD)
    _check(pool, ProblemRef(source=str(path)))
