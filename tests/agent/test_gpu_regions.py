"""GPU tier of the partitioner's multi-region specs: every variant the ``regions`` family offers for a KernelBench
file that no one family takes whole (each region's kernel in order, intermediates in scratch buffers) passes the
harness's full checks at the file's own size: two convolutions in a row (level 1's 86), two GEMMs (level 2's 45),
a 3-D convolution followed by a group norm and a mean, a transposed 3-D convolution followed by a layer norm, a
3-D convolution followed by softmax (decomposed into reductions) and two max pools, a transposed 2-D convolution
followed by channel min and sum reductions and a broadcast add."""

from __future__ import annotations

import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
FILES = [
    "level1/86_conv_depthwise_separable_2D.py",
    "level2/45_Gemm_Sigmoid_LogSumExp.py",
    "level2/23_Conv3d_GroupNorm_Mean.py",
    "level2/6_Conv3d_Softmax_MaxPool_MaxPool.py",
    "level2/36_ConvTranspose2d_Min_Sum_GELU_Add.py",
]


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", FILES, ids=lambda n: n.split("/")[1].split("_")[0] + "_" + n.split("/")[0][-1])
def test_every_regions_variant_passes_at_the_files_own_size(pool, name):
    ref = ProblemRef(source=str(KB / name))
    assert_all_pass(pool, ref, offered(ref, "regions"), seeds_n=2)


# every variant of a strided transposed 3-D convolution at its size took over 250 s together on an H200
# (2026-11-28): one test per variant (4 offered), each with its own limit, so that a device call can take them apart
SLOW = "level2/34_ConvTranspose3d_LayerNorm_GELU_Scaling.py"


@pytest.mark.needs_kernelbench
@pytest.mark.timeout(400)
@pytest.mark.parametrize("variant", range(4), ids=lambda i: f"34_2-v{i}")
def test_each_regions_variant_of_a_slow_file_passes_at_its_own_size(pool, variant):
    ref = ProblemRef(source=str(KB / SLOW))
    cands = offered(ref, "regions")
    assert len(cands) == 4, [c.spec.name for c in cands]  # the ids above count them
    assert_all_pass(pool, ref, [cands[variant]], seeds_n=2)

