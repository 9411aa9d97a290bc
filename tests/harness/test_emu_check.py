"""CPU tier: the harness's real correctness protocol, end to end, on the CPU emulator.

Every evaluation here is :class:`kerngen.harness.gpu.evaluate.Evaluation` (what a GPU worker runs:
``run_check`` with its poison, guards, seals, runs before and after the reference; the timed runs
rotating over the checked sets; the verification of their outputs) against the problem's real
PyTorch reference, with the emulator as the launcher and a stand-in clock
(:mod:`kerngen.harness.emu.launch`). The kernels are the GPU tier's (tests/kernels/specs.py), bound
to small shapes. Each cheat of the brief's list has its exact verdict AND evidence asserted;
correct kernels are the positive controls. docs/harness-tests.md lists which test kills which
mutant of the harness.
"""

from __future__ import annotations

import pytest
import torch

from kerngen.harness.emu.launch import EmuDevice, EmuModule, StandInClock, evaluate_emulated
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.gpu.check import ProblemState
from kerngen.harness.results import CheckFailure as F
from kerngen.harness.results import EvalResult, Verdict
from kerngen.harness.spec.plan import resolve
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.kernels.gpu import describe
from tests.kernels.specs import CASES

pytestmark = pytest.mark.needs_cxx

GELU = ProblemRef(source="gelu", shape=(37, 41))  # 1517 elements: not a multiple of 4
GELU_WIDE = ProblemRef(source="gelu", shape=(128, 256))  # one element's error stays far under the rel-err limit
SOFTMAX = ProblemRef(source="softmax", shape=(6, 300))
# values ~1e-4: bf16 rounding hides inside atol=1e-4 (and rtol=1e-4) up to |v| ~0.05. Rows of 2048 randn reached
# that once in ~1,000 runs (an x ~5.2 sigma past the row's mean: a mismatch, CI's flake); rows of 8192 need ~6.6.
SOFTMAX_WIDE = ProblemRef(source="softmax", shape=(4, 8192))
LAYERNORM = ProblemRef(source="layernorm", shape=(2, 4, 8, 8))
MATMUL = ProblemRef(source="matmul", shape=(32, 48, 40))
OPTIONS = EvalOptions(seeds=3, bench=True, budget_ms=20, timeout_s=60)

_STATES: dict[str, ProblemState] = {}


def state_of(ref: ProblemRef) -> ProblemState:
    key = ref.key()
    if key not in _STATES:
        _STATES[key] = ProblemState(load_problem(ref), torch.device("cpu"))
    return _STATES[key]


def evaluate(name: str, ref: ProblemRef, *, options: EvalOptions = OPTIONS, device: EmuDevice | None = None,
             config: dict | None = None) -> EvalResult:
    spec = CASES[name].spec
    state = state_of(ref)
    plan = resolve(spec, sizes=state.info.sizes, tensors=state.info.tensor_facts(), config=spec.full_config(config or {}))
    return evaluate_emulated(state, spec, plan, options, device)


def incorrect(r: EvalResult, failed: F, message: str) -> None:
    """The verdict, the failed check, the evidence's message, and no time for an incorrect kernel."""
    assert r.verdict is Verdict.incorrect, describe(r)
    assert r.check is not None and r.check.failed is failed, describe(r)
    assert message in r.check.message, describe(r)
    assert r.timing is None and r.ms == float("inf"), describe(r)


# ----- positive controls: correct kernels are ok, really checked and timed --------------------
@pytest.mark.parametrize("name,ref", [
    ("gelu_ok", GELU), ("gelu_vec4", GELU), ("softmax_ok", SOFTMAX), ("softmax_multi_launch", SOFTMAX),
    ("layernorm_ok", LAYERNORM), ("matmul_tiled", MATMUL), ("matmul_splitk_atomic", MATMUL),
])
def test_correct_kernel_is_ok_checked_and_timed(name, ref):
    device = EmuDevice(CASES[name].spec, clock=StandInClock(0.25))
    r = evaluate(name, ref, device=device)
    assert r.verdict is Verdict.ok, describe(r)
    ev = r.check
    assert ev is not None and ev.failed is None and ev.message.startswith("correct on 3 random input sets")
    assert len(ev.seeds) == 3 and len(set(ev.seeds)) == 3 and 0 not in ev.seeds
    assert ev.atol == ev.rtol == 1e-4 and ev.max_rel_err == 1e-5  # fp32 near 1e-4, rel err 1e-5
    assert ev.max_abs_err <= 1e-4 and ev.rel_err <= 1e-5 and ev.deterministic
    # the stand-in clock timed REPS calls of 0.25 ms each; the candidate ran 2 x 3 checked + 5 timed calls
    assert r.timing is not None and r.timing.median_ms == 0.25 and r.timing.reps == 3, describe(r)
    assert not r.timing.l2_flushed
    assert device.module.calls == 11
    assert r.message.startswith("ok: 0.2500 ms")
    # memory to spare: every set rotated, everything on the device, so the message names no plan given up
    # (killed: `timed_sets < ROTATE_SETS` -> `is ROTATE_SETS`, which named it exactly when nothing was given up)
    m = r.memory
    assert m is not None and m.timed_sets == 3 and m.refs_on_gpu and m.pristine_on_gpu and "memory:" not in r.message


