"""The correctness protocol (runs inside a GPU worker).

For each of several fresh random input sets (seeds drawn anew for every evaluation, never
zeros): the candidate runs into poisoned, guarded outputs BEFORE the reference, the reference
runs on a pristine copy, the candidate runs again AFTER it into a differently poisoned output;
both runs must match the reference (allclose at the problem's tolerance, NaN/Inf agreeing),
agree with each other, leave every guard and every input and parameter untouched, and leave no
poison behind. The first failure ends the check and is the evidence.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import torch

from kerngen.harness.gpu.buffers import POISON_PATTERNS, GuardedBuffer, alloc_guarded, guarded_copy, poison, torch_dtype
from kerngen.harness.gpu.compare import Comparison, compare, rel_err_limit
from kerngen.harness.gpu.integrity import Seal, digest, new_key
from kerngen.harness.gpu.memory_plan import HarnessMemoryError
from kerngen.harness.gpu.launcher import Launcher
from kerngen.harness.gpu.precision import Tolerance, tolerance_for
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.results import CheckEvidence, CheckFailure, MemoryPlan


@dataclass
class BoundSet:
    """One input set with everything a call of the candidate touches, all guarded."""

    inputs: dict[str, GuardedBuffer]
    outputs: dict[str, GuardedBuffer]
    scratch: dict[str, GuardedBuffer]
    # untouched copies of forward's arguments (tensors and scalars): the reference's. None when the
    # memory plan has them made again from ``seed`` when needed (:meth:`ProblemState.pristine`)
    pristine: list | None
    seed: int = 0
    refs: list[torch.Tensor] = field(default_factory=list)  # on the GPU, or in host memory (memory plan)
    seal: Seal = field(default_factory=Seal)  # digests of the pristine copies and the references on the GPU

    def tensors(self, params: dict[str, GuardedBuffer]) -> dict[str, torch.Tensor]:
        named = {**params, **self.inputs, **self.outputs, **self.scratch}
        return {name: buf.view for name, buf in named.items()}

    def buffers(self) -> list[GuardedBuffer]:
        return [*self.inputs.values(), *self.outputs.values(), *self.scratch.values()]


@dataclass(frozen=True)
class Footprint:
    """What PyTorch allocates for a problem beyond its inputs, measured (bytes)."""

    make_bytes: int  # get_inputs at its most (the inputs and any temporary)
    reference_bytes: int  # the reference run on one input set: outputs, intermediates, workspaces


class ProblemState:
    """What a worker keeps per problem: the problem, its model and guarded parameter copies."""

    def __init__(self, problem, device: torch.device, seed: int = 1234) -> None:
        self.problem = problem
        self.info = problem.info
        self.device = device
        self._seed = seed
        self.gen = torch.Generator(device=device)
        self.gen.seed()  # guard bytes and poisons from a fresh seed each time (the model is built from `seed`)
        self._build_model()
        self.params = self._guard_params()
        self._digest_key = new_key()  # digests of inputs that are made again rather than kept
        self._input_digests: dict[tuple[int, int], int] = {}
        self._footprint: Footprint | None = None

    def _build_model(self) -> None:
        """The reference model, its parameters by name, and their seal: a far write that changed
        a guarded copy AND its source the same way would otherwise change the reference too."""
        from kerngen.problems.problem import named_tensors as _named_tensors

        self.model = self.problem.build_model(self.device, self._seed)
        # named exactly as the problem's info names them (prefixed where a name clashes with an input)
        self._param_sources = dict(_named_tensors(self.model, {t.name for t in self.info.inputs}))
        self.seal = Seal()
        for name, t in self._param_sources.items():
            self.seal.add(name, t)

    def _guard_params(self) -> dict[str, GuardedBuffer]:
        with torch.no_grad():
            return {name: guarded_copy(name, t.detach(), self.gen) for name, t in self._param_sources.items()}

    def params_intact(self) -> str:
        """Name of a parameter copy that changed or whose guards were hit, or of a reference
        parameter that changed, else ''."""
        with torch.no_grad():
            for name, buf in self.params.items():
                if not buf.guards_intact() or not torch.equal(buf.view, self._param_sources[name].detach()):
                    return name
        return self.seal.broken()

    def reset_params(self) -> None:
        if self.seal.broken():  # the reference model itself was written to: build it anew
            self._build_model()
        self.params = self._guard_params()

    def footprint(self) -> Footprint | None:
        """What ``get_inputs`` and the reference allocate on this GPU, measured once (the memory
        plan's largest unknowns: a norm's ``x * x``, a fused chain's intermediates, cuDNN's
        workspace). None off the GPU. A reference that does not fit even alone is refused here,
        before any candidate, with the numbers."""
        if self._footprint is not None or self.device.type != "cuda":
            return self._footprint
        dev = self.device
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        free = torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - base
        torch.cuda.reset_peak_memory_stats(dev)
        args = outs = None
        try:
            args = self.problem.make_inputs(dev, self._seed)
            made = torch.cuda.max_memory_allocated(dev) - base
            held = torch.cuda.memory_allocated(dev) - base
            torch.cuda.reset_peak_memory_stats(dev)
            outs = self.problem.run_reference(self.model, args)  # in place on them is fine: measured only
            torch.cuda.synchronize(dev)
            ran = torch.cuda.max_memory_allocated(dev) - base - held
        except torch.OutOfMemoryError as exc:
            args = outs = None
            raise HarnessMemoryError(
                f"{self.info.name}: PyTorch's own reference does not fit on this GPU: one input set is "
                f"{sum(t.nbytes for t in self.info.inputs) / 1e9:.1f} GB, its outputs "
                f"{sum(t.nbytes for t in self.info.outputs) / 1e9:.1f} GB, and running the model on it ran out of "
                f"memory with {free / 1e9:.1f} GB free ({' '.join(str(exc).split())[:160]})"
            ) from None
        finally:
            del args, outs
        self._footprint = Footprint(make_bytes=int(made), reference_bytes=int(ran))
        return self._footprint

    def new_set(self, seed: int, plan: ResolvedPlan, memory: MemoryPlan | None = None) -> BoundSet:
        raw = self.problem.make_inputs(self.device, seed)
        tensors = {t.name for t in self.info.inputs}
        # forward's arguments in order; scalars (a Python float input) are not bound as tensors
        inputs = {
            n: guarded_copy(n, x.contiguous(), self.gen)
            for n, x in zip(self.info.args, raw)
            if n in tensors and isinstance(x, torch.Tensor)
        }
        outputs = {
            o.name: alloc_guarded(o.name, tuple(o.shape), torch_dtype(o.dtype), self.device, self.gen)
            for o in self.info.outputs
        }
        scratch = {
            s.name: alloc_guarded(s.name, (s.size,), torch_dtype(s.dtype), self.device, self.gen)
            for s in plan.scratch
        }
        keep = memory is None or memory.pristine_on_gpu
        # ``raw`` is the harness's own (nobody else holds it): it is the pristine copy, or, when the
        # plan has pristine inputs made again from the seed, only its digest is kept to prove they are
        bound = BoundSet(inputs=inputs, outputs=outputs, scratch=scratch, pristine=raw if keep else None, seed=seed)
        for i, x in enumerate(raw):
            if isinstance(x, torch.Tensor):
                if keep:
                    bound.seal.add(f"pristine copy of argument {i}", x)
                else:
                    self._input_digests[(seed, i)] = digest(x, self._digest_key)
        return bound

    def pristine(self, bound: BoundSet) -> list:
        """The set's pristine arguments: the kept copies, or made again from the seed (and proven
        the same bytes as the first time: a ``get_inputs`` that does not repeat cannot be checked so)."""
        if bound.pristine is not None:
            return bound.pristine
        args = self.problem.make_inputs(self.device, bound.seed)
        for i, x in enumerate(args):
            if isinstance(x, torch.Tensor) and digest(x, self._digest_key) != self._input_digests.get((bound.seed, i)):
                raise HarnessMemoryError(
                    f"{self.info.name}: get_inputs() does not repeat under a seed, and its inputs are too large "
                    "to keep a pristine copy of each on this GPU"
                )
        return args

    def pristine_tensors(self, bound: BoundSet) -> dict[str, torch.Tensor]:
        args = self.pristine(bound)
        return dict(zip(bound.inputs, (x for x in args if isinstance(x, torch.Tensor))))

    def seal_refs(self, bound: BoundSet, refs: list[torch.Tensor]) -> None:
        bound.refs = refs
        for i, r in enumerate(refs):
            if r.device.type == self.device.type:  # one moved to host memory is out of any kernel's reach
                bound.seal.add(f"reference output {i}", r)

    def reference(self, bound: BoundSet, to_host: bool = False) -> list[torch.Tensor]:
        if bound.pristine is not None:
            # a KernelBench reference may work in place (ReLU(inplace=True)): give it a copy
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in bound.pristine]
        else:
            args = self.pristine(bound)  # made for this call: it may work in place on them
        outs = self.problem.run_reference(self.model, args)
        del args
        return [o.contiguous().cpu() if to_host else o.contiguous() for o in outs]


class CandidateFailed(Exception):
    """Internal: the check found evidence; carries it out of the nested loops."""

    def __init__(self, evidence: CheckEvidence) -> None:
        super().__init__(evidence.message)
        self.evidence = evidence


def run_check(
    state: ProblemState,
    module: Launcher,
    plan: ResolvedPlan,
    stream: torch.cuda.Stream | None,
    seeds: list[int],
    sync: Callable[[], None],
    keep: list[BoundSet] | None = None,
    keep_max: int = 0,
    memory: MemoryPlan | None = None,
) -> CheckEvidence:
    """Return the evidence; ``failed`` is None when the candidate is correct. Up to ``keep_max``
    checked input sets, with their references, are appended to ``keep`` for the timed runs (they
    are as fresh and as unknown to the kernel as new ones, and cost nothing more to make); the
    last ones checked, so that the memory plan's count of what waits during a check holds."""
    tol = tolerance_for(state)  # the problem's, or measured at --precision tf32 (precision.py)
    limits = [_rel_limit(tol, o.dtype) for o in state.info.outputs]
    evidence = CheckEvidence(seeds=seeds, atol=tol.atol, rtol=tol.rtol, max_rel_err=max(limits, default=0.0))
    try:
        for i, seed in enumerate(seeds):
            bound = _check_one_set(state, module, plan, stream, seed, i, sync, evidence, memory)
            # the LAST sets are kept: all but one of them wait while another is checked (the plan)
            if keep is not None and i >= len(seeds) - keep_max:
                keep.append(bound)
            del bound  # one set at a time: a set not kept for timing is freed before the next
    except CandidateFailed as failure:
        if failure.evidence.failed is CheckFailure.input_mutated:
            state.reset_params()
        return failure.evidence
    evidence.message = (
        f"correct on {len(seeds)} random input sets; max abs err {evidence.max_abs_err:.3g}, "
        f"rel err {evidence.rel_err:.3g}" + ("" if evidence.deterministic else " (not bitwise deterministic)")
    )
    return evidence


