"""Static pruning memoized over a tuning space (harness/tune/prune.py :class:`Memo`, issue 37's
faster ``kerngen playbook DIR``) gives exactly what the unmemoized path gives: the same survivors
with the same plans, the same pruned configurations with the same kinds and reasons, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import limits_for
from kerngen.harness.tune.prune import Memo, PrunedConfig, enumerate_configs, static_prune, static_reason
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

ROOT = Path(__file__).resolve().parents[2]
GPU = limits_for("sm_90")


def _unmemoized(spec, configs, sizes, tensors):
    survivors, pruned = [], []
    for config in configs:
        cfg = dict(config)
        plan, kind, reason = static_reason(spec, cfg, sizes=sizes, tensors=tensors, gpu=GPU)
        if plan is None:
            pruned.append(PrunedConfig(config=cfg, kind=kind, reason=reason))
        else:
            survivors.append((cfg, plan))
    return survivors, pruned


def _same(spec: KernelSpec, ref: ProblemRef) -> tuple[int, int]:
    info = load_problem(ref).info
    sizes, tensors = info.sizes, info.tensor_facts()
    configs = enumerate_configs(spec, seed=0, limit=2000)
    got = static_prune(spec, configs, sizes=sizes, tensors=tensors, gpu=GPU)
    want = _unmemoized(spec, configs, sizes, tensors)
    assert [c for c, _ in got[0]] == [c for c, _ in want[0]]
    assert [p.model_dump() for _, p in got[0]] == [p.model_dump() for _, p in want[0]]
    assert [p.model_dump() for p in got[1]] == [p.model_dump() for p in want[1]]
    return len(got[0]), len(got[1])


@pytest.mark.parametrize("run,ref", [
    ("20261122-041828-matmul-b9c7", ProblemRef(source="matmul", shape=(1000, 2048, 777))),
    ("20261122-041828-matmul-b9c7", ProblemRef(source="matmul")),
    ("20261123-023704-layernorm-d003", ProblemRef(source="layernorm", shape=(16, 64, 32, 32))),
    ("20261123-020550-rmsnorm-1d34", ProblemRef(source="rmsnorm")),
])
def test_the_memo_changes_nothing_on_shipped_specs(run, ref):
    spec = KernelSpec.load(ROOT / "runs" / run / "best" / "spec.json")
    survivors, pruned = _same(spec, ref)
    assert survivors + pruned > 0


def test_the_memo_changes_nothing_where_constraints_fail_or_cannot_be_evaluated():
    spec = KernelSpec.model_validate({
        "source": 'extern "C" __global__ void k(float* out) {}',
        "tunables": {"A": [0, 1, 2, 4], "B": [1, 2, 3], "U": [1, 2, 4, 8], "S": [0, 1]},
        "constraints": ["x.shape[1] % (A * 2) == 0",  # A = 0: cannot be evaluated (a division by zero)
                        "B != 3", "A * B <= 4"],
        "defines": {"TILE": "A * 64"},
        "steps": [{"kernel": "k", "grid": ["cdiv(x.shape[0], B)"], "block": ["TILE"],
                   "shared_mem": "S * TILE * 4", "args": [{"name": "out"}]}],
    })
    survivors, pruned = _same(spec, ProblemRef(source="softmax", shape=(256, 512)))
    reasons = " | ".join(p.reason for p in _unmemoized(spec, spec.configs(), *_sizes())[1])
    assert survivors and pruned and "cannot be evaluated" in reasons and "constraint violated: B != 3" in reasons
    memo = Memo(spec, *_sizes())
    assert memo.plan_reads == ("A", "B", "S")  # U only the source reads: one plan for its four values


def _sizes():
    info = load_problem(ProblemRef(source="softmax", shape=(256, 512))).info
    return info.sizes, info.tensor_facts()
