"""GPU tier: positive controls. Correct kernels must pass (verdict ok, with a timing); without
these, a harness that rejects everything would pass every cheat test.

Covers: a naive 3-pass softmax, a float4 GELU (buffers must stay 16-byte aligned), GELU with a
``__constant__`` table (read-only memory is not a forbidden global), a tiled fp32 FFMA matmul,
LayerNorm with parameters, RMSNorm in bf16 (``<cuda_bf16.h>``), a multi-launch plan with scratch
buffers and a memset step, a cooperative launch whose grid-wide barrier makes blocks read each
other's writes, split-K matmul adding atomically into an output zeroed by a memset
(not bitwise deterministic, still correct), and every tunable value giving the same right answer.
"""

from __future__ import annotations

import pytest

from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import Verdict
from tests.kernels.gpu import OPTIONS, Batches, describe
from tests.kernels.specs import CASES

pytestmark = pytest.mark.gpu

CORRECT = [
    "gelu_ok", "gelu_vec4", "gelu_constant_table", "softmax_ok", "softmax_multi_launch",
    "matmul_tiled", "matmul_splitk_atomic", "layernorm_ok", "rmsnorm_bf16", "gelu_grid_barrier",
    "gelu_marks_scratch",  # correct while scratch is fresh on every run (the harness poisons it)
]  # fmt: skip
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}


@pytest.fixture(scope="module")
def pool():
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(devices=None, timeout_s=30.0) as p:
        yield p


@pytest.fixture(scope="module")
def results(pool) -> Batches:
    return Batches(pool, CORRECT)


def _assert_timed_ok(r) -> None:
    assert r.verdict is Verdict.ok, describe(r)
    assert r.check is not None and r.check.failed is None and len(r.check.seeds) >= 3, describe(r)
    t = r.timing
    assert t is not None, describe(r)
    assert t.median_ms > 0 and t.min_ms > 0 and t.reps >= 10, t
    assert t.min_ms <= t.q25_ms <= t.median_ms <= t.q75_ms <= t.max_ms, t
    assert t.spread >= 0 and t.iqr_ms >= 0 and len(t.samples_ms) == t.reps, t
    assert t.l2_flushed, t
    assert r.ms == t.median_ms


@pytest.mark.parametrize("name", CORRECT)
def test_correct_kernel_passes_and_is_timed(results, name):
    r = results[name]
    _assert_timed_ok(r)
    assert r.compile is not None and r.compile.arch.startswith("sm_")
    dtype = "bfloat16" if name.startswith("rmsnorm") else "float32"
    assert r.check.atol == pytest.approx(TOLERANCE[dtype]) and r.check.rtol == pytest.approx(TOLERANCE[dtype])
    assert r.config == CASES[name].spec.default_config()


@pytest.mark.parametrize("name", ["softmax_ok", "matmul_tiled", "gelu_vec4", "softmax_multi_launch"])
def test_every_tunable_value_gives_the_right_answer(pool, name):
    """Tunables enter as -D macros and the plan's expressions alike (softmax traps if they
    disagree): every configuration must be correct, and be reported with its own config."""
    spec = CASES[name].spec
    configs = spec.configs()
    assert len(configs) >= 2
    out = pool.evaluate(CASES[name].problem, [Candidate(spec=spec, config=c) for c in configs], OPTIONS)
    for config, r in zip(configs, out):
        _assert_timed_ok(r)
        assert r.config == config, describe(r)
        for key, value in config.items():
            assert f"-D{key}={value}" in r.compile.options, r.compile.options
