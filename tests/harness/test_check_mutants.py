"""CPU tests written to kill mutants of the harness's check code that the other tests let live
(scripts/mutation.py; docs/harness-tests.md lists each mutant and its test, or why it is equivalent)."""

from __future__ import annotations

import sys

import pytest
import torch

from kerngen.harness.gpu.buffers import Poison


def test_random_poison_seeds_far_apart_give_different_bytes():
    """Killed: ``(seed + k) % (1 << 63)`` -> ``% 63`` or ``% (1 + 63)`` (63 or 64 poisons in all: a kernel could learn
    them)."""
    a = Poison((4096,), torch.uint8, torch.device("cpu"), seed=1 << 40)
    for apart in (63, 64, 1 << 20):
        b = Poison((4096,), torch.uint8, torch.device("cpu"), seed=(1 << 40) + apart)
        assert not torch.equal(a.flat(0, 4096), b.flat(0, 4096)), apart
    c = Poison((4096,), torch.uint8, torch.device("cpu"), seed=(1 << 40) + (1 << 63))  # the modulus keeps seeds valid
    assert torch.equal(a.flat(0, 4096), c.flat(0, 4096))


def test_an_empty_range_of_a_random_poison_is_empty():
    """Killed: ``max(b, a + 1)`` -> ``max(b, a)`` (an empty range at a block boundary had no block)."""
    from kerngen.harness.gpu.buffers import POISON_BLOCK_BYTES

    p = Poison((2 * POISON_BLOCK_BYTES,), torch.uint8, torch.device("cpu"), seed=5)
    for at in (0, POISON_BLOCK_BYTES, 17):
        assert p.flat(at, at).numel() == 0


def test_random_bytes_take_every_value():
    """Killed: ``randint(0, 256)`` -> ``randint(0, 255)`` (guards and poison never 0xFF)."""
    from kerngen.harness.gpu.buffers import alloc_guarded, poison

    gen = torch.Generator().manual_seed(3)
    buf = alloc_guarded("out", (1 << 16,), torch.uint8, torch.device("cpu"), gen)
    assert set(buf.guards().tolist()) == set(range(256))
    p = poison(buf, "random", gen)
    assert set(p.flat(0, 1 << 16).tolist()) == set(range(256))


def test_every_block_of_a_random_poison_depends_on_the_seed(monkeypatch):
    """Killed: ``self.seed + k`` -> ``self.seed << k`` (from block 63 on, every poison the same)."""
    import kerngen.harness.gpu.buffers as buffers

    monkeypatch.setattr(buffers, "POISON_BLOCK_BYTES", 64)
    total = 100 * 64
    a = Poison((total,), torch.uint8, torch.device("cpu"), seed=11)
    b = Poison((total,), torch.uint8, torch.device("cpu"), seed=12)
    assert all(not torch.equal(a._block(k, total), b._block(k, total)) for k in (0, 1, 63, 64, 99))


def test_a_regenerated_input_that_differs_either_way_is_refused():
    """Killed: ``digest(x) != kept`` -> ``>`` (a get_inputs that does not repeat was caught half the time)."""
    import pytest

    from kerngen.harness.gpu.check import ProblemState
    from kerngen.harness.gpu.memory_plan import HarnessMemoryError
    from kerngen.harness.results import MemoryPlan
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    state = ProblemState(load_problem(ProblemRef(source="gelu", shape=(8, 16))), torch.device("cpu"))
    memory = MemoryPlan(free_bytes=1 << 30, input_bytes=512, output_bytes=512, pristine_on_gpu=False)
    bound = state.new_set(21, ResolvedPlan(config={}, defines={}, scratch=[], steps=[]), memory)
    assert bound.pristine is None and torch.equal(state.pristine_tensors(bound)["x"], bound.inputs["x"].view)
    kept = state._input_digests[(21, 0)]
    for other in (kept - 1, kept + 1):  # what a get_inputs that does not repeat would give, below or above
        state._input_digests[(21, 0)] = other
        with pytest.raises(HarnessMemoryError, match="does not repeat under a seed"):
            state.pristine(bound)


