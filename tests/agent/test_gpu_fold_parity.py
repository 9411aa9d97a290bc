"""GPU tier of issue 40's fold (the built-in conv2d and matmul families' kernels are conv_epi's and the gemm family's):
the tiled GEMM's store and load paths pass the harness's full checks at aligned, unaligned and edge shapes, and
conv2d_wide's direct and implicit-GEMM kernels at the suite's size (scripts/device/i40q.sh times them against main's)."""

from __future__ import annotations

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import assert_all_pass

pytestmark = pytest.mark.gpu

SMALL = {"BM": 32, "BN": 32, "TM": 4, "TN": 4}
TILED = [  # (M, N, K), configs: the paths of tests/agent/test_fold_parity.py at sizes where many blocks run at once
    ((2048, 2048, 1024), [{}, {"CP_ASYNC": 0}, {"BM": 128}]),  # whole tiles: float4 stores, cp.async or registers
    ((1000, 1000, 1000), [{}, SMALL]),  # predicated edges, float4 stores of whole quads
    ((1001, 998, 999), [{}, SMALL]),  # rows of A unaligned (element loads), C's too (one float at a time)
]


@pytest.fixture(scope="module")
def pool():
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(timeout_s=300) as p:
        yield p


def _offered(ref: ProblemRef, variant: str):
    prop = PlaybookProposer(load_problem(ref))
    offered = prop.offer.get(variant) if prop.offer is not None else None
    assert offered is not None, prop.reason
    return offered.spec


@pytest.mark.parametrize("shape, configs", TILED, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else "")
def test_the_tiled_matmul_passes_at_aligned_unaligned_and_edge_shapes(pool, shape, configs):
    ref = ProblemRef(source="matmul", shape=shape)
    spec = _offered(ref, "tiled")
    assert_all_pass(pool, ref, [Candidate(spec=spec, config=c) for c in configs], seeds_n=2)


def test_conv2d_wide_direct_and_igemm_pass_at_the_suite_size(pool):
    ref = ProblemRef(source="conv2d_wide")
    assert_all_pass(pool, ref, [Candidate(spec=_offered(ref, v)) for v in ("direct", "igemm")], seeds_n=2)