def _check_one_set(state, module, plan, stream, seed, i, sync, evidence: CheckEvidence,
                   memory: MemoryPlan | None = None) -> BoundSet:
    on_host = memory is not None and not memory.refs_on_gpu
    bound = state.new_set(seed, plan, memory)
    runner = module.runner(plan, bound.tensors(state.params), stream)
    first = _run_poisoned(state, bound, runner, POISON_PATTERNS[i % 3], sync, RunCopy.host if on_host else RunCopy.gpu)
    _verify_untouched(state, bound, evidence, "before the reference")
    refs = state.reference(bound, to_host=on_host)
    state.seal_refs(bound, refs)
    # the second run is compared where it lies: nothing runs on the set until the check is done
    second = _run_poisoned(state, bound, runner, POISON_PATTERNS[(i + 1) % 3], sync, RunCopy.none)
    _verify_untouched(state, bound, evidence, "after the reference")
    names = [o.name for o in state.info.outputs]
    for name, (out1, p1), (out2, p2), ref in zip(names, first, second, refs):
        for out, pois, when in ((out1, p1, "before"), (out2, p2, "after")):
            c = compare(out, ref, atol=evidence.atol, rtol=evidence.rtol, poison=pois, name=name, device=state.device,
                        rel_limit=tolerance_for(state).rel_limit(ref.dtype))
            _record(evidence, c, name)
            if not c.ok:
                _fail(evidence, c.failed, f"seed {seed}, run {when} the reference: {c.message}", c.pattern)
        if not _equal(out1, out2):
            evidence.deterministic = False
            c = compare(out2, out1, atol=evidence.atol, rtol=evidence.rtol, name=name, device=state.device,
                        rel_limit=tolerance_for(state).rel_limit(out1.dtype))
            if not c.ok:
                # the pattern reads the first run as the reference: where the second one differs
                _fail(evidence, CheckFailure.nondeterministic, f"seed {seed}: two runs disagree: {c.message}",
                      f"the runs differ: {c.pattern}" if c.pattern else "")
    return bound