def test_the_relative_error_counts_finite_elements_only():
    """Killed: ``fo, fr = (o, r) if finite.all() else ...`` inverted (a shared inf or NaN made the
    relative error NaN, and a precision loss beside it passed)."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.linspace(-1.0, 1.0, 4096) * 1e-3
    ref[7], ref[9] = float("inf"), float("nan")
    same = compare(ref.clone(), ref, atol=1e-4, rtol=1e-4)
    assert same.ok and same.rel_err == 0.0
    rounded = ref * (1 + 2e-4)  # within atol/rtol everywhere, 2e-4 off relative to the reference
    c = compare(rounded, ref, atol=1e-4, rtol=1e-4)
    assert not c.ok and c.failed is CheckFailure.precision_loss and abs(c.rel_err - 2e-4) < 1e-5, c


def test_a_widened_limit_keeps_a_small_excess_a_precision_loss_not_a_logic_error():
    """Killed: ``gross = max(gross_rel_err, 2 * limit)`` -> ``2 % limit`` (CI's sample, 2026-11-28): at a limit widened
    past half of fp32's gross threshold (--precision tf32 widens it), an output just over the limit is imprecise,
    not wrong; the threshold of "wrong" stays twice the limit."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.linspace(-1.0, 1.0, 4096)
    off = ref * (1 + 1.2e-2)  # 1.2e-2 off relative: over the limit of 8e-3, under twice it
    c = compare(off, ref, atol=0.1, rtol=0.1, rel_limit=8e-3)
    assert not c.ok and c.failed is CheckFailure.precision_loss, c
    far = ref * (1 + 2e-2)  # over twice the limit: wrong
    assert compare(far, ref, atol=0.1, rtol=0.1, rel_limit=8e-3).failed is CheckFailure.mismatch


def test_a_comparison_runs_on_the_device_it_is_given():
    """Killed: ``dev = device if device is not None else out.device`` -> ``is None`` (CI's sample, 2026-11-28): a
    host-held output or reference is compared chunk by chunk on the GPU it is given (with two devices and none
    given, the chunks would meet on two devices). On the CPU, a device with no kernels shows where it ran."""
    from kerngen.harness.gpu.compare import compare

    out, ref = torch.ones(64), torch.ones(64)
    assert compare(out, ref, atol=0.0, rtol=0.0).ok
    assert compare(out, ref, atol=0.0, rtol=0.0, device=torch.device("cpu")).ok
    with pytest.raises((NotImplementedError, RuntimeError)):  # moved to "meta", where nothing can be read back
        compare(out, ref, atol=0.0, rtol=0.0, device=torch.device("meta"))


def test_a_chunk_of_random_poison_is_made_from_its_own_blocks_only(monkeypatch):
    """Killed: ``first = a // BLOCK`` -> ``a >> BLOCK`` (0: every block from the first one made again,
    for a chunk of a 6 GB output all of it)."""
    import kerngen.harness.gpu.buffers as buffers

    monkeypatch.setattr(buffers, "POISON_BLOCK_BYTES", 64)
    p = Poison((64 * 10,), torch.uint8, torch.device("cpu"), seed=4)
    whole = p.flat(0, 640)
    made: list[int] = []
    real = Poison._block
    monkeypatch.setattr(Poison, "_block", lambda self, k, total: made.append(k) or real(self, k, total))
    assert torch.equal(p.flat(330, 390), whole[330:390]) and made == [5, 6]


def test_the_timed_loop_poisons_each_call_with_another_byte_than_the_call_before():
    """Before every timed call the outputs and scratch of the set it runs on are poisoned with a byte that changes
    at every call (0xFF, 0x7F, ...), so that no call finds the bytes the call before it was given (a mutant that
    changed every second call survived CI's sample)."""
    from types import SimpleNamespace

    from kerngen.harness.gpu.evaluate import _Rotation

    out = SimpleNamespace(view=torch.zeros(8))
    scratch = SimpleNamespace(view=torch.zeros(3, dtype=torch.int32))
    sets = [SimpleNamespace(outputs={"out": out}, scratch={"s": scratch})]
    sampled = []
    rotation = _Rotation(sets, [lambda: None], SimpleNamespace(sample=sampled.append))
    bytes_seen = []
    for _ in range(5):
        rotation.prepare()
        seen = {int(b) for t in (out.view, scratch.view) for b in t.reshape(-1).view(torch.uint8)}
        assert len(seen) == 1  # one byte everywhere, outputs and scratch alike
        bytes_seen.append(seen.pop())
    assert bytes_seen == [0xFF, 0x7F, 0xFF, 0x7F, 0xFF]
    assert len(sampled) == 4  # every call's outputs but the last were sampled before the next poison


def test_the_evidence_keeps_the_worst_output_not_the_last():
    """Of several outputs (or input sets), the evidence names the largest error and where it is: a mutant that
    recorded every comparison in turn (the last one won) survived a mutation sample."""
    from kerngen.harness.gpu.check import _record
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckEvidence

    ref = torch.zeros(4, dtype=torch.float64)
    worse, better = ref.clone(), ref.clone()
    worse[2], better[1] = 0.5, 0.1
    evidence = CheckEvidence()
    _record(evidence, compare(worse, ref, atol=1.0, rtol=0.0), "out0")
    _record(evidence, compare(better, ref, atol=1.0, rtol=0.0), "out1")
    assert (evidence.max_abs_err, evidence.max_err_output, evidence.max_err_index) == (0.5, "out0", [2])


def test_a_float64_output_is_held_to_float64_precision():
    """An fp64 output within atol/rtol but 1e-7 off relative to the reference is a precision loss: fp64's own limit
    on ||out - ref|| / ||ref|| is 1e-10 (a mutant that raised it to ~1 survived a mutation sample)."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.linspace(1.0, 2.0, 1000, dtype=torch.float64)
    assert compare(ref * (1 + 1e-12), ref, atol=1e-4, rtol=1e-4).ok
    c = compare(ref * (1 + 1e-7), ref, atol=1e-4, rtol=1e-4)
    assert not c.ok and c.failed is CheckFailure.precision_loss


def test_a_random_poison_covers_every_block_of_a_large_output(monkeypatch):
    """Killed: ``(n + B - 1) // B`` -> ``% B`` in poison()'s loop over blocks (an output of 5 blocks and a byte got
    no block at all: its bytes kept what was there before, which a kernel could leave as its answer)."""
    import kerngen.harness.gpu.buffers as buffers
    from kerngen.harness.gpu.buffers import alloc_guarded, poison, still_poisoned

    monkeypatch.setattr(buffers, "POISON_BLOCK_BYTES", 64)
    gen = torch.Generator().manual_seed(4)
    for n in (5 * 64 + 1, 7 * 64, 3 * 64 + 63):
        buf = alloc_guarded("out", (n,), torch.uint8, torch.device("cpu"), gen)
        buf.view.zero_()
        p = poison(buf, "random", gen)
        assert torch.equal(buf.view, p.flat(0, n)) and bool(still_poisoned(buf.view, p).all()), n


def test_random_poisons_are_drawn_from_a_wide_range_of_seeds():
    """A random poison's seed is one of 2**62: a kernel cannot learn the few patterns the check writes and skip its
    work on them (drawn from 62 seeds, 200 poisons repeat a pattern ~140 times)."""
    from kerngen.harness.gpu.buffers import alloc_guarded, poison

    gen = torch.Generator().manual_seed(5)
    buf = alloc_guarded("out", (8,), torch.float32, torch.device("cpu"), gen)
    seeds = {poison(buf, "random", gen).seed for _ in range(200)}
    assert len(seeds) == 200


def test_an_integer_output_is_compared_exactly_and_reported():
    """Killed (compare's full run, 2026-11-28): ``out != ref`` -> ``==`` and ``nbad == 0`` -> ``== 1`` in
    _compare_exact (an integer output that matches failed, or one wrong element passed), the default ``mismatches``
    0 -> -1 (an exact match reported -1 mismatches: the export's fallback check reads ``mismatches == 0`` as "every
    element matches"), and the worst error 1.0 -> 2.0 (an exact mismatch's error is a flag of 1.0, against which
    check._record weighs a float output's error to name the worst output)."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    same = compare(ref.clone(), ref, atol=0.0, rtol=0.0)
    assert same.ok and same.failed is None and same.mismatches == 0 and same.message == "out: exact match", same
    assert (same.max_abs_err, same.rel_err) == (0.0, 0.0), same  # Comparison's defaults (mutants made them -1.0)
    out = ref.clone()
    out[1, 2] = 99
    c = compare(out, ref, atol=0.0, rtol=0.0)
    assert not c.ok and c.failed is CheckFailure.mismatch and (c.mismatches, c.index) == (1, [1, 2]), c
    assert (c.got, c.expected, c.max_abs_err, c.rel_err) == (99.0, 6.0, 1.0, 1.0), c


def test_an_integer_output_wrong_but_written_is_a_mismatch_not_unwritten():
    """Killed: ``still_poisoned(out, poison) & bad`` -> ``|``, ``<<`` or ``>>`` in _compare_exact (a wrong integer
    output with a poison called never written where an element still holds the poison's bits, but rightly: the
    reference has that value there; or an unwritten row called a mismatch)."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    p = Poison.of(torch.full((3, 4), 5, dtype=torch.int32))  # the reference holds 5 at [1, 1]
    out = ref.clone()
    out[0, 0] = 50  # every element written, one of them wrong
    assert compare(out, ref, atol=0.0, rtol=0.0, poison=p).failed is CheckFailure.mismatch
    out[2] = 5  # a row never written
    assert compare(out, ref, atol=0.0, rtol=0.0, poison=p).failed is CheckFailure.unwritten_output


@pytest.mark.parametrize("shape", [(3,), (2, 2), (4, 1), (5,)])
def test_an_output_of_another_shape_is_a_shape_mismatch(shape):
    """Killed: ``tuple(out.shape) != tuple(ref.shape)`` -> ``>`` (an output shorter than its reference, or of the same
    size in another shape, was compared on the elements it has and passed)."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    c = compare(torch.ones(shape), torch.ones(4), atol=1.0, rtol=1.0)
    assert not c.ok and c.failed is CheckFailure.shape_mismatch and (c.mismatches, c.rel_err) == (0, 0.0), c


def test_the_relative_error_limit_is_met_at_the_limit_and_a_miss_counts_no_mismatches():
    """Killed: ``rel > limit`` -> ``>=`` (an output exactly at the limit failed; the message says "exceeds"), and the
    mismatches 0 -> -1 of a precision loss and of a gross one: every element is within atol/rtol there, and the
    export's fallback check (exported_kernel.py) reads ``mismatches == 0`` as just that."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref, out = torch.tensor([4.0]), torch.tensor([5.0])  # within atol=2; ||out-ref||/||ref|| = 1/4 exactly
    at = compare(out, ref, atol=2.0, rtol=0.0, rel_limit=0.25)
    assert at.ok and at.rel_err == 0.25, at
    over = compare(out, ref, atol=2.0, rtol=0.0, rel_limit=0.2)  # over the limit, under twice it: imprecise
    assert not over.ok and over.failed is CheckFailure.precision_loss and over.mismatches == 0, over
    gross = compare(out, ref, atol=2.0, rtol=0.0, rel_limit=0.1)  # over twice the limit: wrong
    assert not gross.ok and gross.failed is CheckFailure.mismatch and gross.mismatches == 0, gross
    # Killed: ``rel > gross`` -> ``>=``: exactly twice the limit is still imprecise, not wrong
    assert compare(out, ref, atol=2.0, rtol=0.0, rel_limit=0.125).failed is CheckFailure.precision_loss


def test_the_comparisons_chunk_fits_the_memory_plans_allowance():
    """Killed: CHUNK_ELEMENTS ``1 << 25`` -> ``1 << 26`` (or ``2 << 25``): the verdict stays the whole tensor's, but
    the memory plan counts the comparison's working set for chunks of at most COMPARE_CHUNK_BYTES of fp32 (2**25
    elements): larger chunks take up to twice the GPU memory the plan left for them. Smaller chunks only cost time."""
    from kerngen.harness.gpu.compare import CHUNK_ELEMENTS
    from kerngen.harness.gpu.memory_plan import COMPARE_CHUNK_BYTES

    assert 4 * CHUNK_ELEMENTS <= COMPARE_CHUNK_BYTES


def test_an_element_near_zero_is_called_wrong_against_the_outputs_rms():
    """Killed: ``rms = (den2 / n) ** 0.5`` -> ``* 0.5``, ``/ 0.5`` or ``den2 // n`` in _too_far. A precision loss's
    pattern calls an element near zero wrong when it is off by more than the limit times the output's RMS (here
    0.707: 7.07e-6 for fp32's 1e-5): the elements at 0 off by 5e-6 are not, those off by 8.5e-6 are, and so are
    the elements at 1 off by 3e-5."""
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckFailure

    ref = torch.cat([torch.ones(500), torch.zeros(500)])
    out = torch.cat([torch.full((500,), 1 + 3e-5), torch.full((250,), 5e-6), torch.full((250,), 8.5e-6)])
    c = compare(out, ref, atol=1e-4, rtol=1e-4)
    assert c.failed is CheckFailure.precision_loss, c
    assert c.pattern.startswith("750 of 1000 elements wrong: 0..499, 750..999;"), c.pattern
    # Killed: ``den2 / max(n, 1)`` -> ``max(n, 2)``: the RMS of one element is its magnitude, as of two equal ones
    # (0.18 off at a limit of 0.1: within 0.1 * (rms + |ref|) = 0.8, the element is not called wrong)
    for n in (1, 2):
        one = compare(torch.full((n,), 4.72), torch.full((n,), 4.0), atol=1.0, rtol=0.0, rel_limit=0.1)
        assert one.failed is CheckFailure.precision_loss and one.pattern == "", (n, one)


def test_a_dtype_without_a_relative_error_limit_is_held_to_atol_and_rtol_alone():
    """Killed: the limit of a dtype REL_ERR_LIMITS does not list, 0.0 (none) -> 1.0 (a float8 output within atol but
    3x its tiny reference was called a mismatch); and its gross threshold, GROSS_REL_ERR's 0.0 -> 1.0: with a limit
    given (--precision tf32; the export passes gross_rel_err as the limit) "wrong" starts at twice that limit."""
    from kerngen.harness.gpu.compare import compare, gross_rel_err, rel_err_limit
    from kerngen.harness.results import CheckFailure

    assert rel_err_limit(torch.float8_e4m3fn) == 0.0 and gross_rel_err(torch.float8_e4m3fn) == 0.0
    ref = torch.full((8,), 0.002).to(torch.float8_e4m3fn)  # 2**-9
    out = torch.full((8,), 0.0078125).to(torch.float8_e4m3fn)  # 2**-7: within atol=0.01, rel err 3
    c = compare(out, ref, atol=0.01, rtol=0.0)
    assert c.ok and c.rel_err == pytest.approx(3.0), c
    half, off = torch.full((8,), 0.5).to(torch.float8_e4m3fn), torch.full((8,), 0.75).to(torch.float8_e4m3fn)
    wrong = compare(off, half, atol=0.5, rtol=0.0, rel_limit=0.2)  # rel err 0.5 > 2 x 0.2
    assert wrong.failed is CheckFailure.mismatch, wrong


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_an_empty_output_compares_equal_and_names_no_element(dtype):
    """An output with no element is equal to its reference (it was a ZeroDivisionError, found by compare's mutants:
    ``worst.numel() == 0`` -> ``== -1`` let it reach argmax, and _Totals' starting worst was reported as one).
    Killed too: the empty output's max abs err 0.0 -> 1.0 in _result (an error reported where no element is)."""
    from kerngen.harness.gpu.compare import compare

    for shape in [(0,), (2, 0, 3)]:
        c = compare(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype), atol=1e-4, rtol=1e-4)
        assert c.ok and (c.mismatches, c.index, c.got, c.expected, c.rel_err) == (0, [], None, None, 0.0), c
        assert c.max_abs_err == 0.0, c


def test_an_exact_float_match_names_its_first_element():
    """Killed: _Totals.ok_worst's start error -1.0 -> ``not 1.0`` or ``-0.0``: an output equal to its reference
    (every error 0) named element 0 with the start's got and expected (0.0) instead of its own values: the first
    occurrence of the largest error is named, as torch.argmax over the whole tensor would."""
    from kerngen.harness.gpu.compare import compare

    ref = torch.arange(1.0, 5.0)
    c = compare(ref.clone(), ref, atol=0.0, rtol=0.0)
    assert c.ok and (c.max_abs_err, c.index, c.got, c.expected) == (0.0, [0], 1.0, 1.0), c
    assert c.mismatches == 0, c  # an ok comparison's count (a mutant said 1; the export reads it)


@pytest.mark.parametrize("wrong", [False, True])
def test_a_tie_across_chunks_names_the_first_element(wrong):
    """Killed: ``err > best[0]`` -> ``>=`` in compare's _worse: of equal errors in two chunks the later chunk's
    element was named, where one whole-tensor argmax names the first."""
    from kerngen.harness.gpu.compare import compare

    ref = torch.arange(1.0, 9.0)
    out = ref.clone()
    if wrong:  # the same error at elements 2 and 6, in the two chunks of 4
        out[2] += 1.0
        out[6] += 1.0
    c = compare(out, ref, atol=1e-3, rtol=0.0, chunk=4)
    assert c.index == ([2] if wrong else [0]) and c.expected == (3.0 if wrong else 1.0), c
    assert c.ok is not wrong and c.mismatches == (2 if wrong else 0), c


def test_timed_outputs_verified_without_a_sampler_pass_when_right_and_fail_when_wrong():
    """Killed: ``else 0`` -> ``else 1`` / ``else -1`` in verify_timed_outputs (no sampler counted as one sampled
    wrong element: every timing without a sampler failed, or raised on ``None.samples``; CI's sample of
    2026-11-28, seed 1670868624)."""
    from kerngen.harness.gpu.check import ProblemState, verify_timed_outputs
    from kerngen.harness.results import CheckFailure
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    state = ProblemState(load_problem(ProblemRef(source="conv2d", shape=(2, 3, 32, 32))), torch.device("cpu"))
    bound = state.new_set(31, ResolvedPlan(config={}, defines={}, scratch=[], steps=[]))
    refs = state.reference(bound)
    state.seal_refs(bound, refs)
    bound.outputs["out"].view.copy_(refs[0])
    assert verify_timed_outputs(state, [bound]) is None
    bound.outputs["out"].view.add_(1.0)
    ev = verify_timed_outputs(state, [bound])
    assert ev is not None and ev.failed is CheckFailure.timed_output_mismatch, ev


def test_two_runs_in_host_memory_are_compared_chunk_by_chunk_over_their_whole_length():
    """Killed: ``fb[i:i + step]`` -> ``fb[i:i ^ step]`` in check._equal (from the third chunk of 2**26 elements on, the
    second run's chunk was empty or shorter: two equal runs of a large output in host memory were called
    different). CPU tensors of 2**27 + 8 bytes: three chunks."""
    from kerngen.harness.gpu.check import _equal

    a = torch.zeros(2**27 + 8, dtype=torch.uint8)
    b = a.clone()
    assert _equal(a, b)
    b[-1] = 1
    assert not _equal(a, b)
    # killed: ``a.shape != b.shape or a.dtype != b.dtype`` -> ``and`` (the same bytes in another shape were equal)
    assert not _equal(torch.zeros(4), torch.zeros(2, 2)) and not _equal(torch.zeros(4), torch.zeros(4, dtype=torch.int32))
    # killed: ``a.shape != b.shape`` -> ``a.shape > b.shape`` (shapes sort as tuples: a first run of a smaller shape,
    # the second run's prefix in bytes or the same bytes in another shape, was equal)
    assert not _equal(torch.zeros(2, 2), torch.zeros(4)) and not _equal(torch.zeros(3), torch.zeros(4))


def test_each_timed_sampler_seeds_its_generator_afresh():
    """Killed: the sampler's seed ``urandom(8) >> 1`` -> ``& 1`` or ``% 1`` (one or two seeds in all: the sampled
    elements of the timed calls would be the same few every time, and a kernel could learn them)."""
    from kerngen.harness.gpu.check import TimedSampler

    class _State:  # what TimedSampler reads of a problem state: its tolerance
        problem = type("P", (), {"ref": type("R", (), {"precision": None})()})()
        info = type("I", (), {"atol": 1e-4, "rtol": 1e-4})()

    seeds = {TimedSampler(_State())._generator(torch.device("cpu")).initial_seed() for _ in range(8)}
    assert len(seeds) == 8, seeds


def test_an_exact_check_names_its_output_and_element_in_the_evidence():
    """Killed: ``c.max_abs_err >= evidence.max_abs_err`` -> ``>`` in check._record (an output equal to its reference,
    error 0, left the evidence naming no output or element, where compare names the first element)."""
    from kerngen.harness.gpu.check import _record
    from kerngen.harness.gpu.compare import compare
    from kerngen.harness.results import CheckEvidence

    ev = CheckEvidence(atol=1e-4, rtol=1e-4)
    ref = torch.arange(1.0, 5.0)
    _record(ev, compare(ref.clone(), ref, atol=1e-4, rtol=1e-4), "out")
    assert (ev.max_err_output, ev.max_err_index, ev.got, ev.expected, ev.max_abs_err) == ("out", [0], 1.0, 1.0, 0.0)


def test_the_check_keeps_exactly_the_last_sets_for_the_timed_runs(monkeypatch):
    """Killed: ``i >= len(seeds) - keep_max`` -> ``>>`` (3 >> 2 = 0: every set kept, past the memory plan's count of
    what waits for the timed runs) or ``+`` (none kept)."""
    import kerngen.harness.gpu.check as check
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    state = check.ProblemState(load_problem(ProblemRef(source="gelu", shape=(8, 8))), torch.device("cpu"))
    monkeypatch.setattr(check, "_check_one_set", lambda state, module, plan, stream, seed, i, *rest: f"set {i}")
    kept: list = []
    ev = check.run_check(state, None, None, None, [11, 12, 13], lambda: None, keep=kept, keep_max=2)
    assert ev.failed is None and kept == ["set 1", "set 2"]
    kept = []  # and ``-`` -> ``^``, the same as ``-`` for 3 sets: 4 - 1 = 3, 4 ^ 1 = 5
    check.run_check(state, None, None, None, [11, 12, 13, 14], lambda: None, keep=kept, keep_max=1)
    assert kept == ["set 3"]


def test_the_timed_sampler_goes_on_past_an_empty_output():
    """Killed: ``continue`` -> ``break`` after an output with no element (the outputs after it were never sampled)."""
    from types import SimpleNamespace

    sampler = _sampler()
    empty, wrong = torch.zeros(0), torch.ones(64)
    bound = SimpleNamespace(outputs={"a": SimpleNamespace(view=empty), "b": SimpleNamespace(view=wrong)},
                            refs=[torch.zeros(0), torch.zeros(64)])
    sampler.sample(bound)
    assert sampler.samples == 64 and sampler.failures() == 64


def test_the_timed_sampler_can_draw_an_outputs_first_element():
    """Killed: ``randint(0, n, ...)`` -> ``randint(1, n, ...)`` (element 0 never sampled: a one-element output could not
    be sampled at all)."""
    from types import SimpleNamespace

    sampler = _sampler()
    sampler.sample(SimpleNamespace(outputs={"out": SimpleNamespace(view=torch.ones(1))}, refs=[torch.zeros(1)]))
    assert (sampler.samples, sampler.failures()) == (1, 1)


def test_the_timed_sampler_counts_nan_where_the_reference_has_nan_as_right():
    """Killed: ``equal_nan=True`` -> ``False`` (a NaN where the reference has one counted as a wrong element)."""
    from types import SimpleNamespace

    sampler = _sampler()
    nan = torch.full((8,), float("nan"))
    sampler.sample(SimpleNamespace(outputs={"out": SimpleNamespace(view=nan.clone())}, refs=[nan]))
    assert sampler.samples == 8 and sampler.failures() == 0


def test_the_reference_of_a_set_without_pristine_copies_comes_from_its_seed():
    """Killed: ``bound.pristine is not None`` -> ``is None`` / ``not (...)`` in ProblemState.reference (a set the memory
    plan keeps no pristine copies of reached for them)."""
    from kerngen.harness.gpu.check import ProblemState
    from kerngen.harness.results import MemoryPlan
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    state = ProblemState(load_problem(ProblemRef(source="gelu", shape=(8, 16))), torch.device("cpu"))
    plan = ResolvedPlan(config={}, defines={}, scratch=[], steps=[])
    lean = state.new_set(5, plan, MemoryPlan(free_bytes=1 << 30, input_bytes=512, output_bytes=512,
                                             pristine_on_gpu=False))
    full = state.new_set(5, plan)
    assert lean.pristine is None and full.pristine is not None
    assert torch.equal(state.reference(lean)[0], state.reference(full)[0])


def test_the_timed_samplers_wrong_elements_add_up_over_its_calls():
    """Killed: ``self.bad + count`` -> ``^`` or ``-`` (a second call's wrong elements cancelled the first's), and
    ``failures()``'s 0 of a sampler never called -> 1 or -1."""
    from types import SimpleNamespace

    sampler = _sampler()
    assert sampler.failures() == 0
    bound = SimpleNamespace(outputs={"out": SimpleNamespace(view=torch.ones(16))}, refs=[torch.zeros(16)])
    sampler.sample(bound)
    sampler.sample(bound)
    assert (sampler.calls, sampler.samples, sampler.failures()) == (2, 32, 32)


def test_the_references_wait_in_host_memory_exactly_when_the_memory_plan_says(monkeypatch):
    """Killed: ``memory is not None and not memory.refs_on_gpu`` -> ``memory is None and ...`` (or its negations) in
    _check_one_set: the references stayed on the GPU where the plan counted them in host memory, or the reverse."""
    from types import SimpleNamespace

    import kerngen.harness.gpu.check as check
    from kerngen.harness.results import CheckEvidence, MemoryPlan
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    state = check.ProblemState(load_problem(ProblemRef(source="gelu", shape=(8, 16))), torch.device("cpu"))
    asked: list[bool] = []
    monkeypatch.setattr(check, "_run_poisoned", lambda *args: [])  # no kernel: only where the references go
    monkeypatch.setattr(check.ProblemState, "reference", lambda self, bound, to_host=False: asked.append(to_host) or [])
    module = SimpleNamespace(runner=lambda plan, tensors, stream: None)
    plan = ResolvedPlan(config={}, defines={}, scratch=[], steps=[])
    for memory in (MemoryPlan(free_bytes=1 << 30, input_bytes=512, output_bytes=512, refs_on_gpu=False),
                   MemoryPlan(free_bytes=1 << 30, input_bytes=512, output_bytes=512), None):
        check._check_one_set(state, module, plan, None, 5, 0, lambda: None, CheckEvidence(), memory)
    assert asked == [True, False, False]


def test_a_reference_that_works_in_place_leaves_the_pristine_inputs_alone(tmp_path):
    """Killed: ``x.clone() if isinstance(x, Tensor)`` -> ``if not isinstance(...)`` in ProblemState.reference (an
    in-place reference, a KernelBench ReLU(inplace=True), wrote over the pristine copies the check verifies against)."""
    from kerngen.harness.gpu.check import ProblemState
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    path = tmp_path / "relu_inplace.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def __init__(self):\n        super().__init__()\n        self.relu = nn.ReLU(inplace=True)\n\n"
                    "    def forward(self, x):\n        return self.relu(x)\n\n\n"
                    "def get_inputs():\n    return [torch.randn(8, 16)]\n\n\ndef get_init_inputs():\n    return []\n")
    state = ProblemState(load_problem(ProblemRef(source=str(path))), torch.device("cpu"))
    bound = state.new_set(9, ResolvedPlan(config={}, defines={}, scratch=[], steps=[]))
    before = bound.pristine[0].clone()
    assert (before < 0).any()
    first, second = state.reference(bound)[0], state.reference(bound)[0]
    assert torch.equal(bound.pristine[0], before) and torch.equal(first, second) and torch.equal(first, before.relu())


