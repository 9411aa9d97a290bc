"""GPU tier of the pool family: its default kernels (every offered variant at its offered default
configuration) pass the harness's full checks on two KernelBench pools at their own size and on
KernelBench-format files at odd shapes (ceil_mode windows past the end, divisors without padding,
dilation, stride larger than the kernel, an unbatched input)."""

from __future__ import annotations


import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench("level1")
KB_FILES = ["42_Max_Pooling_2D.py", "46_Average_Pooling_3D.py"]

ODD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
'''
ODD_CASES = {  # name -> (returned expression, input shape)
    "max3d_ceil_dilated": ("F.max_pool3d(x, 3, 2, 1, 2, ceil_mode=True)", (3, 5, 19, 23, 29)),
    "avg2d_ceil_no_pad_count": ("F.avg_pool2d(x, (3, 5), (2, 3), (1, 2), ceil_mode=True, count_include_pad=False)",
                                (4, 7, 101, 131)),
    "avg1d_gaps": ("F.avg_pool1d(x, 3, 5, 1)", (9, 11, 1001)),
    "max1d_unbatched": ("F.max_pool1d(x, 7, 1, 3, 3)", (33, 2047)),
}


def _check(pool, ref: ProblemRef) -> None:
    assert_all_pass(pool, ref, offered(ref, "pool"), seeds_n=3)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", KB_FILES)
def test_kernelbench_pools_at_their_own_size(pool, name):
    _check(pool, ProblemRef(source=str(KB / name)))


@pytest.mark.parametrize("name", sorted(ODD_CASES))
def test_odd_shapes(pool, tmp_path, name):
    body, shape = ODD_CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(ODD.format(body=body, shape=shape))
    _check(pool, ProblemRef(source=str(path)))
