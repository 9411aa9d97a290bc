"""GPU tier of the reduce family: the default kernels (every offered variant's round-0 spec) pass the
harness's full checks (several seeds, poisoned outputs, guards, exact int64 for argmax/argmin) on two
KernelBench files at their own size and on odd shapes (rows not a multiple of 4, ties for argmax)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, seeds
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
KB = kernelbench()

# file -> the variants whose defaults run: L2 norm (rows + split, 8.6 GB in and out), argmax (cols, int64)
# and rmsnorm over dim 1 (cols with the normalize pass, 7.5 GB in and out)
KB_FILES = {"39_L2Norm_.py": ["rows", "split"], "51_Argmax_over_a_dimension.py": ["cols"], "36_RMSNorm_.py": ["cols"]}

FILE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {forward}


def get_inputs():
    return [{make}]


def get_init_inputs():
    return []
"""
ODD = {
    # ties everywhere: the first index must win across threads and across the block's partials
    "argmax_ties_cols": ("torch.argmax(x, dim=1)", "torch.randint(1, 5, (7, 3001, 5)).float()", ["cols"]),
    "argmin_ties_rows": ("torch.argmin(x, dim=-1)", "torch.randint(1, 5, (301, 3001)).float()", ["rows"]),
    "frobenius_odd": ("x / torch.norm(x, p='fro')", "torch.randn(3, 37, 1001)", ["split"]),
    "mean_rows_odd": ("torch.mean(x, dim=-1, keepdim=True)", "torch.randn(1023, 999)", ["rows"]),
}


def _check(pool, source: str, variants: list[str]) -> None:
    ref = ProblemRef(source=source)
    cands = seeds(ref)
    assert [variant_of_spec(c.spec) for c in cands] == variants
    assert_all_pass(pool, ref, cands)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", sorted(KB_FILES))
def test_default_kernels_pass_on_kernelbench_at_its_size(pool, name):
    _check(pool, str(KB / "level1" / name), KB_FILES[name])


@pytest.mark.parametrize("name", sorted(ODD))
def test_default_kernels_pass_at_odd_shapes(pool, tmp_path, name):
    forward, make, variants = ODD[name]
    f = tmp_path / f"{name}.py"
    f.write_text(textwrap.dedent(FILE).format(forward=forward, make=make))
    _check(pool, str(f), variants)