def _sampler():
    """A TimedSampler at atol = rtol = 1e-4, without a problem state."""
    from kerngen.harness.gpu.check import TimedSampler

    sampler = TimedSampler.__new__(TimedSampler)
    sampler.atol, sampler.rtol, sampler.bad, sampler.samples, sampler.calls, sampler._gen = 1e-4, 1e-4, None, 0, 0, {}
    return sampler


def test_two_checks_of_one_problem_draw_other_guard_bytes_from_the_same_model():
    """The guards' and poisons' generator is seeded afresh for each ProblemState (it was a fixed 1234: every worker
    and every run drew the same guard bytes and random-poison seeds in the same order, which a kernel could learn);
    the reference model is still built from the state's seed, so its weights are the same."""
    from kerngen.harness.gpu.check import ProblemState
    from kerngen.harness.spec.plan import ResolvedPlan
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    problem = load_problem(ProblemRef(source="conv2d", shape=(2, 3, 16, 16)))
    a, b = (ProblemState(problem, torch.device("cpu")) for _ in range(2))
    assert a.gen.initial_seed() != b.gen.initial_seed()
    assert a.params.keys() == b.params.keys() and a.params
    for name in a.params:
        assert torch.equal(a.params[name].view, b.params[name].view), name
        assert not torch.equal(a.params[name].guard_copy, b.params[name].guard_copy), name
    plan = ResolvedPlan(config={}, defines={}, scratch=[], steps=[])
    out_a, out_b = a.new_set(7, plan).outputs["out"], b.new_set(7, plan).outputs["out"]
    assert not torch.equal(out_a.guard_copy, out_b.guard_copy)


