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
every timed call's outputs are poisoned before it runs, so a call that skips its work shows). When not even one set can be checked, the problem does not fit on this GPU:
:class:`HarnessMemoryError`, with the numbers. Pure arithmetic: tested on the CPU.

The peak of checking one set: the guarded inputs, outputs and scratch the candidate runs on;
the pristine inputs (if kept); the first run's copy and the references (if on the GPU); and the
reference's own run: its argument copies, its outputs and one full-size temporary (a norm's
``x * x``; the larger of the inputs and outputs: an estimate, the margin covers the rest).
"""

from __future__ import annotations

from kerngen.errors import KerngenError
from kerngen.harness.results import MemoryPlan

# kept free for what the estimate does not see: the CUDA context's growth, cuDNN workspaces,
# allocator fragmentation (a share of the free memory, and at least this many bytes)
MARGIN_FRACTION = 0.08
MARGIN_MIN_BYTES = 1 << 30
ROTATE_MAX = 3


class HarnessMemoryError(KerngenError):
    """One input set of the problem cannot be checked in the GPU memory that is free."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def check_peak(input_bytes: int, output_bytes: int, scratch_bytes: int, *, pristine_on_gpu: bool,
               refs_on_gpu: bool) -> int:
    guarded = input_bytes + output_bytes + scratch_bytes
    pristine = input_bytes if pristine_on_gpu else 0
    kept = 2 * output_bytes if refs_on_gpu else 0  # the first run's copy and the references
    reference_run = input_bytes + max(input_bytes, output_bytes) + (0 if refs_on_gpu else output_bytes)
    return guarded + pristine + kept + reference_run


def timed_set_bytes(input_bytes: int, output_bytes: int, scratch_bytes: int, *, pristine_on_gpu: bool,
                    refs_on_gpu: bool) -> int:
    """What one checked set holds while it waits for the timed runs."""
    return (input_bytes + output_bytes + scratch_bytes + (input_bytes if pristine_on_gpu else 0)
            + (output_bytes if refs_on_gpu else 0))


def plan_memory(*, free_bytes: int, input_bytes: int, output_bytes: int, scratch_bytes: int = 0,
                flush_bytes: int = 0, rotate_max: int = ROTATE_MAX, label: str = "the problem") -> MemoryPlan:
    """The plan for one evaluation; :class:`HarnessMemoryError` when no way of checking one set fits."""
    usable = free_bytes - max(MARGIN_MIN_BYTES, int(MARGIN_FRACTION * free_bytes))
    sizes = dict(input_bytes=input_bytes, output_bytes=output_bytes, scratch_bytes=scratch_bytes)
    smallest = None
    for pristine_on_gpu, refs_on_gpu in ((True, True), (False, True), (True, False), (False, False)):
        where = dict(pristine_on_gpu=pristine_on_gpu, refs_on_gpu=refs_on_gpu)
        peak = check_peak(**sizes, **where)
        smallest = peak if smallest is None else min(smallest, peak)
        if peak > usable:
            continue
        per_set = max(1, timed_set_bytes(**sizes, **where))
        # the sets kept for timing wait while the next one is checked, then all of them are timed
        sets = 1 + max(0, (usable - peak) // per_set)
        sets = max(1, min(rotate_max, sets, usable // per_set))
        return MemoryPlan(free_bytes=free_bytes, flush_bytes=flush_bytes, check_peak_bytes=peak, timed_sets=sets,
                          **sizes, **where)
    raise HarnessMemoryError(
        f"{label} does not fit on this GPU: checking one input set needs at least {_gb(smallest or 0)} "
        f"(inputs {_gb(input_bytes)}, outputs {_gb(output_bytes)}, scratch {_gb(scratch_bytes)}, the reference's "
        f"own run), {_gb(usable)} of {_gb(free_bytes)} free is usable"
    )
