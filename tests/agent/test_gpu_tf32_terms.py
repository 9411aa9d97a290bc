"""GPU tier of plain TF32 from the playbook (issue 33, item 5; CPU tier: test_tf32_terms.py): the kernel the playbook
offers at ``--precision tf32`` (TERMS 1 by default) passes the harness's full check there and is rejected at the
default precision (true fp32), while the same spec at TERMS 3 still passes the default check; for the mma.sync
``tf32x3`` matmul everywhere, for the Hopper ``wgmma`` matmul and a conv_epi KernelBench file on sm_90 (their
``tf32_terms`` sources pick the planes by TERMS at compile time)."""

from __future__ import annotations

import pytest
import torch

from kerngen.agent.playbook.proposer import PlaybookProposer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import CheckFailure, Verdict
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

CHECK = EvalOptions(seeds=3, bench=False, timeout_s=60)
MATMUL = dict(source="matmul", shape=(2048, 1024, 2048))  # K 2048: TF32's rounding shows
CONV_EPI = kernelbench("level2", "1_Conv2D_ReLU_BiasAdd.py")


def _hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def _offered(ref: ProblemRef, variant: str):
    prop = PlaybookProposer(load_problem(ref))
    vo = prop.offer.get(variant) if prop.offer is not None else None
    assert vo is not None, prop.reason
    return vo.spec


def _plain_passes_tf32_only(pool, tf32: ProblemRef, fp32: ProblemRef, variant: str) -> None:
    spec = _offered(tf32, variant)
    assert spec.defaults["TERMS"] == 1 and spec.tunables["TERMS"] == [1, 3]
    (ok,) = pool.evaluate(tf32, [Candidate(spec=spec)], CHECK)
    assert ok.verdict is Verdict.ok, f"{variant} TERMS 1 at tf32: {ok.verdict.value}: {ok.message}"
    plain, split = pool.evaluate(fp32, [Candidate(spec=spec), Candidate(spec=spec, config={"TERMS": 3})], CHECK)
    assert plain.verdict is Verdict.incorrect and plain.check is not None, f"{plain.verdict.value}: {plain.message}"
    # precision_loss where every element is within atol/rtol, mismatch where some are not: rejected either way
    assert plain.check.failed in (CheckFailure.precision_loss, CheckFailure.mismatch), plain.check.failed
    assert split.verdict is Verdict.ok, f"{variant} TERMS 3 at the default: {split.verdict.value}: {split.message}"
    print(f"\n{tf32.label()} {variant}: TERMS 1 passes at tf32 (rel err {ok.check.rel_err:.3g}); at true fp32 "
          f"rejected ({plain.check.failed.value}: {plain.message}); TERMS 3 passes there (rel err "
          f"{split.check.rel_err:.3g})")


@pytest.mark.parametrize("variant", ["tf32x3", "wgmma"])
def test_plain_tf32_matmul_passes_at_tf32_and_is_rejected_at_the_default(pool, variant):
    if variant == "wgmma" and not _hopper():
        pytest.skip("wgmma needs sm_90")
    _plain_passes_tf32_only(pool, ProblemRef(**MATMUL, precision="tf32"), ProblemRef(**MATMUL), variant)


@pytest.mark.skipif(not CONV_EPI.is_file(), reason="no KernelBench files")
def test_plain_tf32_wgmma_conv_epi_passes_at_tf32_and_is_rejected_at_the_default(pool):
    if not _hopper():
        pytest.skip("wgmma needs sm_90")
    _plain_passes_tf32_only(pool, ProblemRef(source=str(CONV_EPI), precision="tf32"), ProblemRef(source=str(CONV_EPI)),
                            "wgmma")