def test_correct_kernel_not_timed_when_bench_is_off():
    device = EmuDevice(CASES["gelu_ok"].spec)
    r = evaluate("gelu_ok", GELU, options=EvalOptions(seeds=2, bench=False), device=device)
    assert r.verdict is Verdict.ok and r.timing is None and r.message.startswith("ok (not timed); correct on 2")
    assert device.module.calls == 4


# ----- 1, 11: stale output; the output is really compared ----------------------------------
def test_stale_output_is_unwritten():
    r = evaluate("gelu_writes_nothing", GELU)
    incorrect(r, F.unwritten_output, "run before the reference: out: 1517 of 1517 elements differ (unwritten_output)")
    assert r.check.max_err_index == [0, 0] and r.check.mismatches == 1517


@pytest.mark.parametrize("name", ["gelu_constant", "gelu_zeros"])
def test_a_constant_output_is_a_mismatch(name):
    r = evaluate(name, GELU)
    incorrect(r, F.mismatch, "run before the reference: out:")
    assert "(mismatch); worst at out[" in r.check.message


# ----- 2: input and parameter mutation ------------------------------------------------------
def test_zeroing_the_input_is_caught_before_the_reference():
    incorrect(evaluate("gelu_zeroes_input", GELU), F.input_mutated, "input 'x' was modified (before the reference)")


def test_softmax_in_place_is_input_mutation():
    incorrect(evaluate("softmax_in_place", SOFTMAX), F.input_mutated, "input 'x' was modified (before the reference)")


def test_resetting_parameters_is_caught_and_the_copies_restored():
    state = state_of(LAYERNORM)
    r = evaluate("layernorm_resets_params", LAYERNORM)
    incorrect(r, F.input_mutated, "parameter 'ln.weight' was modified (before the reference)")
    assert state.params_intact() == ""  # the check put fresh copies back for the next candidate
    assert evaluate("layernorm_ok", LAYERNORM).verdict is Verdict.ok


# ----- 5: precision ---------------------------------------------------------------------------
def test_bf16_rounded_output_is_precision_loss():
    r = evaluate("softmax_bf16_bits", SOFTMAX_WIDE)
    incorrect(r, F.precision_loss, "within atol/rtol but ||out-ref||/||ref|| = ")
    assert 1e-5 < r.check.rel_err < 1e-2 and r.check.mismatches == 0


def test_bf16_operands_of_a_matmul_are_a_mismatch():
    incorrect(evaluate("matmul_bf16_bits", MATMUL), F.mismatch, "run before the reference: out:")


def test_tanh_approximation_of_gelu_is_a_mismatch():
    incorrect(evaluate("gelu_tanh_approx", GELU_WIDE), F.mismatch, "(mismatch); worst at out[")


# ----- 6: partial writes --------------------------------------------------------------------
def test_half_the_output_is_unwritten():
    r = evaluate("gelu_first_half", GELU)
    incorrect(r, F.unwritten_output, "out: 759 of 1517 elements differ (unwritten_output)")


def test_every_other_row_is_unwritten():
    r = evaluate("softmax_even_rows", SOFTMAX)
    incorrect(r, F.unwritten_output, "out: 900 of 1800 elements differ (unwritten_output)")
    assert r.check.max_err_index[0] % 2 == 1


def test_writing_only_what_a_sample_would_see_is_a_mismatch():
    incorrect(evaluate("gelu_only_sampled", GELU), F.mismatch, "(mismatch); worst at out[")