def test_the_nan_poison_is_nan_and_the_huge_poison_is_finite():
    """Killed: ``0xFF if pattern == "nan" else 0x7F`` negated in buffers.poison (the two patterns swapped bytes: the
    "nan" sets were poisoned with a finite value, the "huge" ones with NaN). Found with it: 0x7F7F was a NaN in fp16,
    so fp16 outputs had no finite huge poison at all; the byte is 0x7B now."""
    from kerngen.harness.gpu.buffers import alloc_guarded, poison

    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        buf = alloc_guarded("out", (5, 3), dtype, torch.device("cpu"), gen)
        assert poison(buf, "nan", gen).byte == 0xFF and bool(torch.isnan(buf.view).all()), dtype
        assert poison(buf, "huge", gen).byte == 0x7B, dtype  # 0x7F7F is a NaN in fp16
        assert bool(torch.isfinite(buf.view).all()) and bool((buf.view.float().abs() > 1e4).all()), dtype


def test_a_pattern_name_made_at_run_time_gets_its_poison():
    """Killed: ``pattern == "nan"`` -> ``pattern is "nan"`` in buffers.poison. Literals are interned, so only a name
    built at run time (read from a file, joined) shows it: it was poisoned with the huge byte, never with NaN."""
    from kerngen.harness.gpu.buffers import alloc_guarded, poison

    gen = torch.Generator().manual_seed(4)
    buf = alloc_guarded("out", (4,), torch.float32, torch.device("cpu"), gen)
    name = "".join(["n", "an"])
    assert name == "nan" and name is not sys.intern("nan")  # equal, not the same object: the point
    assert poison(buf, name, gen).byte == 0xFF and bool(torch.isnan(buf.view).all())