class RunCopy(Enum):
    """Where a checked run's outputs wait for the comparisons."""

    gpu = "gpu"  # a copy on the GPU
    host = "host"  # a copy in host memory (a large output, by the memory plan)
    none = "none"  # the output buffers themselves (the last run before the comparisons)


def _run_poisoned(state, bound: BoundSet, runner: Callable[[], None], pattern: str, sync, copy: RunCopy):
    """Poison the outputs and scratch, run, and return each output (as ``copy`` says) with its
    poison. A poison is a byte or a seed, never a copy of the output."""
    poisons = [poison(buf, pattern, state.gen) for buf in bound.outputs.values()]
    for buf in bound.scratch.values():
        poison(buf, "random", state.gen)
    sync()
    runner()
    sync()  # a crash or trap surfaces here, as a CUDA error the worker turns into runtime_error
    views = [buf.view for buf in bound.outputs.values()]
    if copy is RunCopy.host:
        views = [v.cpu() for v in views]
    elif copy is RunCopy.gpu:
        views = [v.clone() for v in views]
    return list(zip(views, poisons))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two runs' outputs, chunk by chunk when they live in host memory."""
    if a.device == b.device and a.device.type != "cpu":
        return torch.equal(a, b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    fa, fb = a.reshape(-1), b.reshape(-1)
    dev = b.device if a.device.type == "cpu" else a.device  # the GPU's, when one side is there
    step = 1 << 26
    return all(torch.equal(fa[i:i + step].to(dev), fb[i:i + step].to(dev)) for i in range(0, fa.numel(), step))


def _verify_untouched(state: ProblemState, bound: BoundSet, evidence: CheckEvidence, when: str) -> None:
    for buf in bound.buffers():
        if not buf.guards_intact():
            _fail(evidence, CheckFailure.guard_overwritten, f"a write landed outside {buf.name!r} ({when})")
    hit = bound.seal.broken()
    if hit:
        _fail(evidence, CheckFailure.guard_overwritten, f"a write landed in the harness's {hit} ({when})")
    for name, pristine in state.pristine_tensors(bound).items():
        if not torch.equal(bound.inputs[name].view, pristine):
            _fail(evidence, CheckFailure.input_mutated, f"input {name!r} was modified ({when})")
    changed = state.params_intact()
    if changed:
        _fail(evidence, CheckFailure.input_mutated, f"parameter {changed!r} was modified ({when})")


def _record(evidence: CheckEvidence, c: Comparison, name: str) -> None:
    if c.max_abs_err >= evidence.max_abs_err:
        evidence.max_abs_err = c.max_abs_err
        evidence.max_err_index = c.index
        evidence.max_err_output = name
        evidence.got, evidence.expected = c.got, c.expected
    evidence.rel_err = max(evidence.rel_err, c.rel_err)
    evidence.mismatches = max(evidence.mismatches, c.mismatches)


def _rel_limit(tol: Tolerance, dtype: str) -> float:
    limit = tol.rel_limit(dtype)
    return rel_err_limit(torch_dtype(dtype)) if limit is None else limit


def _fail(evidence: CheckEvidence, failed: CheckFailure | None, message: str, pattern: str = "") -> None:
    """End the check with this evidence. ``pattern`` is the failed comparison's (where the wrong
    elements are and how wrong, :mod:`.error_pattern`): the repair prompt shows it."""
    evidence.failed = failed or CheckFailure.mismatch
    evidence.message = message
    evidence.pattern = pattern
    raise CandidateFailed(evidence)


# every timed call but each set's last (which is compared whole after the timed runs) is compared with its
# reference at this many random elements per output, outside the timed region: a kernel wrong on some timed
# calls only (one that tells a timed call from a checked one, or skips work at random) cannot count on
# landing on the calls nobody looks at
TIMED_SAMPLES = 1024


class TimedSampler:
    """Counts, on the device and without a sync, the sampled output elements of timed calls that differ
    from the reference (NaN where the reference is NaN counts as equal; atol/rtol as the check's)."""

    def __init__(self, state: ProblemState) -> None:
        tol = tolerance_for(state)
        self.atol, self.rtol = tol.atol, tol.rtol
        self.bad: torch.Tensor | None = None
        self.samples = 0
        self.calls = 0
        self._gen: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._gen:
            gen = torch.Generator(device=device)
            gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # nothing a kernel could know
            self._gen[device] = gen
        return self._gen[device]

    def sample(self, bound: BoundSet) -> None:
        """Compare the outputs ``bound`` holds now (its last timed call's) with its references, at random."""
        self.calls += 1
        for buf, ref in zip(bound.outputs.values(), bound.refs):
            out = buf.view.reshape(-1)
            n = out.numel()
            if n == 0:
                continue
            k = min(n, TIMED_SAMPLES)
            idx = torch.randint(0, n, (k,), device=out.device, generator=self._generator(out.device))
            want = ref.reshape(-1)[idx.to(ref.device)].to(out.device, torch.float64)
            got = out[idx].to(torch.float64)
            wrong = ~torch.isclose(got, want, rtol=self.rtol, atol=self.atol, equal_nan=True)
            count = wrong.sum()
            self.bad = count if self.bad is None else self.bad + count
            self.samples += k

    def failures(self) -> int:
        return 0 if self.bad is None else int(self.bad)


def verify_timed_outputs(state: ProblemState, sets: list[BoundSet],
                         sampled: TimedSampler | None = None) -> CheckEvidence | None:
    """After the timed runs: each set's last output must still match its reference, no guard, input or
    parameter may have changed, and no sampled element of the other timed calls (``sampled``) may
    have differed. Returns failing evidence or None."""
    tol = tolerance_for(state)
    evidence = CheckEvidence(atol=tol.atol, rtol=tol.rtol)
    names = [o.name for o in state.info.outputs]
    try:
        for k, bound in enumerate(sets):
            _verify_untouched(state, bound, evidence, "during the timed runs")
            for name, buf, ref in zip(names, bound.outputs.values(), bound.refs):
                c = compare(buf.view, ref, atol=evidence.atol, rtol=evidence.rtol, name=name,
                            rel_limit=tol.rel_limit(ref.dtype))
                if not c.ok:
                    _fail(evidence, CheckFailure.timed_output_mismatch, f"timed input set {k}: {c.message}", c.pattern)
        wrong = sampled.failures() if sampled is not None else 0
        if wrong:
            _fail(evidence, CheckFailure.timed_output_mismatch,
                  f"timed calls: {wrong} of {sampled.samples} sampled output elements of {sampled.calls} timed "
                  f"calls (each set's last excepted) differ from the reference beyond atol/rtol")
    except CandidateFailed as failure:
        return failure.evidence
    return None
