"""GPU tier of the gemm family's 3xTF32 variant (#19): its round-0 kernels pass the harness's full
checks (atol/rtol 1e-4, relative error 1e-5, fresh inputs) on KernelBench files at their own size
(nn.Linear + bias + epilogue, a batched product, a transposed B), and the time sits beside
PyTorch's eager and torch.compile, measured in the same worker (printed with -s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import PlaybookProposer
from kerngen.agent.playbook.gemm.build_tf32 import VARIANT
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
FILES = ["level2/12_Gemm_Multiply_LeakyReLU.py", "level2/76_Gemm_Add_ReLU.py",
         "level1/3_Batched_matrix_multiplication.py", "level1/17_Matmul_with_transposed_B.py"]


def _round0_tf32(path: Path) -> list[Candidate]:
    prop = PlaybookProposer(load_problem(str(path)))
    cands = [Candidate(spec=b.spec) for e in prop._entries() if e.round0 and e.variant == VARIANT
             for b in prop._render(e, None, 2) if b.spec is not None]
    assert cands and all(variant_of_spec(c.spec) == VARIANT for c in cands), path.name
    return cands


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name", FILES)
def test_tf32x3_gemm_is_correct_at_the_files_own_size(pool, name):
    ref = ProblemRef(source=str(KB / name))
    base = pool.baseline(ref, budget_ms=150, with_compile=name.startswith("level2"))
    results = pool.evaluate(ref, _round0_tf32(KB / name), EvalOptions(seeds=3, budget_ms=150, timeout_s=600))
    bad = [f"{r.config}: {r.verdict.value} {r.message}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    best = min(r.timing.median_ms for r in results)
    comp = f", torch.compile {base.compiled.median_ms:.4f} ms ({base.compiled.median_ms / best:.2f}x)" if base.compiled else ""
    print(f"\n{name}: tf32x3 {best:.4f} ms; eager {base.eager.median_ms:.4f} ms ({base.eager.median_ms / best:.2f}x)"
          f"{comp}; rel err {max(r.check.rel_err for r in results):.2g}")
