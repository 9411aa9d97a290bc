"""Pruning before any GPU time: each kind, with its reason (fake GPU facts, fake ptxas reports)."""

from __future__ import annotations

import pytest

from kerngen.harness.spec.plan import resolve
from kerngen.harness.tune.prune import regs_per_block, resource_reason, static_prune, static_reason, summarize
from kerngen.harness.results import GpuFacts
from kerngen.harness.tune.tuner import tune

from tests.fakes.tuning import GPU, PROBLEM, SIZES, TENSORS, FakeEvaluator, FakeProbe, fake_info, make_spec


def _reason(spec, cfg, gpu=GPU):
    plan, kind, reason = static_reason(spec, cfg, sizes=SIZES, tensors=TENSORS, gpu=gpu)
    return kind, reason


def test_constraint_violation():
    spec = make_spec(constraints=["BLOCK * TILE <= 512"])
    kind, reason = _reason(spec, {"BLOCK": 512, "TILE": 2, "VEC": 1})
    assert kind == "constraint" and "BLOCK * TILE <= 512" in reason
    assert _reason(spec, {"BLOCK": 256, "TILE": 2, "VEC": 1}) == ("", "")


def test_constraint_over_problem_sizes():
    spec = make_spec(constraints=["N % (BLOCK * VEC) == 0"], grid="cdiv(N, BLOCK)")
    sizes = {"N": 3 * 256}
    plan, kind, reason = static_reason(spec, {"BLOCK": 256, "TILE": 1, "VEC": 2}, sizes=sizes, tensors=TENSORS, gpu=GPU)
    assert kind == "constraint" and "N % (BLOCK * VEC) == 0" in reason


def test_plan_that_does_not_resolve():
    spec = make_spec(grid="N // (BLOCK * TILE * 100000)")  # grid 0 for big blocks
    kind, reason = _reason(spec, {"BLOCK": 512, "TILE": 4, "VEC": 1})
    assert kind == "plan" and "grid" in reason and "<= 0" in reason
    spec = make_spec(grid="cdiv(N, BLOCK) + missing_name")
    kind, reason = _reason(spec, {"BLOCK": 64, "TILE": 1, "VEC": 1})
    assert kind == "plan" and "missing_name" in reason


def test_threads_over_the_gpu_limit():
    small = GPU.model_copy(update={"max_threads_per_block": 256})
    kind, reason = _reason(make_spec(), {"BLOCK": 512, "TILE": 1, "VEC": 1}, small)
    assert kind == "threads" and "512 threads per block > 256" in reason


def test_dynamic_shared_memory_over_the_optin_limit():
    spec = make_spec(shared="BLOCK * TILE * 256")
    kind, reason = _reason(spec, {"BLOCK": 512, "TILE": 4, "VEC": 1})  # 512 KiB
    assert kind == "shared_mem" and "dynamic shared memory" in reason and str(GPU.max_shared_per_block_optin) in reason
    assert _reason(spec, {"BLOCK": 64, "TILE": 1, "VEC": 1}) == ("", "")


def test_static_prune_splits_and_counts():
    spec = make_spec(constraints=["TILE * VEC <= 16"], shared="BLOCK * TILE * 128")
    survivors, pruned = static_prune(spec, spec.configs(), sizes=SIZES, tensors=TENSORS, gpu=GPU)
    assert len(survivors) + len(pruned) == spec.space_size()
    counts = summarize(pruned)
    assert counts["constraint"] == 4  # TILE=4, VEC=8 for each of the 4 BLOCKs
    assert "shared_mem" in counts
    assert all(p.reason for p in pruned)
    for cfg, plan in survivors:
        assert plan.config == cfg


def test_registers_that_cannot_fit():
    spec = make_spec()
    plan = resolve(spec, sizes=SIZES, tensors=TENSORS, config={"BLOCK": 512, "TILE": 1, "VEC": 1})
    assert resource_reason(plan, fake_info(registers=128), GPU) == ("", "")  # 128 x 512 = 65536 fits
    kind, reason = resource_reason(plan, fake_info(registers=129), GPU)
    assert kind == "registers" and "129 registers x 512 threads" in reason and "65536" in reason
    assert resource_reason(plan, fake_info(registers=64), GPU) == ("", "")


def test_register_allocation_granularity():
    assert regs_per_block(32, 1024) == 32 * 1024
    assert regs_per_block(33, 32) == 1280  # 33 * 32 = 1056 -> rounded up to 5 * 256
    assert regs_per_block(1, 1) == 256
    assert regs_per_block(64, 1024) == 65536


