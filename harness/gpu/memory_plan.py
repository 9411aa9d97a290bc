"""The memory plan of an evaluation: what the check and the timed runs hold in GPU memory at once.

KernelBench runs at sizes where one input set is 17 GB (``45_Average_Pooling_2D``) and an output
15 GB (the norms): holding three sets with their pristine copies, outputs, first-run copies and
references, as a small problem does, needs several times the GPU. The plan decides, from the
problem's bytes and the memory free when the evaluation starts, in this order of preference:

1. everything on the GPU (a small problem: nothing changes);
2. pristine inputs made again from their seed when needed (``make_inputs`` is seeded), instead
   of a second copy of every input;
3. references and the first run's outputs in host memory (compared on the GPU chunk by chunk,
   :func:`kerngen.harness.gpu.compare.compare`);
4. both.

The first that fits wins: a lean check costs host transfers and regenerated inputs on every
candidate, which a search pays hundreds of times. Then the timed runs rotate over as many
checked sets as fit beside it (at least one, at most ``rotate_max``; one set is still honest:
every timed call's outputs are poisoned before it runs, so a call that skips its work shows). The
sets kept for timing are the LAST ones checked, so at most ``timed_sets - 1`` of them wait while
another is checked. When not even one set can be checked, the problem does not fit on this GPU:
:class:`HarnessMemoryError`, with the numbers. Pure arithmetic: tested on the CPU; the GPU tier
checks that what an evaluation allocates at most never exceeds :attr:`MemoryPlan.peak_bytes`.

The check of one set peaks at one of three moments (:func:`check_peak`):

- the reference's run: the guarded inputs, outputs and scratch the candidate ran on, the first
  run's outputs (on the GPU, or in host memory), the pristine inputs and the copy the reference
  runs on (or inputs made again for it), and what the reference itself allocates;
- the comparisons: the same sets, the references instead of the reference's run, and the fp64
  chunk the comparison works on (the second run is compared in place, never copied);
- making an input set (``get_inputs`` may allocate temporaries: ``torch.rand(n) * 2 - 1``).

What the reference and ``get_inputs`` allocate is measured once per problem in the worker
(:meth:`kerngen.harness.gpu.check.ProblemState.footprint`): a norm's ``x * x``, a level-2 chain's
intermediates and cuDNN's workspace are whatever PyTorch makes of them, not a guess.
"""

from __future__ import annotations

from kerngen.errors import KerngenError
from kerngen.harness.results import MemoryPlan

# kept free for what the plan does not see: the CUDA context's growth, allocator fragmentation,
# the candidate module (a share of the free memory, and at least this many bytes)
MARGIN_FRACTION = 0.08
MARGIN_MIN_BYTES = 1 << 30
ROTATE_MAX = 3
# the comparison's working set per compared chunk of 2**25 elements: fp64 copies of both sides, the
# difference, masks and a where() temporary; about 64 bytes per fp32 element, 16 per output byte
COMPARE_BYTES_PER_BYTE = 16
COMPARE_CHUNK_BYTES = 4 << 25
# what the sizes above leave out, counted once per check: each guarded buffer's 2 x 4096 guard
# elements and their copy, the allocator's rounding of every block (to 2 MB above 10 MB), digests,
# poison seeds and scalars. Measured on an H100: 0.3-1.9 MB over the sizes alone (KernelBench 19,
# 23, 45 and a 0-d loss output), so 64 MB is a bound with room, not a guess at the margin's job
SMALL_BYTES = 64 << 20


