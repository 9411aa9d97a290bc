"""The memory plan of an evaluation (KernelBench at its own sizes), the chunked comparison it
relies on, and the check's lean paths (pristine inputs made again from their seed, references in
host memory) on CPU tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerngen.harness.gpu.check import CandidateFailed, ProblemState, _verify_untouched, verify_timed_outputs
from kerngen.agent.playbook import seed_specs
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.gpu.buffers import Poison
from kerngen.harness.gpu.compare import compare
from kerngen.harness.gpu.memory_plan import SMALL_BYTES, HarnessMemoryError, check_peak, plan_memory, timed_set_bytes
from kerngen.harness.results import CheckEvidence, CheckFailure, MemoryPlan
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.pool.local import WorkerPool
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.resources import kernelbench

DATA = Path(__file__).parents[1] / "data" / "kernelbench"
GB = 10**9
H100_FREE = 79 * GB  # what one 80 GB H100 has free for a worker after its CUDA context
PLAN = ResolvedPlan(config={}, defines={}, scratch=[], steps=[])


def _bytes(name: str) -> tuple[int, int]:
    info = load_problem(ProblemRef(source=str(DATA / name))).info  # meta tensors: no memory, no GPU
    return sum(t.nbytes for t in info.inputs), sum(t.nbytes for t in info.outputs)


def test_the_largest_kernelbench_files_fit_one_h100():
    # level 1's largest input (17.2 GB) and largest output (7.5 GB in, 7.5 GB out); level 2's largest
    pool_in, pool_out = _bytes("level1/45_Average_Pooling_2D.py")
    norm_in, norm_out = _bytes("level1/36_RMSNorm_.py")
    l2_in, l2_out = _bytes("level2/19_ConvTranspose2d_GELU_GroupNorm.py")
    assert pool_in == 16 * 64 * 2048 * 2048 * 4 and norm_in == norm_out == 112 * 64 * 512 * 512 * 4

    pool = plan_memory(free_bytes=H100_FREE, input_bytes=pool_in, output_bytes=pool_out)
    # a pristine copy of the 17 GB input fits, a second timed set beside it does not: one set, honest
    # still (every timed call's outputs are poisoned first, so a call that skips its work is caught)
    assert pool.pristine_on_gpu and pool.refs_on_gpu and pool.timed_sets == 1
    assert pool.check_peak_bytes == check_peak(pool_in, pool_out, 0, pristine_on_gpu=True, refs_on_gpu=True)

    norm = plan_memory(free_bytes=H100_FREE, input_bytes=norm_in, output_bytes=norm_out)
    assert (norm.pristine_on_gpu, norm.refs_on_gpu, norm.timed_sets) == (True, True, 1)

    small = plan_memory(free_bytes=H100_FREE, input_bytes=l2_in, output_bytes=l2_out)
    assert (small.pristine_on_gpu, small.refs_on_gpu, small.timed_sets) == (True, True, 3)  # as before the plan

    # what was measured before the plan: three sets of everything held at once
    old = 3 * timed_set_bytes(pool_in, pool_out, 0, pristine_on_gpu=True, refs_on_gpu=True) + pool_in
    assert old > H100_FREE


def test_the_plan_counts_every_copy_the_check_makes():
    """19_ReLU at its own size (6.4 GB in, 6.4 GB out, torch.relu allocates its output): the first
    GPU run under the plan ran out of memory because the plan left out the second run's copy, a
    copy of each run's poison and the set kept for timing while the next was checked."""
    relu = dict(input_bytes=int(6.44 * GB), output_bytes=int(6.44 * GB))
    p = plan_memory(free_bytes=H100_FREE, reference_bytes=relu["output_bytes"], make_bytes=relu["input_bytes"], **relu)
    usable = H100_FREE - int(0.08 * H100_FREE)
    assert p.reference_measured and (p.pristine_on_gpu, p.refs_on_gpu) == (True, True)
    # guarded in/out, the first run's copy, the pristine inputs, their copy for the reference, its output
    assert p.check_peak_bytes == 6 * relu["input_bytes"] + SMALL_BYTES
    assert p.set_bytes == 4 * relu["input_bytes"] and p.timed_sets == 2
    assert p.peak_bytes == p.check_peak_bytes + p.set_bytes <= usable
    assert "planned" in p.summary() and "measured" not in p.summary()
    p.measured_peak_bytes = 60 * GB
    assert "60.0 GB measured" in p.summary()


