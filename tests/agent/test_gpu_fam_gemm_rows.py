"""GPU tier of the playbook's ``gemm_rows`` family: every offered variant at its default configuration (the tiled
GEMM into a scratch buffer, then the row kernel) passes the harness's full checks on two KernelBench files at
their own size (GroupNorm + Hardtanh after a Linear; mean, logsumexp, GELU and the residual input after one) and
on copies at odd shapes (softmax over 777 columns; a max pool that drops the last column, then a sum)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, offered, resized_copy
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench("level2")
OWN_SIZE = [KB / "30_Gemm_GroupNorm_Hardtanh.py",  # 1024 x 8192 @ 8192^2, GroupNorm(16): staged and streamed
            KB / "51_Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd.py"]  # 2048 x 8192, + original_x
ODD = [  # (file, its size constants at an odd shape)
    (KB / "99_Matmul_GELU_Softmax.py", dict(batch_size=333, in_features=1001, out_features=777)),
    (KB / "55_Matmul_MaxPool_Sum_Scale.py", dict(batch_size=77, in_features=999, out_features=3001)),
]


def _check(pool, path: Path) -> None:
    ref = ProblemRef(source=str(path))
    assert_all_pass(pool, ref, offered(ref, "gemm_rows"), seeds_n=2)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("path", OWN_SIZE, ids=lambda p: p.stem)
def test_offered_kernels_pass_at_the_files_own_size(pool, path):
    _check(pool, path)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("src, sizes", ODD,
                         ids=lambda v: v.stem if isinstance(v, Path) else "x".join(map(str, v.values())))
def test_offered_kernels_pass_at_an_odd_shape(pool, tmp_path, src, sizes):
    _check(pool, resized_copy(src, tmp_path, **sizes))