class HarnessMemoryError(KerngenError):
    """One input set of the problem cannot be checked in the GPU memory that is free."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def estimated_reference_bytes(input_bytes: int, output_bytes: int) -> int:
    """What the reference allocates when it was not measured: its outputs and one full-size
    temporary (a norm's ``x * x``)."""
    return output_bytes + max(input_bytes, output_bytes)


def check_peak(input_bytes: int, output_bytes: int, scratch_bytes: int, *, pristine_on_gpu: bool,
               refs_on_gpu: bool, reference_bytes: int | None = None, make_bytes: int | None = None) -> int:
    """The most the check of one input set holds (see the module's three moments)."""
    ref_run = estimated_reference_bytes(input_bytes, output_bytes) if reference_bytes is None else reference_bytes
    made = max(input_bytes, make_bytes or 0)
    guarded = input_bytes + output_bytes + scratch_bytes
    first = output_bytes if refs_on_gpu else 0  # the first run's outputs, copied
    # the reference runs on a copy of the kept pristine inputs, or in place on inputs made for it
    at_reference = guarded + first + (2 * input_bytes + ref_run if pristine_on_gpu else max(made, input_bytes + ref_run))
    refs = output_bytes if refs_on_gpu else 0
    compare_ws = max(COMPARE_BYTES_PER_BYTE * min(output_bytes, COMPARE_CHUNK_BYTES), output_bytes // 4)
    # the untouched check reads the pristine inputs (kept, or made again) beside the compared chunk
    at_compare = guarded + first + refs + (input_bytes if pristine_on_gpu else made) + compare_ws
    at_new_set = guarded + made + (input_bytes if pristine_on_gpu else 0)
    return max(at_reference, at_compare, at_new_set) + SMALL_BYTES


def timed_set_bytes(input_bytes: int, output_bytes: int, scratch_bytes: int, *, pristine_on_gpu: bool,
                    refs_on_gpu: bool) -> int:
    """What one checked set holds while it waits for the timed runs."""
    return (input_bytes + output_bytes + scratch_bytes + (input_bytes if pristine_on_gpu else 0)
            + (output_bytes if refs_on_gpu else 0))


def plan_memory(*, free_bytes: int, input_bytes: int, output_bytes: int, scratch_bytes: int = 0,
                reference_bytes: int | None = None, make_bytes: int | None = None, flush_bytes: int = 0,
                rotate_max: int = ROTATE_MAX, label: str = "the problem") -> MemoryPlan:
    """The plan for one evaluation; :class:`HarnessMemoryError` when no way of checking one set fits.
    ``reference_bytes``/``make_bytes``: what the reference and ``get_inputs`` allocate, measured
    (None: estimated from the sizes)."""
    usable = free_bytes - max(MARGIN_MIN_BYTES, int(MARGIN_FRACTION * free_bytes))
    sizes = dict(input_bytes=input_bytes, output_bytes=output_bytes, scratch_bytes=scratch_bytes)
    ref_run = estimated_reference_bytes(input_bytes, output_bytes) if reference_bytes is None else reference_bytes
    measured = dict(reference_bytes=ref_run, make_bytes=max(input_bytes, make_bytes or 0))
    smallest = None
    for pristine_on_gpu, refs_on_gpu in ((True, True), (False, True), (True, False), (False, False)):
        where = dict(pristine_on_gpu=pristine_on_gpu, refs_on_gpu=refs_on_gpu)
        peak = check_peak(**sizes, **where, **measured)
        smallest = peak if smallest is None else min(smallest, peak)
        if peak > usable:
            continue
        per_set = max(1, timed_set_bytes(**sizes, **where))
        # the last sets checked are kept: all but one wait while the last is checked, then all are timed
        sets = 1 + max(0, (usable - peak) // per_set)
        sets = max(1, min(rotate_max, sets, usable // per_set))
        return MemoryPlan(free_bytes=free_bytes, flush_bytes=flush_bytes, check_peak_bytes=peak, timed_sets=sets,
                          set_bytes=per_set, reference_measured=reference_bytes is not None, **sizes, **where,
                          **measured)
    raise HarnessMemoryError(
        f"{label} does not fit on this GPU: checking one input set needs at least {_gb(smallest or 0)} "
        f"(inputs {_gb(input_bytes)}, outputs {_gb(output_bytes)}, scratch {_gb(scratch_bytes)}, the reference's "
        f"own run {_gb(ref_run)}{'' if reference_bytes is not None else ' estimated'}), {_gb(usable)} of "
        f"{_gb(free_bytes)} free is usable"
    )