def test_every_guard_byte_is_drawn_at_random_not_left_as_allocated(monkeypatch):
    """Killed: ``g = GUARD_ELEMS * element_size`` -> ``+``, ``|`` or ``//`` in alloc_guarded (only the first bytes of
    each guard were drawn, the rest left as the allocator had them, often zeros: a kernel writing zeros past its
    output there went unseen). The allocation is made zeros here, so any byte not drawn shows."""
    from kerngen.harness.gpu import buffers

    real_empty = torch.empty
    monkeypatch.setattr(buffers.torch, "empty", lambda *a, **k: torch.zeros(*a, **k) if "dtype" in k else real_empty(*a, **k))
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float16, torch.float64):
        guards = buffers.alloc_guarded("out", (3, 5), dtype, torch.device("cpu"), gen).guards()
        assert guards.numel() == 2 * buffers.GUARD_ELEMS * dtype.itemsize
        # random bytes are 0 one time in 256: 2 x GUARD_ELEMS x itemsize of them hold a few zeros, not hundreds
        assert int((guards == 0).sum()) < guards.numel() // 32, (dtype, int((guards == 0).sum()))


def test_a_poison_made_again_lands_where_it_is_asked_for():
    """Killed: ``dev = device if device is not None else self.device`` negated in Poison.flat (a poison made again for
    a comparison on another device stayed on its own, and one asked for nowhere in particular went to the default)."""
    from kerngen.harness.gpu.buffers import Poison

    p = Poison((4,), torch.float32, torch.device("meta"), byte=0xFF)
    assert p.flat(0, 4).device.type == "meta"
    here = p.flat(0, 4, torch.device("cpu"))
    assert here.device.type == "cpu" and bool(torch.isnan(here).all())


