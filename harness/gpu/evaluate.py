"""Evaluate one compiled candidate inside a GPU worker: plan the memory, check, then bench with
rotating inputs, then verify the timed outputs. Returns an EvalResult; CUDA errors propagate to
the worker, which reports ``runtime_error`` and restarts (a sticky CUDA error poisons the whole
context). The harness's own shortage of GPU memory is never the candidate's verdict: it is
``harness_error``, with the memory plan in the message (:mod:`kerngen.harness.gpu.memory_plan`).
A launch plan the launcher refuses for a tensor it binds (a ``tensormap`` argument whose tensor
has no such map) is ``invalid_spec``, with the launcher's one line.

Where the candidate runs and how it is timed is the evaluation's :class:`Device`: the GPU
(:class:`CudaDevice`, the default: a cubin, CUDA events, the L2 flushed) or, for the CPU tests and
``kerngen check --emulate``, the emulator with a stand-in clock (:mod:`kerngen.harness.emu.launch`).
The protocol (check, rotation, timed-output verification) is the same code for both."""

from __future__ import annotations

import gc
import os
import time
from typing import Callable, ContextManager, Protocol

import torch

from kerngen.errors import SpecError
from kerngen.harness.gpu.buffers import fill_byte, torch_dtype
from kerngen.harness.gpu.check import BoundSet, ProblemState, TimedSampler, run_check, verify_timed_outputs
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.gpu.launcher import Launcher, LoadedModule
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.gpu.memory_plan import HarnessMemoryError, plan_memory
from kerngen.text import one_line
from kerngen.harness.results import CompileInfo, EvalResult, MemoryPlan, Timing, Verdict
from kerngen.harness.gpu.timing import L2Flusher, bench
from kerngen.harness.gpu.clocks import ClockMonitor

# Timed runs rotate over this many input sets at most (fewer when the memory plan says so), so a
# kernel that caches by pointer or content gains nothing.
ROTATE_SETS = 3


def fresh_seeds(n: int) -> list[int]:
    """Seeds drawn anew for every evaluation: a kernel cannot be tuned to known inputs."""
    return [int.from_bytes(os.urandom(4), "little") | 1 for _ in range(n)]


class Device(Protocol):
    """Where an evaluation runs the candidate and how it times it."""

    stream: torch.cuda.Stream | None
    flush_bytes: int  # the L2 flush buffer, already allocated (out of the free memory)

    def load(self, cubin: bytes, kernels: list[str]) -> Launcher: ...

    def sync(self) -> None: ...

    def free_bytes(self) -> int: ...

    def running(self) -> ContextManager: ...

    def start_peak(self) -> None: ...

    def peak_bytes(self) -> int | None: ...

    def bench(self, call: Callable[[], None], before_each: Callable[[], None], budget_ms: float) -> Timing: ...

    def release(self) -> None: ...


class CudaDevice:
    """The GPU: a cubin loaded with cupy, the harness's own stream, CUDA events, the L2 flushed."""

    def __init__(self, stream: torch.cuda.Stream, flusher: L2Flusher, device_index: int) -> None:
        self.stream, self.flusher, self.device_index = stream, flusher, device_index
        self.flush_bytes = int(getattr(flusher, "nbytes", 0))

    def load(self, cubin: bytes, kernels: list[str]) -> Launcher:
        return LoadedModule(cubin, kernels)

    def sync(self) -> None:
        self.stream.synchronize()

    def free_bytes(self) -> int:
        """The driver's free memory plus what torch's allocator holds unused."""
        free, _ = torch.cuda.mem_get_info(self.device_index)
        cached = torch.cuda.memory_reserved(self.device_index) - torch.cuda.memory_allocated(self.device_index)
        return int(free + max(0, cached))

    def running(self) -> ContextManager:
        return torch.cuda.stream(self.stream)

    def start_peak(self) -> None:
        torch.cuda.synchronize(self.device_index)
        self._base = torch.cuda.memory_allocated(self.device_index)
        torch.cuda.reset_peak_memory_stats(self.device_index)

    def peak_bytes(self) -> int | None:
        return torch.cuda.max_memory_allocated(self.device_index) - self._base

    def bench(self, call: Callable[[], None], before_each: Callable[[], None], budget_ms: float) -> Timing:
        return bench(call, stream=self.stream, before_each=before_each, flusher=self.flusher, budget_ms=budget_ms,
                     warmup_ms=min(25.0, budget_ms),  # no longer than the measurement itself
                     clocks=ClockMonitor(self.device_index))

    def release(self) -> None:
        torch.cuda.empty_cache()


