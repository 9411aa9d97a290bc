"""GPU tier, item 12 of the brief: hangs and crashes never take the search down. A hang becomes
``timeout``, a trap / illegal address / misaligned access becomes ``runtime_error``; the worker is
restarted and the next job, in the same batch or the next call, still gives ``ok``.

The module's pool holds ONE GPU on purpose: every job after a failure then runs on the restarted
worker of that GPU (with several GPUs the next job could land on a healthy one and prove nothing).
The multi-GPU test builds its own pool over every visible GPU.
"""

from __future__ import annotations

import pytest

from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import Verdict
from tests.kernels.gpu import describe
from tests.kernels.specs import CASES, GELU, SOFTMAX

pytestmark = pytest.mark.gpu

HANG_TIMEOUT_S = 5.0
OPTIONS = EvalOptions(seeds=3, bench=True, budget_ms=20, timeout_s=HANG_TIMEOUT_S)
CRASHES = ["gelu_trap", "gelu_null_store", "gelu_far_store", "gelu_misaligned_store"]


@pytest.fixture(scope="module")
def pool():
    from kerngen.harness.pool.local import WorkerPool, visible_devices

    with WorkerPool(devices=visible_devices()[:1], timeout_s=30.0) as p:
        yield p


def _run(pool, names, on_result=None):
    return pool.evaluate(GELU, [Candidate(spec=CASES[n].spec) for n in names], OPTIONS, on_result)


def test_hang_times_out_and_the_next_job_runs(pool):
    hang, ok = _run(pool, ["gelu_hang", "gelu_ok"])
    assert hang.verdict is Verdict.timeout, describe(hang)
    assert "timeout" in hang.message, describe(hang)
    assert HANG_TIMEOUT_S * 0.9 <= hang.wall_s < HANG_TIMEOUT_S + 60, describe(hang)
    assert hang.timing is None
    assert ok.verdict is Verdict.ok, describe(ok)
    # and the pool still serves a later call
    (again,) = _run(pool, ["gelu_ok"])
    assert again.verdict is Verdict.ok, describe(again)


@pytest.mark.parametrize("name", CRASHES)
def test_crash_is_runtime_error_and_the_next_job_runs(pool, name):
    crash, ok = _run(pool, [name, "gelu_ok"])
    assert crash.verdict is Verdict.runtime_error, describe(crash)
    assert crash.message, describe(crash)
    assert crash.timing is None
    assert ok.verdict is Verdict.ok, describe(ok)
    assert ok.worker == crash.worker == 0  # the same (restarted) worker


def test_oversized_cooperative_grid_is_refused_not_shrunk(pool):
    """cupy shrinks a cooperative grid that cannot be resident at once (with only a warning), and
    this kernel's grid-stride loops would still pass on the smaller grid: the harness must refuse
    the plan rather than run another one."""
    big, ok = _run(pool, ["gelu_grid_too_large", "gelu_ok"])
    assert big.verdict is Verdict.runtime_error, describe(big)
    assert "resident at once" in big.message and "1048576 blocks" in big.message, describe(big)
    assert big.timing is None
    assert ok.verdict is Verdict.ok, describe(ok)


@pytest.mark.timeout(240)
def test_mixed_batch_keeps_order_and_reports_every_result(pool):
    """A hang right after a crash runs on a freshly started worker: the candidate's timeout must
    still be HANG_TIMEOUT_S, not that plus the worker's start-up allowance."""
    names = ["gelu_ok", "gelu_trap", "gelu_hang", "gelu_ok", "gelu_writes_nothing", "gelu_call_counter", "gelu_ok"]
    landed: dict[int, Verdict] = {}
    results = _run(pool, names, on_result=lambda i, r: landed.__setitem__(i, r.verdict))
    expected = [Verdict.ok, Verdict.runtime_error, Verdict.timeout, Verdict.ok, Verdict.incorrect,
                Verdict.compile_error, Verdict.ok]
    assert [r.verdict for r in results] == expected, "\n\n".join(describe(r) for r in results)
    assert landed == dict(enumerate(expected)), "on_result must be called once per candidate"
    assert results[2].wall_s < HANG_TIMEOUT_S + 60, describe(results[2])


@pytest.mark.multigpu
def test_work_spreads_over_gpus():
    from kerngen.harness.pool.local import WorkerPool

    spec = CASES["softmax_ok"].spec
    blocks = [32, 64, 128, 256, 512, 1024, 128, 256]
    with WorkerPool(devices=None, timeout_s=30.0) as multi:
        assert len(multi.devices) >= 2
        results = multi.evaluate(SOFTMAX, [Candidate(spec=spec, config={"BLOCK": b}) for b in blocks],
                                 EvalOptions(seeds=3, bench=True, budget_ms=20, timeout_s=20))
    assert all(r.verdict is Verdict.ok for r in results), "\n\n".join(describe(r) for r in results)
    assert [r.config["BLOCK"] for r in results] == blocks  # in the order of the candidates
    assert len({r.worker for r in results}) >= 2, [r.worker for r in results]
    assert all(r.gpu for r in results)