# ----- 7: out of bounds, races, uninitialized memory -----------------------------------------
@pytest.mark.parametrize("name", ["gelu_write_past_end", "gelu_write_before_start"])
def test_a_write_next_to_the_output_hits_a_guard(name):
    incorrect(evaluate(name, GELU), F.guard_overwritten, "a write landed outside 'out' (before the reference)")


def test_a_read_past_the_input_sees_garbage_at_the_last_element():
    r = evaluate("gelu_read_past_end", GELU)
    # the guard holds random bytes: the value read is wrong, or a NaN where the reference has none
    assert r.verdict is Verdict.incorrect and r.check.failed in (F.mismatch, F.nan_mismatch), describe(r)
    assert r.check.max_err_index == [36, 40] and r.check.mismatches == 1, describe(r)


def test_a_write_far_outside_every_buffer_is_a_runtime_error():
    r = evaluate("gelu_far_store", GELU)
    assert r.verdict is Verdict.runtime_error, describe(r)
    assert r.message.startswith("runtime error: kernel gelu, block (0,0,0), thread (0,0,0): "), describe(r)
    assert r.check is None and r.timing is None


def test_reading_uninitialized_output_is_nondeterministic():
    r = evaluate("gelu_uninit_read", GELU_WIDE)
    incorrect(r, F.nondeterministic, "two runs disagree: out: 1 of 32768 elements differ")
    assert not r.check.deterministic and r.check.seeds[0] == r.check.seeds[0]
    assert "the runs differ" in r.check.pattern


def test_each_sets_two_runs_are_poisoned_differently(monkeypatch):
    """The runs before and after the reference of one set see different poisons (a kernel that reads its output
    before writing it then gives two answers), and the sets start on the three patterns in turn. Killed: the
    second run's pattern ``(i + 1) % 3`` -> ``(i | 1) % 3`` (CI's sample of 2026-11-28, seed 3247652684: set 1
    ran twice on "huge")."""
    import kerngen.harness.gpu.check as check

    seen: list[str] = []
    real = check._run_poisoned
    monkeypatch.setattr(check, "_run_poisoned", lambda state, bound, runner, pattern, sync, copy:
                        seen.append(pattern) or real(state, bound, runner, pattern, sync, copy))
    assert evaluate("gelu_ok", GELU).verdict is Verdict.ok
    assert seen == ["nan", "huge", "huge", "random", "random", "nan"]


def test_a_race_on_shared_memory_is_wrong():
    r = evaluate("softmax_race", SOFTMAX)
    assert r.verdict is Verdict.incorrect and r.check.failed in (F.mismatch, F.nan_mismatch), describe(r)


def test_atomics_into_an_unzeroed_output_leave_poison():
    # the first run's output is NaN poison: NaN plus anything keeps the poison's bits on the CPU
    incorrect(evaluate("matmul_splitk_no_memset", MATMUL), F.unwritten_output, "run before the reference")


# ----- 8: poison detection, call counters, the timed phase -----------------------------------
@pytest.mark.parametrize("name", ["gelu_skip_unless_nan", "gelu_skip_on_fill_patterns"])
def test_skipping_work_on_a_poison_pattern_is_unwritten(name):
    incorrect(evaluate(name, GELU), F.unwritten_output, "(unwritten_output)")


def test_behaving_differently_when_timed_is_a_timed_output_mismatch():
    device = EmuDevice(CASES["gelu_wrong_when_timed"].spec)
    r = evaluate("gelu_wrong_when_timed", GELU, device=device)
    incorrect(r, F.timed_output_mismatch, "timed input set 0: out:")
    assert device.module.calls == 11  # it passed the check (6 calls) and ran timed (5)


class _WrongOnce(EmuModule):
    """A correct kernel made wrong on one chosen call (the test's doing, as no kernel can count its calls):
    what a kernel that skips work on some timed calls, at random or on a pattern, leaves behind."""

    def __init__(self, spec, wrong_call: int) -> None:
        super().__init__(spec)
        self.wrong_call = wrong_call

    def runner(self, plan, tensors, stream=None):
        run, out = super().runner(plan, tensors, stream), tensors["out"]

        def call() -> None:
            run()
            if self.calls == self.wrong_call:
                out.add_(1.0)

        return call


