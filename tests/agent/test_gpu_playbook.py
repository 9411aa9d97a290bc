"""GPU tier of the playbook: every family's kernels pass the harness's full checks on the suite's
problems (at shapes small enough for a quick run, and at the default shape for the cheap ones)."""

from __future__ import annotations

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

pytestmark = pytest.mark.gpu

CASES = [
    ProblemRef(source="softmax", shape=(256, 65536)),
    ProblemRef(source="softmax", shape=(1024, 1024)),
    ProblemRef(source="layernorm", shape=(4, 64, 64, 64)),
    ProblemRef(source="layernorm"),  # the suite shape: 16 rows of 16 MB (split and cooperative kernels)
    ProblemRef(source="layernorm", shape=(8, 32, 64, 64), dtype="bfloat16"),  # 16-bit vectors, fp32 statistics
    ProblemRef(source="rmsnorm", shape=(1024, 8192)),
    ProblemRef(source="rmsnorm", shape=(512, 4096), dtype="float32"),
    ProblemRef(source="gelu", shape=(4096, 4096)),
    ProblemRef(source="conv2d", shape=(8, 3, 224, 224)),
    ProblemRef(source="conv_relu_maxpool"),
    ProblemRef(source="matmul", shape=(1024, 1024, 1024)),
]


@pytest.fixture(scope="module")
def pool():
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(timeout_s=120) as p:
        yield p


def _every_variant(ref: ProblemRef) -> list[Candidate]:
    prop = PlaybookProposer(load_problem(ref))
    assert prop.match is not None, prop.reason
    cands = []
    for entry in prop._entries():
        for branch in prop._render(entry, None, 2):
            if branch.spec is not None:
                cands.append(Candidate(spec=branch.spec))
    return cands


@pytest.mark.parametrize("ref", CASES, ids=lambda r: r.label().replace(" ", "-"))
def test_playbook_kernels_pass_the_checks(pool, ref):
    cands = _every_variant(ref)
    assert cands, f"the playbook rendered nothing for {ref.label()}"
    results = pool.evaluate(ref, cands, EvalOptions(seeds=3, budget_ms=30, timeout_s=120))
    bad = [f"{c.spec.name} {r.config}: {r.verdict.value} {r.message}" for c, r in zip(cands, results) if not r.ok]
    assert not bad, "\n".join(bad)