def test_a_measured_reference_that_allocates_more_than_the_estimate_gets_a_leaner_plan():
    # a level-2 chain whose eager intermediates are four outputs' worth, on a 40 GB GPU
    sizes = dict(free_bytes=40 * GB, input_bytes=2 * GB, output_bytes=4 * GB)
    guessed = plan_memory(**sizes)
    measured = plan_memory(**sizes, reference_bytes=16 * GB, make_bytes=4 * GB)
    assert not guessed.reference_measured and guessed.reference_bytes == 8 * GB
    assert measured.check_peak_bytes > guessed.check_peak_bytes and measured.timed_sets < guessed.timed_sets
    with pytest.raises(HarnessMemoryError, match="the reference's own run 40.0 GB"):
        plan_memory(**sizes, reference_bytes=40 * GB, label="chain")
    # every moment of the check is under the peak the plan names
    for pristine, refs in ((True, True), (False, True), (True, False), (False, False)):
        peak = check_peak(2 * GB, 4 * GB, 0, pristine_on_gpu=pristine, refs_on_gpu=refs, reference_bytes=16 * GB,
                          make_bytes=4 * GB)
        # guarded in/out, the reference's run on a copy of the kept inputs (or on inputs made for it),
        # the first run's outputs when they wait on the GPU
        assert peak == 6 * GB + 16 * GB + (4 * GB if pristine else 2 * GB) + (4 * GB if refs else 0) + SMALL_BYTES


def test_the_footprint_is_measured_only_on_a_gpu(state):
    assert state.footprint() is None  # a CPU state: the plan falls back to the estimate


def test_less_memory_gives_up_copies_before_refusing():
    norm = dict(input_bytes=int(7.5 * GB), output_bytes=int(7.5 * GB))  # level 1's norms
    plans = {free: plan_memory(free_bytes=int(free * GB), **norm) for free in (80, 50, 44)}
    assert (plans[80].pristine_on_gpu, plans[80].refs_on_gpu) == (True, True)
    assert (plans[50].pristine_on_gpu, plans[50].refs_on_gpu) == (False, True)  # pristine inputs made again
    assert (plans[44].pristine_on_gpu, plans[44].refs_on_gpu) == (False, False)  # ... and references on the host
    with pytest.raises(HarnessMemoryError):
        plan_memory(free_bytes=40 * GB, **norm)
    # a large output, a small input: the references go to host memory first, the inputs stay
    wide = plan_memory(free_bytes=39 * GB, input_bytes=GB, output_bytes=10 * GB)
    assert (wide.pristine_on_gpu, wide.refs_on_gpu) == (True, False)
    for p in (*plans.values(), wide):
        assert p.timed_sets >= 1 and p.check_peak_bytes <= p.free_bytes
    assert plans[80].check_peak_bytes > plans[50].check_peak_bytes > plans[44].check_peak_bytes


def test_a_problem_that_cannot_be_checked_is_refused_with_the_numbers():
    with pytest.raises(HarnessMemoryError) as refused:
        plan_memory(free_bytes=24 * GB, input_bytes=int(17.2 * GB), output_bytes=int(0.14 * GB), label="45_Avg")
    msg = str(refused.value)
    assert "45_Avg does not fit on this GPU" in msg and "inputs 17.2 GB" in msg and "of 24.0 GB free" in msg


def test_timed_sets_never_exceed_the_maximum_or_what_fits():
    p = plan_memory(free_bytes=80 * GB, input_bytes=10**6, output_bytes=10**6, rotate_max=3)
    assert p.timed_sets == 3
    tight = plan_memory(free_bytes=50 * GB, input_bytes=int(7.5 * GB), output_bytes=int(7.5 * GB))
    per = timed_set_bytes(tight.input_bytes, tight.output_bytes, 0, pristine_on_gpu=tight.pristine_on_gpu,
                          refs_on_gpu=tight.refs_on_gpu)
    usable = 50 * GB - max(1 << 30, int(0.08 * 50 * GB))
    assert (tight.timed_sets - 1) * per + tight.check_peak_bytes <= usable
    assert "timed input set" in tight.summary()


