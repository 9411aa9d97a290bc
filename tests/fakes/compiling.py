"""An evaluator that compiles every candidate for real (the sandboxed NVRTC boundary, the source
policy, the compile cache) and fakes only the GPU: what a CPU test needs to drive hostile sources
through the whole compile path of a search."""

from __future__ import annotations

from typing import Sequence

from kerngen.agent.scripted import ScriptedEvaluator
from kerngen.harness.compile.compiler import compile_many, job_for
from kerngen.errors import CompileError, KerngenError
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.spec.plan import resolve
from kerngen.harness.results import CheckEvidence, EvalResult, Timing, Verdict
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef


_TIMING = Timing(median_ms=1.0, q25_ms=1.0, q75_ms=1.0, min_ms=1.0, max_ms=1.0, mean_ms=1.0, reps=1, warmup=1)


class CompilingEvaluator(ScriptedEvaluator):
    def evaluate(self, problem: ProblemRef, candidates: Sequence[Candidate], options: EvalOptions | None = None,
                 on_result=None) -> list[EvalResult]:
        info = load_problem(problem).info
        out: list[EvalResult | None] = [None] * len(candidates)
        jobs, where = [], []
        for i, cand in enumerate(candidates):
            try:
                plan = resolve(cand.spec, sizes=info.sizes, tensors=info.tensor_facts(), config=cand.config)
                jobs.append(job_for(cand.spec, plan, "sm_90"))
                where.append(i)
            except KerngenError as exc:
                out[i] = EvalResult(verdict=Verdict.compile_error, message=f"launch plan: {exc}",
                                    spec_hash=cand.spec.content_hash())
        for i, res in zip(where, compile_many(jobs)):
            spec = candidates[i].spec
            if isinstance(res, CompileError):
                out[i] = EvalResult(verdict=Verdict.compile_error, message=str(res), log=res.log,
                                    spec_hash=spec.content_hash(), wall_s=0.01)
            else:
                out[i] = EvalResult(verdict=Verdict.ok, message="compiled", spec_hash=spec.content_hash(),
                                    compile=res.info, check=CheckEvidence(seeds=[0], atol=1e-4, rtol=1e-4),
                                    timing=_TIMING, wall_s=0.01)
        for i, res in enumerate(out):
            assert res is not None
            self.evaluated += 1
            if on_result:
                on_result(i, res)
        return out  # type: ignore[return-value]
