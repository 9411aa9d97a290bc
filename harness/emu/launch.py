"""The emulator as the harness's launcher: the real correctness protocol on the CPU.

:func:`evaluate_emulated` runs one spec through :class:`kerngen.harness.gpu.evaluate.Evaluation`,
the code a GPU worker runs, with an :class:`EmuDevice` in place of the GPU: the check (poisoned
and guarded buffers, runs before and after the reference, seals), the timed runs rotating over
the checked input sets, and the verification of their outputs. Only the launcher (the emulator,
jailed: :mod:`.jail`) and the clock (a stand-in: an emulated call's wall time says nothing about
a GPU) differ. A failure of the emulation is what a CUDA error is on the GPU: ``runtime_error``
(an out-of-bounds access past the harness's guards, a trap, a deadlock), or ``timeout``.

Used by the CPU tests and by ``kerngen check --emulate`` (a spec the user names), never by a search.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, ContextManager, Mapping

import torch

from kerngen.harness.emu.runner import DEFAULT_TIMEOUT_S, EmuError, run_plan
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.gpu.check import ProblemState
from kerngen.harness.gpu.evaluate import Evaluation
from kerngen.harness.gpu.timing import summarize
from kerngen.harness.results import CompileInfo, EvalResult, Timing, Verdict
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.spec.spec import KernelSpec

# timed calls of an emulated candidate: one warm-up, then REPS, each after the rotation's poison
WARMUP, REPS = 1, 3
_TIMEOUT_WORDS = "did not finish in"


class StandInClock:
    """Milliseconds for the timed runs: each read advances by ``step_ms``, so every timed call
    "takes" ``step_ms`` (deterministic). Tests pass their own to see what is timed."""

    def __init__(self, step_ms: float = 1.0) -> None:
        self.step_ms, self.now_ms = step_ms, 0.0

    def __call__(self) -> float:
        self.now_ms += self.step_ms
        return self.now_ms


class EmuModule:
    """The launcher (:class:`kerngen.harness.gpu.launcher.Launcher`): each call of a runner emulates
    every step of the plan on the bound tensors (written back in place)."""

    def __init__(self, spec: KernelSpec, timeout_s: float = DEFAULT_TIMEOUT_S, seed: int | None = None) -> None:
        self.spec, self.timeout_s, self.seed = spec, timeout_s, seed
        self.calls = 0  # emulated calls of the candidate (tests: proof that it ran)

    def runner(self, plan: ResolvedPlan, tensors: Mapping[str, torch.Tensor], stream: object = None
               ) -> Callable[[], None]:
        bound = dict(tensors)

        def call() -> None:
            self.calls += 1
            run_plan(self.spec, plan, bound, timeout_s=self.timeout_s, seed=self.seed)

        return call


class EmuDevice:
    """The evaluation's device (:class:`kerngen.harness.gpu.evaluate.Device`) on the CPU: host
    memory, no stream, the emulator as the launcher, a stand-in clock for the timed runs. The
    cubin handed to :meth:`load` is not used: the emulator compiles the spec's own source."""

    stream = None
    flush_bytes = 0

    def __init__(self, spec: KernelSpec, clock: Callable[[], float] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, seed: int | None = None) -> None:
        self.module = EmuModule(spec, timeout_s, seed)
        self.clock = clock if clock is not None else StandInClock()

    def load(self, cubin: bytes, kernels: list[str]) -> EmuModule:
        return self.module

    def sync(self) -> None:
        pass

    def free_bytes(self) -> int:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def running(self) -> ContextManager:
        return contextlib.nullcontext()

    def start_peak(self) -> None:
        pass

    def peak_bytes(self) -> int | None:
        return None

    def bench(self, call: Callable[[], None], before_each: Callable[[], None], budget_ms: float) -> Timing:
        """The GPU bench's order of calls (an untimed first call, warm-up, timed repetitions, each
        after ``before_each``), timed by the stand-in clock."""
        for _ in range(1 + WARMUP):
            before_each()
            call()
        samples = []
        for _ in range(REPS):
            before_each()
            start = self.clock()
            call()
            samples.append(self.clock() - start)
        return summarize(samples, warmup=WARMUP, l2_flushed=False)

    def release(self) -> None:
        pass


def emulated_compile_info(spec: KernelSpec, seconds: float = 0.0) -> CompileInfo:
    return CompileInfo(key="emulated", arch="cpu-emulator", nvrtc_version="", options=[], seconds=seconds,
                       cached=False)


def evaluate_emulated(state: ProblemState, spec: KernelSpec, plan: ResolvedPlan, options: EvalOptions,
                      device: EmuDevice | None = None) -> EvalResult:
    """One evaluation of ``spec`` (its plan resolved for ``state``'s problem) on the emulator:
    what a GPU worker answers, with ``runtime_error``/``timeout`` for a failed emulation."""
    device = device if device is not None else EmuDevice(spec, timeout_s=options.timeout_s)
    started = time.perf_counter()
    try:
        return Evaluation(state, None, None, 0, device=device).run(b"", plan, emulated_compile_info(spec), options)
    except EmuError as exc:
        timed_out = _TIMEOUT_WORDS in str(exc)
        verdict = Verdict.timeout if timed_out else Verdict.runtime_error
        kind = "timeout" if timed_out else "runtime error"
        return EvalResult(verdict=verdict, message=f"{kind}: {exc}", config=plan.config,
                          compile=emulated_compile_info(spec), wall_s=time.perf_counter() - started)