# ----- the chunked comparison: the same verdict and message as one whole-tensor comparison ------
@pytest.mark.parametrize("case", ["ok", "mismatch", "nan", "unwritten", "precision"])
def test_chunked_compare_is_the_whole_tensor_comparison(case):
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(37, 53, generator=g)
    out = ref + 1e-7 * torch.randn(37, 53, generator=g)
    poison = None
    if case == "mismatch":
        out[5, 7] += 1.0
        out[30, 2] -= 2.0
    elif case == "nan":
        out[11, 11] = float("nan")
    elif case == "unwritten":
        poison = Poison.of(torch.full_like(out, 123.0))
        out[3, :] = 123.0
    elif case == "precision":
        out = ref * (1 + 5e-5)
    whole = compare(out, ref, atol=1e-4, rtol=1e-4, poison=poison, chunk=10**9)
    for chunk in (1, 7, 100, 1000):
        part = compare(out, ref, atol=1e-4, rtol=1e-4, poison=poison, chunk=chunk)
        # the norms are summed in another order: equal to rounding, every other field exactly
        assert part.rel_err == pytest.approx(whole.rel_err, rel=1e-9, abs=1e-15)
        assert part.model_dump_json(exclude={"rel_err"}) == whole.model_dump_json(exclude={"rel_err"})
    assert whole.ok == (case == "ok")


def test_compare_runs_on_the_chosen_device_with_a_host_reference():
    ref = torch.randn(1000)
    out = ref.clone()
    out[999] = 5.0
    c = compare(out, ref.clone(), atol=1e-4, rtol=1e-4, chunk=64, device=torch.device("cpu"))
    assert not c.ok and c.index == [999] and c.mismatches == 1


# ----- the check's lean paths, on CPU tensors ----------------------------------------------------
LEAN = MemoryPlan(free_bytes=GB, input_bytes=1, output_bytes=1, pristine_on_gpu=False, refs_on_gpu=False)


@pytest.fixture
def state():
    return ProblemState(load_problem(ProblemRef(source="conv2d", shape=(2, 3, 32, 32))), torch.device("cpu"))


def test_regenerated_pristine_inputs_are_the_inputs_and_catch_a_change(state):
    bound = state.new_set(21, PLAN, LEAN)
    assert bound.pristine is None  # nothing kept but a digest
    kept = state.new_set(21, PLAN)
    assert torch.equal(state.pristine_tensors(bound)["x"], kept.pristine[0])
    ev = CheckEvidence(atol=state.info.atol, rtol=state.info.rtol)
    _verify_untouched(state, bound, ev, "before")  # untouched: passes
    bound.inputs["x"].view[0, 0, 0, 0] += 1.0
    with pytest.raises(CandidateFailed) as failed:
        _verify_untouched(state, bound, ev, "before the reference")
    assert failed.value.evidence.failed is CheckFailure.input_mutated


def test_the_reference_of_a_lean_set_is_the_same_and_can_wait_in_host_memory(state):
    lean = state.new_set(22, PLAN, LEAN)
    full = state.new_set(22, PLAN)
    a, b = state.reference(lean, to_host=True), state.reference(full)
    assert all(x.device.type == "cpu" and torch.equal(x, y) for x, y in zip(a, b))
    state.seal_refs(lean, a)
    lean.outputs["out"].view.copy_(a[0])
    assert verify_timed_outputs(state, [lean]) is None
    lean.outputs["out"].view.fill_(3.0)
    ev = verify_timed_outputs(state, [lean])
    assert ev is not None and ev.failed is CheckFailure.timed_output_mismatch


def test_inputs_that_do_not_repeat_under_a_seed_are_a_harness_error(state, monkeypatch):
    bound = state.new_set(23, PLAN, LEAN)
    real = state.problem.make_inputs
    monkeypatch.setattr(state.problem, "make_inputs", lambda device, seed: [x + 1 for x in real(device, seed)])
    with pytest.raises(HarnessMemoryError, match="does not repeat"):
        state.pristine(bound)


