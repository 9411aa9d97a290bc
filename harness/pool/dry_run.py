"""The dry-run Evaluator: the static stage of every evaluation (:mod:`.static_stage`: the launch
plan, the sandboxed NVRTC compile, the source policy, the argument check) for a GPU named by a
preset (:mod:`kerngen.harness.gpu.presets`), and no GPU at all. A candidate that passes is
``not_run``, with its compile information (registers, spills, shared memory); one that fails
has the verdict and message a GPU run would have given it before the GPU. So a search with real
LLM calls runs end to end on a laptop (``kerngen generate --dry-run``): the endpoint, the model,
the prompts and the repairs of what does not compile are checked before a GPU is booked.

Nothing here is a measurement: the baseline holds no time (NaN), its roofline floor comes from the
preset's data-sheet rates (``GpuFacts.datasheet``), and no candidate is ever correct, so nothing
is tuned."""

from __future__ import annotations

import math
import os
from typing import Sequence

from kerngen.harness.evaluator import Candidate, EvalOptions, OnResult
from kerngen.harness.gpu.presets import preset
from kerngen.harness.gpu.roofline import floor_ms
from kerngen.harness.pool.static_stage import prepare
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Timing, Verdict
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

NOT_RUN = "compiled and checked statically; not run (dry run: no GPU)"


class DryRunEvaluator:
    """Implements :class:`~kerngen.harness.evaluator.Evaluator` with no GPU (see the module)."""

    demo = False  # compiles are real; the verdicts say "not run", never a made-up time

    def __init__(self, gpu: str = "h100") -> None:
        self.facts = preset(gpu)
        self.dry_run = gpu.strip()  # the preset, as the run's journal records it (a resume compiles for it)
        self.concurrency = max(1, os.cpu_count() or 1)  # compiles run on every core

    def gpu_facts(self) -> GpuFacts:
        return self.facts.model_copy()

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        nan = math.nan
        none = Timing(median_ms=nan, q25_ms=nan, q75_ms=nan, min_ms=nan, max_ms=nan, mean_ms=nan, reps=0, warmup=0,
                      l2_flushed=False)
        info = load_problem(problem).info
        floor, bound = floor_ms(info.flops, info.min_bytes, info.dtype, self.facts)  # from data-sheet rates
        return Baseline(problem=problem.label(), gpu=self.facts.name, eager=none,
                        compile_error="not measured (dry run: no GPU)", floor_ms=floor, floor_bound=bound,
                        flops=info.flops, min_bytes=info.min_bytes)

    def evaluate(self, problem: ProblemRef, candidates: Sequence[Candidate], options: EvalOptions | None = None,
                 on_result: OnResult | None = None) -> list[EvalResult]:
        info = load_problem(problem).info  # loaded once per process (the loader's cache)
        results: list[EvalResult | None] = [None] * len(candidates)

        def land(i: int, r: EvalResult) -> None:
            results[i] = r
            if on_result is not None:
                on_result(i, r)

        deadline = options.deadline if options is not None else None
        for ready in prepare(candidates, sizes=info.sizes, tensors=info.tensor_facts(), arch=self.facts.arch,
                             land=land, deadline=deadline):
            land(ready.index, EvalResult(verdict=Verdict.not_run, message=NOT_RUN,
                                         spec_hash=ready.candidate.spec.content_hash(), config=ready.plan.config,
                                         compile=ready.compiled.info))
        return [r for r in results if r is not None]

    def close(self) -> None:
        pass


__all__ = ["DryRunEvaluator", "NOT_RUN"]