def test_static_plus_dynamic_shared_memory_after_compile():
    spec = make_spec(shared="BLOCK * 128")
    plan = resolve(spec, sizes=SIZES, tensors=TENSORS, config={"BLOCK": 1024 // 2, "TILE": 1, "VEC": 1})  # 64 KiB
    gpu = GPU
    kind, reason = resource_reason(plan, fake_info(shared_bytes=gpu.max_shared_per_block_optin - 1000), gpu)
    assert kind == "shared_mem" and "static" in reason and "dynamic" in reason
    assert resource_reason(plan, fake_info(shared_bytes=1024), gpu) == ("", "")


def test_unknown_kernel_in_report_is_not_judged():
    plan = resolve(make_spec(), sizes=SIZES, tensors=TENSORS, config={"BLOCK": 512, "TILE": 1, "VEC": 1})
    assert resource_reason(plan, fake_info(registers=255, kernel="other"), GPU) == ("", "")


def test_tune_prunes_each_kind_and_never_evaluates_pruned_configs():
    """Constraint, plan, threads and shared memory statically; registers after compiling; a
    compile error is a failed evaluation that never reaches the GPU."""
    spec = make_spec(constraints=["TILE * VEC <= 16"], shared="BLOCK * TILE * 96",
                     grid="N // (BLOCK * TILE * VEC * 1000)")
    gpu = GPU.model_copy(update={"max_threads_per_block": 256, "regs_per_block": 32768})
    probe = FakeProbe(regs=lambda c: 200 if c["BLOCK"] == 256 else 32, bad=lambda c: c == {"BLOCK": 64, "TILE": 1, "VEC": 1})
    ev = FakeEvaluator(fail_share=0.0)
    res = tune(ev, PROBLEM, spec, sizes=SIZES, tensors=TENSORS, gpu=gpu, strategy="exhaustive", max_evals=1000,
               probe=probe, nvrtc="13.0")
    counts = res.pruned_counts()
    assert set(counts) == {"constraint", "plan", "threads", "registers"}, counts
    assert sum(counts.values()) == len(res.pruned)
    examples = res.pruned_examples()
    assert "registers" in examples["registers"] and "threads per block" in examples["threads"]
    pruned_ids = {tuple(sorted(p.config.items())) for p in res.pruned}
    called = {tuple(sorted(c.items())) for c in ev.calls}
    assert not pruned_ids & called
    assert all(c["BLOCK"] <= 128 for c in ev.calls)
    compile_failed = [t for t in res.evaluated if t.result and t.result.verdict.value == "compile_error"]
    assert [t.config for t in compile_failed] == [{"BLOCK": 64, "TILE": 1, "VEC": 1}]
    assert {"BLOCK": 64, "TILE": 1, "VEC": 1} not in ev.calls
    assert "oops" in compile_failed[0].result.message
    assert len(res.evaluated) + len(res.pruned) == spec.space_size()
    assert res.best is not None and res.best.ok


def test_shared_memory_pruned_statically_in_tune():
    spec = make_spec(shared="BLOCK * TILE * VEC * 512")
    res = tune(FakeEvaluator(fail_share=0.0), PROBLEM, spec, sizes=SIZES, tensors=TENSORS, gpu=GPU,
               strategy="exhaustive", max_evals=1000, probe=None, nvrtc="13.0")
    assert res.pruned_counts().get("shared_mem", 0) > 0
    assert res.feasible == spec.space_size() - len(res.pruned)


def test_everything_pruned_gives_no_best():
    spec = make_spec(constraints=["BLOCK > 100000"])
    ev = FakeEvaluator()
    res = tune(ev, PROBLEM, spec, sizes=SIZES, tensors=TENSORS, gpu=GPU, probe=None, nvrtc="13.0")
    assert res.best is None and res.best_config is None and not ev.calls
    assert res.pruned_counts() == {"constraint": spec.space_size()}


@pytest.mark.parametrize("bad", [GpuFacts(name="tiny", regs_per_block=8192)])
def test_registers_prune_against_gpu_facts(bad):
    plan = resolve(make_spec(), sizes=SIZES, tensors=TENSORS, config={"BLOCK": 512, "TILE": 1, "VEC": 1})
    kind, reason = resource_reason(plan, fake_info(registers=32), bad)
    assert kind == "registers" and "8192" in reason
