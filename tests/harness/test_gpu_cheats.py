"""GPU tier: the harness cannot be fooled. One test (or more) per item of the brief's list
"Known ways generated kernels cheat a harness", each asserting the exact verdict AND its evidence
(``EvalResult.check.failed``). Kernels: tests/kernels/specs.py. Item 12 (hangs, crashes) lives
in tests/harness/test_gpu_isolation.py, the positive controls in tests/harness/test_gpu_correct.py.

Where two checks can both see a cheat and the harness's order decides which one reports, the
test accepts exactly those failures (a set of CheckFailure), never "anything but ok".
"""

from __future__ import annotations

import pytest

from kerngen.harness.results import CheckFailure as F
from kerngen.harness.results import Verdict
from kerngen.problems.ref import ProblemRef
from tests.kernels.gpu import Batches, describe
from tests.kernels.specs import CASES, DEGENERATE

pytestmark = pytest.mark.gpu

# name -> the failures that count as catching it (verdict: incorrect)
INCORRECT: dict[str, set[F]] = {
    # 1: relying on stale memory; 11: outputs are really compared, inputs are never zeros
    "gelu_writes_nothing": {F.unwritten_output},
    "gelu_constant": {F.mismatch},
    "gelu_zeros": {F.mismatch},
    # 2: mutating inputs or parameters
    "gelu_zeroes_input": {F.input_mutated},
    "softmax_in_place": {F.input_mutated},
    "layernorm_resets_params": {F.input_mutated},
    # 5: precision downgrades checked at fp32 1e-4
    "gelu_tanh_approx": {F.mismatch},
    "matmul_bf16_operands": {F.mismatch},
    "matmul_fp16_operands": {F.mismatch},
    "softmax_bf16_output": {F.precision_loss},  # within atol: only the relative-error limit sees it
    # 6: partial writes
    "gelu_first_half": {F.unwritten_output},
    "gelu_only_sampled": {F.mismatch},
    "softmax_even_rows": {F.unwritten_output},
    # 7: out-of-bounds writes and reads, races, relying on zeroed memory
    "gelu_write_past_end": {F.guard_overwritten},
    "gelu_write_before_start": {F.guard_overwritten},
    "gelu_read_past_end": {F.mismatch, F.nan_mismatch},
    "softmax_race": {F.mismatch, F.nan_mismatch, F.nondeterministic},
    # reads its output before writing it: each run matches, the two runs of a set disagree
    "gelu_uninit_read": {F.nondeterministic},
    "softmax_multi_no_memset": {F.mismatch, F.nan_mismatch},
    # huge poison absorbs the atomic adds (still poison), NaN poison turns into NaN
    "matmul_splitk_no_memset": {F.unwritten_output, F.nan_mismatch, F.mismatch},
    # 8: behaving differently when checked than when timed
    "gelu_skip_unless_nan": {F.unwritten_output},
    "gelu_skip_on_fill_patterns": {F.unwritten_output},
    # correct while checked, wrong while timed (it tells the timed loop's scratch poison apart)
    "gelu_wrong_when_timed": {F.timed_output_mismatch},
}
FORBIDDEN = [n for n, c in CASES.items() if c.forbidden]


@pytest.fixture(scope="module")
def pool():
    from kerngen.harness.pool.local import WorkerPool

    with WorkerPool(devices=None, timeout_s=30.0) as p:
        yield p


@pytest.fixture(scope="module")
def results(pool) -> Batches:
    return Batches(pool, [*INCORRECT, *FORBIDDEN, "gelu_ok", "gelu_dynamic_parallelism"])


@pytest.mark.parametrize("name", list(INCORRECT))
def test_cheat_is_incorrect_with_evidence(results, name):
    r = results[name]
    assert r.verdict is Verdict.incorrect, describe(r)
    assert r.check is not None and r.check.failed in INCORRECT[name], describe(r)
    assert r.check.message, describe(r)
    assert r.timing is None, "an incorrect kernel must not be timed (or reported with a time)"
    assert r.ms == float("inf")


@pytest.mark.parametrize("name", FORBIDDEN)
def test_persistent_device_state_is_forbidden(results, name):
    """3 (deferred work), 4 (caching across calls), 8 (call counting): every way to keep state
    across calls, spelled so that a text scan misses most of them, is refused at compile time."""
    r = results[name]
    assert r.verdict is Verdict.compile_error, describe(r)
    assert r.message.startswith("forbidden:"), describe(r)


