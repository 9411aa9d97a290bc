"""GPU tier of the playbook's ``gemm`` family: its round-0 kernels (each offered variant at its default
configuration) pass the harness's full checks on two KernelBench files at their own size (an nn.Linear with a
fused epilogue, a matrix-vector product) and on copies of them at odd shapes (predicated edges, element loads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass, resized_copy
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
LINEAR = KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py"  # 1024 x 8192 @ (8192 x 8192)^T + b, leaky_relu(2 v)
GEMV = KB / "level1" / "4_Matrix_vector_multiplication_.py"  # 2048 x 1048576 @ 1048576 x 1
ODD = [  # (file, its size constants at an odd shape)
    (LINEAR, dict(batch_size=333, in_features=1001, out_features=777)),
    (GEMV, dict(M=999, K=100003)),
]


def _round0(path: Path) -> list[Candidate]:
    prop = PlaybookProposer(load_problem(str(path)))
    assert prop.match is not None and prop.match.family == "gemm", prop.reason
    cands = []
    for entry in prop._entries():
        if entry.round0:
            cands += [Candidate(spec=b.spec) for b in prop._render(entry, None, 1) if b.spec is not None]
    assert cands, f"the playbook rendered nothing for {path.name}"
    return cands


def _check(pool, path: Path) -> None:
    cands = _round0(path)
    assert_all_pass(pool, ProblemRef(source=str(path)), cands, seeds_n=2)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("path", [LINEAR, GEMV], ids=lambda p: p.stem)
def test_round0_kernels_pass_at_the_files_own_size(pool, path):
    _check(pool, path)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("src, sizes", ODD, ids=lambda v: v.stem if isinstance(v, Path) else "x".join(map(str, v.values())))
def test_round0_kernels_pass_at_an_odd_shape(pool, tmp_path, src, sizes):
    _check(pool, resized_copy(src, tmp_path, **sizes))