def test_a_random_poisons_last_block_is_made_at_its_own_length(monkeypatch):
    """Killed: ``total = self.numel * size`` -> ``<<`` in Poison.flat (the last block was drawn longer than it is and
    cut: the same bytes only where a longer draw begins with a shorter one, which a GPU's generator does not promise).
    Blocks of 64 bytes here: 40 fp32 elements are blocks of 64, 64 and 32 bytes."""
    from kerngen.harness.gpu import buffers

    monkeypatch.setattr(buffers, "POISON_BLOCK_BYTES", 64)
    gen = torch.Generator().manual_seed(9)
    buf = buffers.alloc_guarded("out", (40,), torch.float32, torch.device("cpu"), gen)
    p = buffers.poison(buf, "random", gen)
    drawn: list[int] = []
    real = buffers._random_bytes
    monkeypatch.setattr(buffers, "_random_bytes", lambda n, device, g: drawn.append(n) or real(n, device, g))
    again = p.flat(0, 40)
    assert drawn == [64, 64, 32] and torch.equal(again.view(torch.uint8), buf.view.view(torch.uint8))


def test_an_integer_outputs_pattern_counts_every_wrong_element_past_2_to_53():
    """Killed: compare's ``describe(..., exact=True)`` for an integer output -> ``exact=False``. The pattern then
    compared the values as float64, which cannot tell 2**53 from 2**53 + 1: of 32 wrong int64 elements it named 16."""
    from kerngen.harness.gpu.compare import compare

    out = torch.arange(64, dtype=torch.int64) + 2**53
    ref = out.clone()
    ref[::2] += 1
    c = compare(out, ref, atol=0.0, rtol=0.0)
    assert not c.ok and c.mismatches == 32, c
    assert c.pattern.startswith("32 of 64 elements wrong: every 2nd from 0"), c.pattern
