"""The problem as a proposer sees it: a :class:`SearchContext` built from the problem's
description (:func:`default_context`), or from nothing but its name (:func:`minimal_context`)."""

from __future__ import annotations

from kerngen.agent.proposer import SearchContext
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.results import Baseline, GpuFacts
from kerngen.problems.ref import ProblemRef


def default_context(problem: ProblemRef, gpu: GpuFacts, baseline: Baseline | None) -> SearchContext:
    """SearchContext from :func:`kerngen.problems.load.load_problem` (its info and source)."""
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
    return SearchContext(
        problem_name=info.name, problem_source=prob.source(), problem_summary=info.summary(),
        sizes=dict(getattr(info, "sizes", {}) or {}), tensors=tensors, dtypes=dtypes, gpu=gpu, baseline=baseline,
        atol=info.atol, rtol=info.rtol, rel_err_limits=limits, check_sets=EvalOptions().seeds,
    )


def minimal_context(problem: ProblemRef, gpu: GpuFacts, baseline: Baseline | None) -> SearchContext:
    """A context that needs nothing but the reference (tests, the scripted demo)."""
    return SearchContext(problem_name=problem.source, problem_source="", problem_summary=problem.label(),
                         gpu=gpu, baseline=baseline)