def test_device_side_launch_cannot_escape_the_timed_region(results):
    """NVRTC refuses the launch (the harness compiles whole programs); the cubin check that would
    refuse a module calling the device runtime is tested on the CPU
    (test_kernel_sources_compile.py::test_a_device_side_launch_is_refused_by_nvrtc_and_by_the_cubin_check)."""
    r = results["gelu_dynamic_parallelism"]
    assert r.verdict is Verdict.compile_error, describe(r)
    assert "device-side kernel launch" in r.log, describe(r)


def test_a_far_write_into_the_pristine_copy_is_caught_by_the_seal():
    """A kernel that zeroes its input AND the harness's pristine copy of it (the reference's input)
    writes gelu(0) = 0: input and copy agree, a reference on them would too. The byte distance from
    the input to the copy is handed in as an argument (the test learns it from the allocator), so the
    write lands exactly there; the seal on the copy (a keyed digest on the CPU) catches it."""
    import torch

    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.compile.nvrtc_info import default_arch
    from kerngen.harness.gpu.check import ProblemState, run_check
    from kerngen.harness.gpu.launcher import LoadedModule
    from kerngen.harness.spec.plan import resolve
    from kerngen.problems.load import load_problem

    case = CASES["gelu_far_write_pristine"]
    problem = load_problem(case.problem)
    device = torch.device("cuda", 0)
    state = ProblemState(problem, device)
    plan = resolve(case.spec, sizes=problem.info.sizes, tensors=problem.info.tensor_facts(),
                   config=case.spec.full_config({}))
    compiled = compile_job(job_for(case.spec, plan, default_arch()))
    delta = plan.steps[0].args[3]  # the int64 argument the runner binds after the set is made
    make_set = state.new_set

    def new_set(*args, **kw):
        bound = make_set(*args, **kw)
        delta.value = bound.pristine[0].data_ptr() - bound.inputs["x"].view.data_ptr()
        return bound

    state.new_set = new_set
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        module = LoadedModule(compiled.cubin, ["gelu"])
        ev = run_check(state, module, plan, stream, [1234567, 7654321, 99991], stream.synchronize)
    assert delta.value != 0
    assert ev.failed is F.guard_overwritten, ev
    assert ev.message == "a write landed in the harness's pristine copy of argument 0 (before the reference)", ev


# ----- 11: the harness runs the candidate -------------------------------------------------
def test_correct_kernel_ok_and_really_checked(results):
    r = results["gelu_ok"]
    assert r.verdict is Verdict.ok, describe(r)
    assert r.check is not None and r.check.failed is None
    assert len(r.check.seeds) >= 3 and 0 not in r.check.seeds, describe(r)
    assert r.check.atol <= 1e-4 and r.check.rtol <= 1e-4, "fp32 must be checked near 1e-4"
    assert 0 < r.check.max_abs_err <= 1e-4 or r.check.max_abs_err == 0.0
    assert r.timing is not None and r.timing.median_ms > 0


def test_seeds_are_fresh_for_every_evaluation(pool):
    from kerngen.harness.evaluator import Candidate, EvalOptions

    c = CASES["gelu_ok"]
    opts = EvalOptions(seeds=3, bench=False, timeout_s=20)
    a, b = pool.evaluate(c.problem, [Candidate(spec=c.spec), Candidate(spec=c.spec)], opts)
    assert a.ok and b.ok, describe(a) + "\n" + describe(b)
    assert set(a.check.seeds).isdisjoint(b.check.seeds), (a.check.seeds, b.check.seeds)
    assert len(set(a.check.seeds)) == len(a.check.seeds) >= 3


# ----- 9, 10: problems not worth optimizing are flagged ------------------------------------
def test_degenerate_problem_is_flagged(pool):
    b = pool.baseline(DEGENERATE)
    assert b.degenerate is True, b
    assert b.degenerate_reason


def test_tiny_problem_is_launch_bound(pool):
    b = pool.baseline(ProblemRef(source="softmax", shape=(4, 32)))
    assert b.launch_bound is True, b
    assert b.degenerate is False, b


def test_real_problem_is_neither_degenerate_nor_launch_bound(pool):
    # 8192 x 4096 fp32: 268 MB moved, ~0.1 ms on an H100/H200
    b = pool.baseline(ProblemRef(source="softmax", shape=(8192, 4096)))
    assert b.degenerate is False and b.launch_bound is False, b
    assert b.eager.median_ms > 0 and b.floor_ms and b.floor_ms > 0
