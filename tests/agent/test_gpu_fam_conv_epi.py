"""GPU tier of the conv_epi family: each offered variant's default kernel passes the harness's full
checks on two KernelBench files at their own size (a conv2d with a per-channel epilogue; a depthwise
conv) and on odd shapes (a grouped, strided, dilated conv with a residual input; a 1-D depthwise conv
with a channel multiplier)."""

from __future__ import annotations


import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
KB_FILES = ["level2/54_Conv2d_Multiply_LeakyReLU_GELU.py", "level1/82_conv_depthwise_2D_square_input_square_kernel.py"]

ODD_GROUPED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(12, 32, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=4)

    def forward(self, x, y):
        return torch.nn.functional.gelu(self.conv(x)) * y


def get_inputs():
    return [torch.rand(3, 12, 37, 53), torch.rand(3, 32, 18, 53)]


def get_init_inputs():
    return []
'''

ODD_DEPTHWISE_1D = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(6, 12, 7, stride=2, padding=3, dilation=2, groups=6)

    def forward(self, x):
        return torch.relu(self.conv(x)) - 0.25


def get_inputs():
    return [torch.rand(5, 6, 1001)]


def get_init_inputs():
    return []
'''


def _check(pool, ref: ProblemRef) -> None:
    assert_all_pass(pool, ref, offered(ref, "conv_epi"), seeds_n=2)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", KB_FILES)
def test_kernelbench_files_at_their_own_size(pool, name):
    _check(pool, ProblemRef(source=str(KB / name)))


@pytest.mark.parametrize("text", [ODD_GROUPED, ODD_DEPTHWISE_1D], ids=["grouped-residual", "depthwise-1d"])
def test_odd_shapes(pool, tmp_path, text):
    path = tmp_path / "odd_conv.py"
    path.write_text(text)
    _check(pool, ProblemRef(source=str(path)))
