"""GPU tier of the norm family: the round-0 kernels (every offered variant at its default
configuration) pass the harness's full correctness checks on KernelBench's batch norm and group
norm at their own size, and on small odd shapes (planes of 35 floats: scalar loads; batch
statistics; group norm without affine parameters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, seeds
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench("level1")
ODD = {
    "gn_odd": ("nn.GroupNorm(3, 9, affine=False, eps=1e-3)", (3, 9, 5, 7)),
    "bn_batch_odd": ("nn.BatchNorm2d(5, track_running_stats=False)", (6, 5, 7, 9)),
    "in_odd": ("nn.InstanceNorm2d(4, affine=True)", (3, 4, 33, 17)),
}
SOURCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = {init}

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn({shape}) * 3.0 + 1.0]


def get_init_inputs():
    return []
"""


def _check(pool, path: Path) -> None:
    ref = ProblemRef(source=str(path))
    assert_all_pass(pool, ref, seeds(ref), seeds_n=2, budget_ms=50)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", ["33_BatchNorm.py", "35_GroupNorm_.py"])
def test_kernelbench_norms_pass_the_checks(pool, name):
    _check(pool, KB / name)


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_shapes_pass_the_checks(pool, tmp_path, name):
    init, shape = ODD[name]
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE.format(init=init, shape=", ".join(map(str, shape))))
    _check(pool, path)
