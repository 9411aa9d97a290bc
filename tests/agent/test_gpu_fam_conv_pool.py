"""GPU tier of conv_relu_maxpool's tensor-core variants (issue 34): ``wgmma_pool`` (sm_90 only) and ``tf32x3_pool``
pass the harness's full check (fresh inputs, 3 seeds, fp32 at atol/rtol 1e-4 and relative error 1e-5, outputs and
scratch poisoned) at the suite's size and at the VGG-style model's two pool regions' sizes (problems/models/vgg_stack.py:
64 -> 64 channels at 16 x 112 x 112, 128 -> 128 at 16 x 56 x 56), each at its offered default configuration."""

from __future__ import annotations

import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass

pytestmark = pytest.mark.gpu

REGION = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d({c}, {oc}, 3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


def get_inputs():
    return [torch.randn(16, {c}, {hw}, {hw})]


def get_init_inputs():
    return []
'''
VGG_REGIONS = {"vgg_r1": (64, 64, 112), "vgg_r3": (128, 128, 56)}


def _variants() -> tuple[str, ...]:
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    return ("wgmma_pool", "tf32x3_pool") if hopper else ("tf32x3_pool",)


def _new_variants(ref: ProblemRef) -> list[Candidate]:
    prop = PlaybookProposer(load_problem(ref))
    assert prop.match is not None and prop.match.family == "conv_relu_maxpool", prop.reason
    got = {v.variant: v.spec for v in prop.offer.offered}
    missing = [v for v in _variants() if v not in got]
    assert not missing, f"not offered: {missing}: {[prop.offer.why_not(v) for v in missing]}"
    return [Candidate(spec=got[v]) for v in _variants()]


def test_the_suite_size(pool):
    ref = ProblemRef(source="conv_relu_maxpool")
    assert_all_pass(pool, ref, _new_variants(ref), seeds_n=3)


@pytest.mark.parametrize("name", sorted(VGG_REGIONS))
def test_the_vgg_models_pool_regions(pool, tmp_path, name):
    c, oc, hw = VGG_REGIONS[name]
    path = tmp_path / f"{name}.py"
    path.write_text(REGION.format(c=c, oc=oc, hw=hw))
    ref = ProblemRef(source=str(path))
    assert_all_pass(pool, ref, _new_variants(ref), seeds_n=3)
