"""The problem as a proposer sees it: a :class:`SearchContext` built from the problem's
description (:func:`default_context`), or from nothing but its name (:func:`minimal_context`)."""

from __future__ import annotations

from kerngen.agent.proposer import SearchContext
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.results import TF32_MARGIN, Baseline, GpuFacts
from kerngen.problems.ref import ProblemRef
from kerngen.problems.torch_modes import Precision, precision_of


def default_context(problem: ProblemRef, gpu: GpuFacts, baseline: Baseline | None) -> SearchContext:
    """SearchContext from :func:`kerngen.problems.load.load_problem` (its info and source), with
    the tolerance the checks apply: the problem's, or at ``--precision tf32`` the one the baseline
    measured on the GPU (or, where none did, the problem's as the least it can be, said so)."""
    # here, not at the top: the comparison imports torch, which the CLI's start (--help, runs, show) never needs
    from kerngen.harness.gpu.compare import REL_ERR_LIMITS
    from kerngen.problems.load import load_problem

    prob = load_problem(problem)
    info = prob.info
    tensors: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    for group in ("inputs", "params", "outputs"):
        for t in getattr(info, group, None) or []:
            tensors[t.name] = list(t.shape)
            dtypes[t.name] = str(t.dtype)
    limits = {str(t.dtype): REL_ERR_LIMITS[str(t.dtype)] for t in info.outputs if str(t.dtype) in REL_ERR_LIMITS}
    precision = precision_of(problem.precision)
    atol, rtol, note = info.atol, info.rtol, ""
    tol = baseline.tolerance if baseline is not None else None
    measured = tol is not None and tol.precision is precision  # what the GPU's checks apply
    if measured:
        atol, rtol = tol.atol, tol.rtol
        limits.update({dt: lim for dt, lim in tol.rel_limits.items() if dt in limits})
    if precision is Precision.tf32:
        note = (f"PyTorch's TF32 output is off by {tol.measured_abs:.3g} at most ({tol.measured_rel:.3g} relative) "
                f"against {tol.against} on this GPU, and the tolerance is {TF32_MARGIN:g}x that"
                if measured and tol.measured_abs is not None else
                f"the tolerance is {TF32_MARGIN:g}x PyTorch's own TF32 error against fp64, measured on the GPU before "
                "a search and not known here (a dry run measures nothing), so the numbers below are the least it "
                "can be")
    return SearchContext(
        problem_name=info.name, problem_source=prob.source(), problem_summary=info.summary(),
        sizes=dict(getattr(info, "sizes", {}) or {}), tensors=tensors, dtypes=dtypes, gpu=gpu, baseline=baseline,
        atol=atol, rtol=rtol, rel_err_limits=limits, check_sets=EvalOptions().seeds, precision=precision.value,
        tolerance_note=note,
    )


def minimal_context(problem: ProblemRef, gpu: GpuFacts, baseline: Baseline | None) -> SearchContext:
    """A context that needs nothing but the reference (tests, the scripted demo)."""
    return SearchContext(problem_name=problem.source, problem_source="", problem_summary=problem.label(),
                         gpu=gpu, baseline=baseline)