@pytest.mark.parametrize("timed_call, caught", [(0, True), (1, True), (4, False)])
def test_a_timed_call_wrong_before_its_sets_last_is_caught_by_sampling(timed_call, caught):
    # 6 checked calls (3 sets, before and after the reference), then 5 timed calls over the sets 0 1 2 0 1:
    # calls 0 and 1 are not their set's last (only the sample sees them), call 4 is set 1's last (the
    # whole-output comparison after the timed runs sees it)
    device = EmuDevice(CASES["gelu_ok"].spec)
    device.module = _WrongOnce(CASES["gelu_ok"].spec, wrong_call=6 + timed_call + 1)
    r = evaluate("gelu_ok", GELU, device=device)
    incorrect(r, F.timed_output_mismatch, "timed calls: " if caught else "timed input set 1: out:")
    assert device.module.calls == 11


def test_a_call_counter_in_device_memory_is_refused_at_compile(tmp_path, monkeypatch):
    from kerngen.errors import CompileError
    from kerngen.harness.compile.compiler import compile_job, job_for

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    for name in ("gelu_call_counter", "gelu_device_malloc_cache"):
        spec = CASES[name].spec
        state = state_of(GELU)
        plan = resolve(spec, sizes=state.info.sizes, tensors=state.info.tensor_facts(), config=spec.full_config({}))
        with pytest.raises(CompileError, match=r"^forbidden: "):
            compile_job(job_for(spec, plan, "sm_90"))


# ----- far writes into the harness's own tensors ----------------------------------------------
class FarWriter(EmuModule):
    """The emulator's buffers cannot reach the harness's memory (another process), so the far
    write is done here, after the emulated kernel, standing in for one on a GPU: ``tamper(call)``
    runs with the call number (1, 2, ...) and the set being checked."""

    def __init__(self, spec, state: ProblemState, tamper):
        super().__init__(spec)
        self.state, self.tamper, self.bound = state, tamper, None
        real = state.new_set

        def new_set(*args, **kw):
            self.bound = real(*args, **kw)
            return self.bound

        self._real = real
        state.new_set = new_set

    def runner(self, plan, tensors, stream=None):
        inner = super().runner(plan, tensors, stream)

        def call():
            inner()
            self.tamper(self.calls, self.bound, tensors)

        return call


def _far_write(name: str, ref: ProblemRef, tamper) -> EvalResult:
    state = state_of(ref)
    device = EmuDevice(CASES[name].spec)
    device.module = FarWriter(CASES[name].spec, state, tamper)
    try:
        return evaluate(name, ref, device=device)
    finally:
        del state.new_set  # the instance attribute: back to the class's method
        state.reset_params()


def test_zeroing_the_input_and_its_pristine_copy_is_caught_by_the_seal():
    def tamper(call, bound, tensors):
        tensors["x"].zero_()
        bound.pristine[0].zero_()  # input and pristine copy agree: only the seal sees it

    r = _far_write("gelu_zeros", GELU, tamper)
    incorrect(r, F.guard_overwritten, "a write landed in the harness's pristine copy of argument 0 (before the reference)")


def test_copying_the_output_over_the_reference_is_caught_after_the_reference():
    def tamper(call, bound, tensors):
        if bound.refs:  # the run after the reference: make the reference agree with a wrong output
            bound.refs[0].copy_(tensors["out"])

    r = _far_write("gelu_constant", GELU, tamper)
    incorrect(r, F.guard_overwritten, "a write landed in the harness's reference output 0 (after the reference)")


def test_writing_a_parameter_and_the_reference_model_alike_is_caught():
    def tamper(call, bound, tensors):
        with torch.no_grad():
            tensors["ln.weight"].fill_(1.0)
            state_of(LAYERNORM).model.ln.weight.fill_(1.0)  # the copy and its source agree

    r = _far_write("layernorm_ok", LAYERNORM, tamper)
    incorrect(r, F.input_mutated, "parameter 'ln.weight' was modified (before the reference)")


def test_a_far_write_during_the_timed_runs_is_caught_by_their_verification():
    def tamper(call, bound, tensors):
        if call > 6:  # the timed runs: the check's 6 calls are honest
            tensors["x"].add_(1.0)

    r = _far_write("gelu_ok", GELU, tamper)
    incorrect(r, F.input_mutated, "(during the timed runs)")
    assert r.check.message == "input 'x' was modified (during the timed runs)"