class Evaluation:
    def __init__(self, state: ProblemState, stream: torch.cuda.Stream | None, flusher: L2Flusher | None,
                 device_index: int, device: Device | None = None):
        self.state = state
        self.device = device if device is not None else CudaDevice(stream, flusher, device_index)
        self.stream = self.device.stream

    def sync(self) -> None:
        self.device.sync()

    def run(
        self, cubin: bytes, plan: ResolvedPlan, compile_info: CompileInfo, options: EvalOptions
    ) -> EvalResult:
        started = time.perf_counter()
        result = EvalResult(verdict=Verdict.ok, config=plan.config, compile=compile_info)
        phases = _Phases()
        short = refused = ""
        try:
            result.memory = self.memory_plan(plan)
            self.device.start_peak()
            self._run(cubin, plan, options, result, phases)
            # what the evaluation allocated at most, beside the plan's figure (the GPU tier holds it under)
            result.memory.measured_peak_bytes = self.device.peak_bytes()
        except HarnessMemoryError as exc:
            short = str(exc)
        except torch.OutOfMemoryError as exc:
            short = f"the harness ran out of GPU memory ({' '.join(str(exc).split())[:200]})"
        except SpecError as exc:  # what the plan asks of a tensor it binds (a tensormap argument's layout)
            refused = one_line(str(exc), 1000) or "the launch plan was refused"
        if refused:
            self._release()
            result = EvalResult(verdict=Verdict.invalid_spec, config=plan.config, compile=compile_info,
                                memory=result.memory, message=f"launch plan: {refused}")
        if short:  # after the except blocks: their tracebacks no longer hold the tensors
            self._release()
            plan_text = f"; {result.memory.summary()}" if result.memory else ""
            result = EvalResult(verdict=Verdict.harness_error, config=plan.config, compile=compile_info,
                                memory=result.memory, message=f"harness error: {short}{plan_text}")
        result.wall_s = time.perf_counter() - started
        result.phases_s = phases.spans
        if result.ok and result.timing is not None:
            t = result.timing
            result.message = f"ok: {t.median_ms:.4f} ms (IQR {t.iqr_ms:.4f}); {result.check.message}"
            m = result.memory
            if m is not None and (m.timed_sets < ROTATE_SETS or not m.refs_on_gpu or not m.pristine_on_gpu):
                result.message += f"; {m.summary()}"  # a large problem: say what the plan gave up
        elif result.ok:
            result.message = f"ok (not timed); {result.check.message}"
        return result

    def _run(self, cubin: bytes, plan: ResolvedPlan, options: EvalOptions, result: EvalResult, phases) -> None:
        assert result.memory is not None
        with self.device.running():
            module = self.device.load(cubin, sorted({l.kernel for l in plan.launches}))
            phases.mark("load")
            kept: list[BoundSet] = []
            seeds = fresh_seeds(options.seeds)
            evidence = run_check(self.state, module, plan, self.stream, seeds, self.sync, keep=kept,
                                 keep_max=result.memory.timed_sets if options.bench else 0, memory=result.memory)
            phases.mark("check")
            result.check = evidence
            if evidence.failed is not None:
                result.verdict, result.message = Verdict.incorrect, evidence.message
            elif options.bench:
                self._bench(module, plan, options, result, phases, kept)

    def memory_plan(self, plan: ResolvedPlan | None = None) -> MemoryPlan:
        """What this evaluation may hold (:func:`plan_memory`), from what is free now."""
        footprint = self.state.footprint()  # measured first: it needs the memory to itself
        free = self.device.free_bytes()
        info = self.state.info
        scratch = sum(s.size * torch_dtype(s.dtype).itemsize for s in plan.scratch) if plan is not None else 0
        return plan_memory(free_bytes=free, input_bytes=sum(t.nbytes for t in info.inputs),
                           output_bytes=sum(t.nbytes for t in info.outputs), scratch_bytes=int(scratch),
                           reference_bytes=footprint.reference_bytes if footprint else None,
                           make_bytes=footprint.make_bytes if footprint else None,
                           flush_bytes=self.device.flush_bytes, rotate_max=ROTATE_SETS,
                           label=info.name)

    def _bench(self, module: Launcher, plan: ResolvedPlan, options: EvalOptions, result: EvalResult, phases,
               sets) -> None:
        runners = [module.runner(plan, s.tensors(self.state.params), self.stream) for s in sets]
        rotation = _Rotation(sets, runners, TimedSampler(self.state))
        timing = self.device.bench(rotation.call, rotation.prepare, options.budget_ms)
        self.sync()
        phases.mark("bench")
        failure = verify_timed_outputs(self.state, sets, rotation.sampler)
        phases.mark("verify_timed")
        if failure is not None:
            result.verdict, result.check, result.message = Verdict.incorrect, failure, failure.message
            return
        result.timing = timing

    def _release(self) -> None:
        """Give back what a failed evaluation allocated, so that the next one starts from a clean slate."""
        gc.collect()
        self.device.release()


class _Phases:
    def __init__(self) -> None:
        self.spans: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.spans[name] = round(now - self._last, 6)
        self._last = now


class _Rotation:
    """Before each timed call (outside the timed region): sample the outputs of the call before it against
    their reference (``sampler``), then poison the next set's outputs and scratch with a byte that changes
    every call; the call then runs on that set."""

    def __init__(self, sets: list[BoundSet], runners: list[Callable[[], None]], sampler: TimedSampler) -> None:
        self.sets, self.runners, self.sampler = sets, runners, sampler
        self.k = -1
        self.calls = 0

    def prepare(self) -> None:
        if self.k >= 0:  # the previous timed call's outputs, before they are poisoned again
            self.sampler.sample(self.sets[self.k])
        self.k = (self.k + 1) % len(self.sets)
        self.calls += 1
        byte = 0xFF if self.calls % 2 else 0x7F
        for buf in (*self.sets[self.k].outputs.values(), *self.sets[self.k].scratch.values()):
            fill_byte(buf, byte)

    def call(self) -> None:
        if self.k < 0:  # bench() may call before prepare() while estimating: keep it honest
            self.prepare()
        self.runners[self.k]()
