"""Evaluate one compiled candidate inside a GPU worker: check, then bench with rotating inputs,
then verify the timed outputs. Returns an EvalResult; CUDA errors propagate to the worker, which
reports ``runtime_error`` and restarts (a sticky CUDA error poisons the whole context)."""

from __future__ import annotations

import os
import time

import torch

from kerngen.harness.gpu.buffers import fill_byte
from kerngen.harness.gpu.check import BoundSet, ProblemState, run_check, verify_timed_outputs
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.results import CompileInfo, EvalResult, Verdict
from kerngen.harness.gpu.timing import L2Flusher, bench
from kerngen.harness.gpu.clocks import ClockMonitor

# Timed runs rotate over this many input sets (fewer when they would not fit in a quarter of
# the GPU's memory), so a kernel that caches by pointer or content gains nothing.
ROTATE_SETS = 3


def fresh_seeds(n: int) -> list[int]:
    """Seeds drawn anew for every evaluation: a kernel cannot be tuned to known inputs."""
    return [int.from_bytes(os.urandom(4), "little") | 1 for _ in range(n)]


class Evaluation:
    def __init__(self, state: ProblemState, stream: torch.cuda.Stream, flusher: L2Flusher, device_index: int):
        self.state = state
        self.stream = stream
        self.flusher = flusher
        self.device_index = device_index

    def sync(self) -> None:
        self.stream.synchronize()

    def run(
        self, cubin: bytes, plan: ResolvedPlan, compile_info: CompileInfo, options: EvalOptions
    ) -> EvalResult:
        started = time.perf_counter()
        result = EvalResult(verdict=Verdict.ok, config=plan.config, compile=compile_info)
        phases = _Phases()
        with torch.cuda.stream(self.stream):
            module = LoadedModule(cubin, sorted({l.kernel for l in plan.launches}))
            phases.mark("load")
            kept: list[BoundSet] = []
            seeds = fresh_seeds(options.seeds)
            evidence = run_check(self.state, module, plan, self.stream, seeds, self.sync,
                                 keep=kept, keep_max=self._rotate_count() if options.bench else 0)
            phases.mark("check")
            result.check = evidence
            if evidence.failed is not None:
                result.verdict, result.message = Verdict.incorrect, evidence.message
            elif options.bench:
                self._bench(module, plan, options, result, phases, kept)
        result.wall_s = time.perf_counter() - started
        result.phases_s = phases.spans
        if result.ok and result.timing is not None:
            t = result.timing
            result.message = f"ok: {t.median_ms:.4f} ms (IQR {t.iqr_ms:.4f}); {result.check.message}"
        elif result.ok:
            result.message = f"ok (not timed); {result.check.message}"
        return result

    def _bench(self, module, plan: ResolvedPlan, options: EvalOptions, result: EvalResult, phases, sets) -> None:
        runners = [PlanRunner(module, plan, s.tensors(self.state.params), self.stream) for s in sets]
        rotation = _Rotation(sets, runners)
        timing = bench(
            rotation.call,
            stream=self.stream,
            before_each=rotation.prepare,
            flusher=self.flusher,
            budget_ms=options.budget_ms,
            warmup_ms=min(25.0, options.budget_ms),  # no longer than the measurement itself
            clocks=ClockMonitor(self.device_index),
        )
        self.sync()
        phases.mark("bench")
        failure = verify_timed_outputs(self.state, sets)
        phases.mark("verify_timed")
        if failure is not None:
            result.verdict, result.check, result.message = Verdict.incorrect, failure, failure.message
            return
        result.timing = timing

    def _rotate_count(self) -> int:
        """How many input sets the timed runs rotate over: ROTATE_SETS, fewer when they would
        not fit in a quarter of the GPU's memory (inputs, pristine copies, outputs, references)."""
        per_set = self.state.info.min_bytes * 3
        budget = torch.cuda.get_device_properties(self.device_index).total_memory // 4
        return max(1, min(ROTATE_SETS, budget // max(per_set, 1)))


class _Phases:
    def __init__(self) -> None:
        self.spans: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.spans[name] = round(now - self._last, 6)
        self._last = now


class _Rotation:
    """Before each timed call (outside the timed region) poison the next set's outputs and
    scratch with a byte that changes every call; the call then runs on that set."""

    def __init__(self, sets: list[BoundSet], runners: list[PlanRunner]) -> None:
        self.sets, self.runners = sets, runners
        self.k = -1
        self.calls = 0

    def prepare(self) -> None:
        self.k = (self.k + 1) % len(self.sets)
        self.calls += 1
        byte = 0xFF if self.calls % 2 else 0x7F
        for buf in (*self.sets[self.k].outputs.values(), *self.sets[self.k].scratch.values()):
            fill_byte(buf, byte)

    def call(self) -> None:
        if self.k < 0:  # bench() may call before prepare() while estimating: keep it honest
            self.prepare()
        self.runners[self.k]()