# ----- the rotation: every kept set is timed in turn ---------------------------------------------
def test_the_timed_runs_rotate_over_the_checked_sets():
    outs: list[int] = []

    def tamper(call, bound, tensors):
        if call > 6:  # the timed runs: which set's output each call wrote
            outs.append(tensors["out"].data_ptr())

    assert _far_write("gelu_ok", GELU, tamper).verdict is Verdict.ok
    # the untimed first call, the warm-up, then 3 timed calls: sets 0, 1, 2, 0, 1
    assert len(outs) == 5 and len(set(outs)) == 3 and outs[3:] == outs[:2], outs


# ----- what the evaluation reports beside the verdict ---------------------------------------------
def test_phases_are_timed_to_the_microsecond():
    r = evaluate("gelu_ok", GELU)
    assert set(r.phases_s) == {"load", "check", "bench", "verify_timed"}, r.phases_s
    assert all(v >= 0 for v in r.phases_s.values())
    # rounded to 6 digits, not 5 (each of 4 real durations ends in a 0 at the 6th digit with odds 1/10)
    assert any(round(v, 5) != v for v in r.phases_s.values()), r.phases_s


def test_a_memory_plan_that_gives_up_rotation_says_so():
    """Free memory for one timed set only: the timed runs use that one, and the message says what the
    plan gave up (the same plan as on a GPU: harness/gpu/memory_plan.py)."""
    from kerngen.harness.gpu.memory_plan import HarnessMemoryError, plan_memory

    info = state_of(GELU).info

    def plan(free: int):
        return plan_memory(free_bytes=free, input_bytes=sum(t.nbytes for t in info.inputs),
                           output_bytes=sum(t.nbytes for t in info.outputs), scratch_bytes=0, reference_bytes=None,
                           make_bytes=None, flush_bytes=0, rotate_max=3, label=info.name)

    lo, hi = 0, 1 << 34  # the least free memory that fits: a bisection over the pure plan
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            plan(mid)
            hi = mid
        except HarnessMemoryError:
            lo = mid
    assert plan(hi).timed_sets == 1
    device = EmuDevice(CASES["gelu_ok"].spec)
    device.free_bytes = lambda: hi
    r = evaluate("gelu_ok", GELU, device=device)
    assert r.verdict is Verdict.ok and r.memory is not None and r.memory.timed_sets == 1, describe(r)
    assert r.message.endswith(r.memory.summary()) and "memory: 1 timed input set(s)" in r.message
    device.free_bytes = lambda: hi - 1
    r = evaluate("gelu_ok", GELU, device=device)
    assert r.verdict is Verdict.harness_error and "does not fit" in r.message, describe(r)


# ----- evaluate.py's own bookkeeping (its mutants, scripts/mutation.py, 2026-11-28) ----------------------------
def test_the_memory_plan_counts_the_plans_scratch_in_bytes():
    from kerngen.harness.gpu.evaluate import Evaluation

    spec = CASES["gelu_wrong_when_timed"].spec  # one int32 of scratch
    state = state_of(GELU)
    plan = resolve(spec, sizes=state.info.sizes, tensors=state.info.tensor_facts(), config=spec.full_config({}))
    run = Evaluation(state, None, None, 0, device=EmuDevice(spec))
    assert run.memory_plan(plan).scratch_bytes == 4  # size x itemsize, not size << itemsize
    assert run.memory_plan(None).scratch_bytes == 0


def test_phases_and_wall_time_are_differences_of_the_clock(monkeypatch):
    """On a clock that ticks 1 ms per reading from 1000 s, every phase and the whole take a few ms: durations
    are the clock's differences (not its sums or ratios)."""
    import types

    import kerngen.harness.gpu.evaluate as evaluate_module

    ticks = iter(range(10**9))
    monkeypatch.setattr(evaluate_module, "time", types.SimpleNamespace(perf_counter=lambda: 1000.0 + next(ticks) / 1000))
    r = evaluate("gelu_ok", GELU)
    assert r.verdict is Verdict.ok, describe(r)
    assert all(0 < v < 0.5 for v in r.phases_s.values()), r.phases_s
    assert 0 < r.wall_s < 0.5 and sum(r.phases_s.values()) <= r.wall_s + 1e-9, (r.wall_s, r.phases_s)


def test_a_launch_plan_a_tensor_refuses_is_an_invalid_spec_that_says_why(monkeypatch):
    from kerngen.errors import SpecError

    def refuse(self, plan, tensors, stream=None):
        raise SpecError("tensormap of 'x': its box is wider than the tensor")

    monkeypatch.setattr(EmuModule, "runner", refuse)
    r = evaluate("gelu_ok", GELU)
    assert r.verdict is Verdict.invalid_spec, describe(r)
    assert r.message == "launch plan: tensormap of 'x': its box is wider than the tensor", r.message


