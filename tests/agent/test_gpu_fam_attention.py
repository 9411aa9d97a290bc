"""GPU tier of the attention family (issue #17): its kernels pass the harness's full checks on the suite's
problem (causal bf16, (8, 16, 4096, 128)), on KernelBench 97 at its own size (fp32, head dim 1024: the FFMA
kernel), and at odd sequence lengths (not a multiple of any tile: predicated loads, masked scores, predicated
stores), causal and not, bf16 and fp16, head dims 64 and 128, Sq != Sk; the tensor-core kernel also at a spread
of configurations (every tunable moved once), so that each code path runs on a GPU at least once. The Hopper
kernel (wgmma, TMA; offered beside fa2 wherever fa2 is) runs in every test above that takes the offered kernels,
and at its own spread of configurations on sm_90 GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered, resized_copy, seeds
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB97 = kernelbench("level1", "97_ScaledDotProductAttention.py")
SUITE = ProblemRef(source="attention")  # causal bf16 (8, 16, 4096, 128)

SDPA = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal={causal})


def get_inputs():
    return [torch.randn({q}, dtype=torch.{dtype}), torch.randn({k}, dtype=torch.{dtype}),
            torch.randn({k}, dtype=torch.{dtype})]


def get_init_inputs():
    return []
'''
ODD = {  # name -> (q shape, k/v shape, dtype, causal)
    "bf16_d64_causal_1000": ((2, 8, 1000, 64), (2, 8, 1000, 64), "bfloat16", True),
    "bf16_d64_1000": ((2, 8, 1000, 64), (2, 8, 1000, 64), "bfloat16", False),
    "fp16_d128_causal_1000": ((2, 8, 1000, 128), (2, 8, 1000, 128), "float16", True),
    "bf16_d128_777x1000": ((2, 8, 777, 128), (2, 8, 1000, 128), "bfloat16", False),
    "fp32_d64_causal_1000": ((2, 4, 1000, 64), (2, 4, 1000, 64), "float32", True),
}
FA2_CONFIGS = {  # per head dim: every tunable moved once from the defaults, each admissible (sm_80 limits)
    64: [{"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 32, "STAGES": 3, "SWIZZLE": 0}, {"BLOCK_M": 64, "BLOCK_N": 128},
         {"WARPS": 8, "BLOCK_N": 128, "STAGES": 3}, {"SWIZZLE": 0, "STAGES": 4}, {"QSMEM": 1, "BLOCK_N": 32},
         {"BLOCK_M": 256, "WARPS": 8, "QSMEM": 1, "STAGES": 3, "PINGPONG": 1, "BLOCK_N": 32}],
    128: [{"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 32, "STAGES": 3, "SWIZZLE": 0, "QSMEM": 0},
          {"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 128, "QSMEM": 0}, {"WARPS": 8, "BLOCK_N": 128, "QSMEM": 0},
          {"SWIZZLE": 0, "STAGES": 3}, {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 32, "QSMEM": 1},
          {"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1}],
}


def _file(folder: Path, name: str) -> ProblemRef:
    q, k, dtype, causal = ODD[name]
    path = folder / f"{name}.py"
    path.write_text(SDPA.format(q=q, k=k, dtype=dtype, causal=causal))
    return ProblemRef(source=str(path))


def test_suite_problem_kernels_pass_at_its_own_size(pool):
    assert_all_pass(pool, SUITE, offered(SUITE, "attention") + seeds(SUITE), seeds_n=2)


@pytest.mark.needs_kernelbench
def test_kernelbench_97_passes_at_its_own_size(pool):
    ref = ProblemRef(source=str(KB97))
    assert_all_pass(pool, ref, offered(ref, "attention") + seeds(ref), seeds_n=2)


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_sequence_lengths_pass(pool, tmp_path, name):
    ref = _file(tmp_path, name)
    assert_all_pass(pool, ref, offered(ref, "attention") + seeds(ref), seeds_n=2)


@pytest.mark.parametrize("name", ["bf16_d64_causal_1000", "fp16_d128_causal_1000", "bf16_d128_777x1000"])
def test_the_tensor_core_kernel_passes_at_a_spread_of_configurations(pool, tmp_path, name):
    ref = _file(tmp_path, name)
    prop = PlaybookProposer(load_problem(ref))
    spec = prop.offer.get("fa2").spec
    cands = [Candidate(spec=spec, config=c) for c in FA2_CONFIGS[ODD[name][0][-1]]]
    assert_all_pass(pool, ref, cands, seeds_n=2)


WGMMA_CONFIGS = {  # per head dim: every tunable moved once from the defaults (64: 3 consumers on 128 keys, 3
    # stages; 128: 2 consumers in turns on 128 keys, 3 stages)
    64: [{"CWG": 2, "PINGPONG": 1, "STAGES": 2}, {"CWG": 1, "BLOCK_N": 64, "STAGES": 4},
         {"CWG": 2, "BLOCK_N": 192}, {"CWG": 2, "PINGPONG": 1, "BLOCK_N": 112}, {"BLOCK_N": 96, "STAGES": 2}],
    128: [{"CWG": 1, "BLOCK_N": 192, "STAGES": 2, "PINGPONG": 0}, {"CWG": 3, "BLOCK_N": 64, "PINGPONG": 0},
          {"BLOCK_N": 176, "STAGES": 2}, {"PINGPONG": 0, "BLOCK_N": 96}, {"BLOCK_N": 144, "STAGES": 2}],
}


@pytest.mark.parametrize("name", ["bf16_d64_causal_1000", "fp16_d128_causal_1000", "bf16_d128_777x1000"])
def test_the_hopper_kernel_passes_at_a_spread_of_configurations(pool, tmp_path, name):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma and TMA kernels are compiled for sm_90a: an H100 or H200")
    ref = _file(tmp_path, name)
    spec = PlaybookProposer(load_problem(ref)).offer.get("wgmma").spec
    cands = [Candidate(spec=spec, config=c) for c in WGMMA_CONFIGS[ODD[name][0][-1]]]
    assert_all_pass(pool, ref, cands, seeds_n=2)


@pytest.mark.needs_kernelbench
def test_the_fp32_kernel_passes_at_an_odd_shape_of_kernelbench_97(pool, tmp_path):
    ref = ProblemRef(source=str(resized_copy(KB97, tmp_path, batch_size=3, num_heads=5, sequence_length=333,
                                            embedding_dimension=512)))
    cands = offered(ref, "attention")
    cands += [Candidate(spec=cands[0].spec, config={"WARPS": 4, "BLOCK_N": 32})]
    assert_all_pass(pool, ref, cands, seeds_n=2)
