"""The one boundary between the search (agent, autotuner) and the GPU: an Evaluator.

The real one (:class:`kerngen.harness.pool.local.WorkerPool`) compiles on all CPU cores and runs
check and bench in worker processes, one per GPU. Tests use deterministic evaluators with the
same Protocol. Failures come back as data (a verdict), never as exceptions.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from pydantic import BaseModel, Field

from kerngen.problems.ref import ProblemRef

from kerngen.harness.results import Baseline, EvalResult, GpuFacts
from kerngen.harness.spec.spec import KernelSpec


class Candidate(BaseModel):
    spec: KernelSpec
    config: dict[str, int] = Field(default_factory=dict)  # merged over spec.default_config()


class EvalOptions(BaseModel):
    """Knobs of one evaluation; defaults are the full protocol."""

    seeds: int = 3  # fresh random input sets for the correctness check
    bench: bool = True  # time the kernel when it is correct
    budget_ms: float = 200.0  # time budget of the timed repetitions
    timeout_s: float = 60.0  # per candidate, check and bench together


OnResult = Callable[[int, EvalResult], None]


class Evaluator(Protocol):
    #: how many candidates it runs at once (one per GPU worker): the tuner and the search size
    #: their batches by it
    concurrency: int

    def gpu_facts(self) -> GpuFacts: ...

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline: ...

    def evaluate(
        self,
        problem: ProblemRef,
        candidates: Sequence[Candidate],
        options: EvalOptions | None = None,
        on_result: OnResult | None = None,
    ) -> list[EvalResult]:
        """Results in the order of ``candidates``; ``on_result(i, r)`` as each one lands."""
        ...

    def close(self) -> None: ...