def test_a_memory_plan_that_keeps_every_copy_but_fewer_timed_sets_says_so():
    """The least free memory that keeps the pristine copies and the references on the GPU gives fewer than 3 timed
    sets: the message says what the plan gave up although no copy left the GPU."""
    from kerngen.harness.gpu.memory_plan import HarnessMemoryError, plan_memory

    info = state_of(GELU).info

    def whole(free: int) -> bool:
        try:
            p = plan_memory(free_bytes=free, input_bytes=sum(t.nbytes for t in info.inputs),
                            output_bytes=sum(t.nbytes for t in info.outputs), scratch_bytes=0, reference_bytes=None,
                            make_bytes=None, flush_bytes=0, rotate_max=3, label=info.name)
        except HarnessMemoryError:
            return False
        return p.pristine_on_gpu and p.refs_on_gpu

    lo, hi = 0, 1 << 34
    while hi - lo > 1:
        mid = (lo + hi) // 2
        hi, lo = (mid, lo) if whole(mid) else (hi, mid)
    device = EmuDevice(CASES["gelu_ok"].spec)
    device.free_bytes = lambda: hi
    r = evaluate("gelu_ok", GELU, device=device)
    m = r.memory
    assert r.verdict is Verdict.ok and m is not None and m.pristine_on_gpu and m.refs_on_gpu, describe(r)
    assert m.timed_sets < 3 and r.message.endswith(m.summary()), r.message


def test_fresh_seeds_are_never_the_default_seed(monkeypatch):
    """Seed 0 is the inputs other parts of kerngen make (the front end's trace, a model's timing): an
    evaluation's seeds never are, whatever the random bytes."""
    import kerngen.harness.gpu.evaluate as evaluate_module

    for first in (0, 1, 2, 255):
        monkeypatch.setattr(evaluate_module.os, "urandom", lambda n, b=first: bytes([b]) + bytes(n - 1))
        assert all(s != 0 for s in evaluate_module.fresh_seeds(3))


def test_a_mark_left_in_scratch_by_one_run_is_gone_by_the_next():
    """Scratch is poisoned before every run of the check: a kernel that doubles its output once it finds the mark
    an earlier run left there is correct on every run (killed: the loop poisoning scratch in check._run_poisoned skipped,
    when the run after the reference found the mark and was called a mismatch)."""
    r = evaluate("gelu_marks_scratch", GELU)
    assert r.verdict is Verdict.ok and r.check is not None and r.check.failed is None, describe(r)


def test_a_check_of_more_than_three_sets_cycles_the_poison_patterns(monkeypatch):
    """Each set's two runs take two different poison patterns, each set a pattern of its own first, cycling past the
    third set (killed: ``i % 3`` -> ``i & 3`` or ``% 4``, an IndexError on the fourth set; ``% 2``, one pattern never
    used first; ``i % 3`` -> ``i - 3`` and ``(i + 1) % 3`` -> ``(i + 1) - 3``, an IndexError on the seventh and sixth
    set: seven sets)."""
    import kerngen.harness.gpu.check as check
    from kerngen.harness.gpu.buffers import POISON_PATTERNS

    used: list[str] = []
    real = check._run_poisoned
    monkeypatch.setattr(check, "_run_poisoned", lambda state, bound, runner, pattern, *rest:
                        used.append(pattern) or real(state, bound, runner, pattern, *rest))
    r = evaluate("gelu_ok", GELU, options=EvalOptions(seeds=7, bench=False, timeout_s=60))
    assert r.verdict is Verdict.ok and r.check is not None and len(r.check.seeds) == 7, describe(r)
    firsts, seconds = used[0::2], used[1::2]
    assert firsts == [POISON_PATTERNS[i % 3] for i in range(7)] and seconds == [POISON_PATTERNS[(i + 1) % 3] for i in range(7)]


def test_a_bitwise_deterministic_kernel_is_not_called_otherwise():
    """Killed: ``"" if evidence.deterministic else " (not bitwise deterministic)"`` with the condition negated."""
    r = evaluate("gelu_ok", GELU, options=EvalOptions(seeds=2, bench=False, timeout_s=60))
    assert r.verdict is Verdict.ok and r.check.deterministic and "not bitwise" not in r.check.message, describe(r)
