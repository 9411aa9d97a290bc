"""The one boundary between the search (agent, autotuner) and the GPU: an Evaluator.

The real one (:class:`kerngen.harness.pool.local.WorkerPool`) compiles on all CPU cores and runs
check and bench in worker processes, one per GPU. Tests use deterministic evaluators with the
same Protocol. Failures come back as data (a verdict), never as exceptions.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from pydantic import BaseModel, Field

from kerngen.problems.ref import ProblemRef

from kerngen.harness.results import Baseline, EvalResult, GpuFacts, ProfileOutcome
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
    # a time.monotonic() of the process that calls evaluate(): a candidate not started by then
    # (compiled or run) comes back ``cancelled``, never run. Not sent to workers (another process's
    # clock), not part of the protocol a cached result depends on.
    deadline: float | None = Field(default=None, exclude=True)


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


class Profiler(Protocol):
    """An optional capability of an Evaluator: profile one (spec, config) with Nsight Compute.

    The search looks it up with ``getattr(evaluator, "profile", None)``: an evaluator without it
    (a test's, a dry run's) is searched exactly as before. The outcome holds one
    :class:`~kerngen.harness.results.KernelProfile` per profiled launch, or an ``error`` line;
    ``available`` False says this host cannot profile at all (no ncu, no counter access), so the
    search stops asking. It never raises for the kernel's or the profiler's failure, and it takes
    one GPU out of use while it runs (no timing shares the GPU it profiles on)."""

    def profile(self, problem: ProblemRef, spec: KernelSpec, config: dict[str, int] | None = None, *,
                timeout_s: float = 120.0) -> ProfileOutcome: ...