# ----- GPU: KernelBench at its own size ------------------------------------------------------------
def _evaluate_seed_kernel(name: str, seeds: int, with_compile: bool = False):
    ref = ProblemRef(source=str(DATA / name))
    problem = load_problem(ref)
    specs = seed_specs(problem)
    assert specs, f"the playbook has no kernel for {name}"
    with WorkerPool(timeout_s=300) as pool:
        baseline = pool.baseline(ref, budget_ms=100, with_compile=with_compile)
        assert baseline.eager.median_ms > 0
        res = pool.evaluate(ref, [Candidate(spec=specs[0])], EvalOptions(seeds=seeds, budget_ms=100, timeout_s=300))[0]
    return problem, res


def _held_under_the_plan(res) -> None:
    m = res.memory
    assert m is not None and m.reference_measured and m.measured_peak_bytes is not None
    print(f"{res.message[:60]} | planned {m.peak_bytes / GB:.2f} GB, measured {m.measured_peak_bytes / GB:.2f} GB, "
          f"{m.timed_sets} timed set(s), reference {m.reference_bytes / GB:.2f} GB")
    # what the evaluation allocated at most never exceeds what the plan counted on
    assert m.measured_peak_bytes <= m.peak_bytes, m.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["level1/19_ReLU.py", "level1/23_Softmax.py", "level1/45_Average_Pooling_2D.py",
                                  "level1/35_GroupNorm_.py", "level1/39_L2Norm_.py"])
def test_a_level1_file_over_10_gb_is_checked_and_timed_on_one_gpu(name):
    """KernelBench's own sizes, as ``kerngen generate`` meets them (baseline with torch.compile
    first): 6.4 GB in and 6.4 GB out (out of memory before the plan, and again under a plan that
    did not count the second run's copy and the poisons), a 17 GB input, 7.5 GB in and out (out of
    memory through fragmentation), 8.6 GB in and out (the degeneracy check's fp64 copies)."""
    problem, res = _evaluate_seed_kernel(name, seeds=3, with_compile=True)
    assert sum(t.nbytes for t in [*problem.info.inputs, *problem.info.outputs]) > 10 * GB
    assert res.ok, res.message
    assert res.memory is not None and res.memory.timed_sets >= 1 and res.timing is not None
    _held_under_the_plan(res)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["level1/40_LayerNorm.py", "1_Conv2D_ReLU_BiasAdd.py", "100_HingeLoss_cuda.py",
                                  "level2/12_Gemm_Multiply_LeakyReLU.py"])
def test_what_an_evaluation_allocates_stays_under_its_plan(name):
    """Three checked sets, three timed: the plan's figure is an upper bound of the measured peak on
    a norm, a fused conv chain, a loss (0-d output) and a GEMM chain."""
    _, res = _evaluate_seed_kernel(name, seeds=3)
    assert res.ok, res.message
    _held_under_the_plan(res)


KB = kernelbench()


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("level", ["level1", "level2"])
def test_every_kernelbench_file_has_a_plan_on_one_h100(level):
    """The issue's goal, on paper: every level-1 and level-2 file at its own size gets a plan on one
    80 GB H100 (the reference's allocations estimated; the GPU tier measures the largest files)."""
    plans = {}
    for path in sorted((KB / level).glob("*.py")):
        info = load_problem(ProblemRef(source=str(path))).info  # meta tensors: no memory
        plans[path.name] = plan_memory(free_bytes=H100_FREE, input_bytes=sum(t.nbytes for t in info.inputs),
                                       output_bytes=sum(t.nbytes for t in info.outputs), label=path.name)
    assert len(plans) == 100
    assert all(p.peak_bytes <= H100_FREE and p.timed_sets >= 1 for p in plans.values())
    lean = sorted(n for n, p in plans.items() if not (p.pristine_on_gpu and p.refs_on_gpu))
    print(f"{level}: {len(plans)} planned; lean (regenerated inputs or host references): {lean}")
