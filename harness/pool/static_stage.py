"""The static stage of an evaluation, before any GPU: each candidate's launch plan resolved for
the problem's sizes, its source compiled (sandboxed NVRTC, the source policy, forbidden device
state, tunables redefined in the source), every launch's arguments checked against its kernel's
compiled parameters. A failure is the candidate's verdict (``invalid_spec`` or
``compile_error``) with the precise reason its repair prompt shows; what passes is ready to run.

The GPU pool (:mod:`.local`) runs this stage and then the GPU; the dry run (:mod:`.dry_run`)
runs only this stage."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kerngen.errors import CompileError, KerngenError, SpecError
from kerngen.harness.compile.compiler import CompiledKernel, compile_many, job_for
from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import EvalResult, Verdict
from kerngen.harness.spec.kparams import check_launch_args
from kerngen.harness.spec.plan import ResolvedPlan, resolve


@dataclass
class Ready:
    """A candidate that passed the static stage: its index in the batch, plan and cubin."""

    index: int
    candidate: Candidate
    plan: ResolvedPlan
    compiled: CompiledKernel


def prepare(candidates: Sequence[Candidate], *, sizes: Mapping[str, Any], tensors: Mapping[str, Any], arch: str,
            land: Callable[[int, EvalResult], None], deadline: float | None = None) -> list[Ready]:
    """Run the static stage over ``candidates`` (compiles in parallel on the CPU cores); every
    failure goes to ``land(index, result)`` as it is known; what passed is returned in order.
    With a ``deadline`` (``time.monotonic()``), a candidate whose compile had not started by then
    lands ``cancelled``."""
    plans: dict[int, ResolvedPlan] = {}
    jobs = {}
    for i, cand in enumerate(candidates):
        if deadline is not None and time.monotonic() >= deadline:
            land(i, cancelled(cand))
            continue
        plan = plan_or_failure(cand, sizes, tensors)
        if isinstance(plan, EvalResult):
            land(i, plan)
            continue
        try:
            jobs[i] = job_for(cand.spec, plan, arch)  # the -D options: a bad define is a CompileError
        except CompileError as exc:
            r = static_failure(cand, str(exc), log=exc.log)
            r.config = plan.config
            land(i, r)
            continue
        plans[i] = plan
    order = sorted(plans)
    ready = []
    for i, out in zip(order, compile_many([jobs[i] for i in order], deadline=deadline)):
        if out is None:
            land(i, cancelled(candidates[i]))
            continue
        if not isinstance(out, CompileError):
            out = with_launch_args_checked(out, plans[i])
        if isinstance(out, CompileError):
            r = static_failure(candidates[i], str(out), log=out.log)
            r.config = plans[i].config
            land(i, r)
        else:
            ready.append(Ready(i, candidates[i], plans[i], out))
    return ready


def with_launch_args_checked(compiled: CompiledKernel, plan: ResolvedPlan) -> CompiledKernel | CompileError:
    """The compiled module, or the CompileError of a launch whose arguments do not match its
    kernel's parameters in number or size (:mod:`kerngen.harness.spec.kparams`)."""
    try:
        check_launch_args(compiled.cubin, plan, compiled.info.log)
    except CompileError as exc:
        return exc
    return compiled


def plan_or_failure(cand: Candidate, sizes: Mapping[str, Any], tensors: Mapping[str, Any]) -> ResolvedPlan | EvalResult:
    """The candidate's resolved plan, or its ``invalid_spec`` verdict with the precise reason."""
    try:
        return resolve(cand.spec, sizes=sizes, tensors=tensors, config=cand.config)
    except KerngenError as exc:  # SpecError, ExprError: what resolve raises for a bad spec
        why = f"launch plan: {exc}"
    except Exception as exc:  # noqa: BLE001 - the spec is a model's answer: a fault it provokes in
        # resolve is a harness bug, but it must cost this candidate a verdict, not the search
        why = f"launch plan: harness error {type(exc).__name__}: {exc}"
    return static_failure(cand, why, verdict=Verdict.invalid_spec)


def cancelled(cand: Candidate) -> EvalResult:
    """The result of a candidate the caller's deadline stopped before it started."""
    return EvalResult(verdict=Verdict.cancelled, message="not evaluated: the time budget ran out before it started",
                      spec_hash=cand.spec.content_hash(), config=dict(cand.config))


def static_failure(cand: Candidate, message: str, log: str = "", verdict: Verdict = Verdict.compile_error) -> EvalResult:
    first = message.splitlines()[0][:1000] if message else "compile error"
    return EvalResult(
        verdict=verdict, message=first, spec_hash=cand.spec.content_hash(),
        config=cand.spec.full_config(cand.config) if _config_ok(cand) else dict(cand.config), log=log,
    )


def _config_ok(cand: Candidate) -> bool:
    try:
        cand.spec.check_config(cand.config)
    except SpecError:
        return False
    return True


__all__ = ["Ready", "cancelled", "plan_or_failure", "prepare", "static_failure", "with_launch_args_checked"]
