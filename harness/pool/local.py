"""The real Evaluator: compile on all CPU cores, then check and bench in worker processes, one
per visible GPU. Every failure comes back as a verdict; the caller never sees a crash."""

from __future__ import annotations

import copy
import os
import queue
import threading
import time
from typing import Protocol, Sequence

from kerngen.problems.ref import ProblemRef

from kerngen.errors import KerngenError, NoGPUError
from kerngen.harness.evaluator import Candidate, EvalOptions, OnResult
from kerngen.harness.pool.static_stage import Ready, cancelled, prepare
from kerngen.harness.pool.protocol import BaselineRequest, EvaluateRequest, HelloRequest, OpTimeRequest
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, OpTiming, ProfileOutcome, Verdict
from kerngen.harness.pool.worker_proc import WorkerDied, WorkerLost, WorkerProcess, WorkerTimeout
from kerngen.harness.gpu.profile import NCU_TIMEOUT_S, ProfileRequest, find_ncu, run_ncu
from kerngen.harness.spec.spec import KernelSpec

BASELINE_TIMEOUT_S = 900.0  # torch.compile of a new problem can take minutes
NO_GPU = ("no CUDA device visible: this command needs an NVIDIA GPU (without one, kerngen generate PROBLEM --dry-run "
          "runs a search that compiles its kernels and runs none, and kerngen check SPEC PROBLEM vets a spec)")


def visible_devices() -> list[str]:
    """Physical GPU ids this process may use (CUDA_VISIBLE_DEVICES respected)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise NoGPUError(NO_GPU)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(count)]
    return ids[:count]


class WorkerHandle(Protocol):
    """What the dispatch asks of one GPU worker: a local :class:`WorkerProcess`, or the proxy of
    a Ray actor that hosts one (:class:`kerngen.harness.pool.ray_pool.ActorWorker`)."""

    index: int
    device: str

    def request(self, request, timeout_s: float): ...  # a Reply; raises WorkerTimeout or WorkerDied

    def kill(self) -> None: ...

    def close(self) -> None: ...


class WorkerPool:
    def __init__(
        self, devices: Sequence[str] | None = None, timeout_s: float = 60.0, worker_module: str | None = None,
        *, workers: Sequence[WorkerHandle] | None = None,
    ) -> None:
        """One worker process per GPU of ``devices`` (default: the visible ones), or the given
        ``workers`` (a Ray pool's actors)."""
        if workers is not None:
            self.devices = [w.device for w in workers]
        else:
            self.devices = list(devices) if devices is not None else visible_devices()
        if not self.devices:
            raise NoGPUError(NO_GPU)
        self.timeout_s = timeout_s
        extra = {"module": worker_module} if worker_module else {}  # tests: a fake worker, no GPU
        self.workers: list[WorkerHandle] = (list(workers) if workers is not None else
                                            [WorkerProcess(i, d, **extra) for i, d in enumerate(self.devices)])
        self.concurrency = len(self.workers)  # one candidate per GPU worker at a time
        self._owner = True  # closes its workers (a shard does not: the pool it came from does)
        self._free: queue.Queue[WorkerHandle] = queue.Queue()
        for w in self.workers:
            self._free.put(w)
        self._facts: GpuFacts | None = None
        self._baselines: dict[str, Baseline] = {}
        self._problems: dict[str, object] = {}
        self._lock = threading.Lock()
        self._ncu: str | None = None  # found on first use ("" : none on this host)

    # ----- Evaluator Protocol ------------------------------------------------------------------
    def gpu_facts(self) -> GpuFacts:
        if self._facts is None:
            reply = self._ask(HelloRequest(ceilings=True), BASELINE_TIMEOUT_S)
            if reply.facts is None:
                raise NoGPUError(f"GPU worker failed to start: {reply.error}")
            self._facts = reply.facts
        return self._facts

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        key = f"{problem.key()}-{budget_ms}-{with_compile}"
        if key not in self._baselines:
            self.gpu_facts()
            request = BaselineRequest(problem=problem, budget_ms=budget_ms, with_compile=with_compile)
            reply = self._ask(request, BASELINE_TIMEOUT_S)
            if reply.baseline is None:
                raise KerngenError(f"cannot measure PyTorch on {problem.label()}: {reply.error}")
            self._baselines[key] = reply.baseline
        return self._baselines[key]

    def evaluate(
        self,
        problem: ProblemRef,
        candidates: Sequence[Candidate],
        options: EvalOptions | None = None,
        on_result: OnResult | None = None,
    ) -> list[EvalResult]:
        options = options or EvalOptions(timeout_s=self.timeout_s)
        arch = self.gpu_facts().arch
        results: list[EvalResult | None] = [None] * len(candidates)
        ready = self._compile_all(problem, candidates, arch, results, on_result, options.deadline)
        self._dispatch(problem, ready, options, results, on_result)
        return [r for r in results if r is not None]

    def profile(self, problem: ProblemRef, spec: KernelSpec, config: dict[str, int] | None = None, *,
                timeout_s: float = NCU_TIMEOUT_S) -> ProfileOutcome:
        """The :class:`~kerngen.harness.evaluator.Profiler` capability: ncu, run from this process
        on the GPU of a worker taken out of the free queue for the duration (no timing runs on
        that GPU meanwhile; the worker itself stays idle and alive). Not through the worker: ncu
        must start the process it profiles, and its time limit then kills only ncu, never a
        worker with its problem state."""
        if self._ncu is None:
            self._ncu = self._find_ncu()
        if not self._ncu:
            return ProfileOutcome(available=False, error="ncu (Nsight Compute) not found: no profiler feedback")
        results: list[EvalResult | None] = [None]
        try:
            arch = self.gpu_facts().arch
            ready = self._compile_all(problem, [Candidate(spec=spec, config=dict(config or {}))], arch, results, None)
        except KerngenError as exc:  # no worker, a problem that does not load: an outcome, as always
            return ProfileOutcome(error=f"not profiled: {' '.join(str(exc).split())}"[:400])
        if not ready:
            why = results[0].message if results[0] is not None else "no plan"
            return ProfileOutcome(error=f"not profiled: {why}"[:400])
        request = ProfileRequest(problem=problem, plan=ready[0].plan,
                                 cubin_b64=ProfileRequest.encode(ready[0].compiled.cubin))
        worker = self._free.get()
        try:
            return self._run_ncu(worker, request, arch, timeout_s)
        finally:
            self._free.put(worker)

    def time_op(self, problem: ProblemRef, spec: KernelSpec, config: dict[str, int] | None = None, *,
                budget_ms: float = 300.0, timeout_s: float = BASELINE_TIMEOUT_S) -> OpTiming:
        """The exported op's path timed beside its kernel in one worker (:mod:`kerngen.harness.gpu.op_bench`).
        KerngenError when the kernel does not compile or the worker fails."""
        results: list[EvalResult | None] = [None]
        ready = self._compile_all(problem, [Candidate(spec=spec, config=dict(config or {}))], self.gpu_facts().arch,
                                  results, None)
        if not ready:
            why = results[0].message if results[0] is not None else "no plan"
            raise KerngenError(f"the op path was not timed: {why}")
        request = OpTimeRequest(problem=problem, spec=spec, plan=ready[0].plan,
                                cubin_b64=EvaluateRequest.encode(ready[0].compiled.cubin), budget_ms=budget_ms)
        reply = self._ask(request, timeout_s)
        if reply.op_timing is None:
            raise KerngenError(f"the op path was not timed: {reply.error or 'no answer'}")
        return reply.op_timing

    def _find_ncu(self) -> str:
        """ncu on this host ("": none). A Ray pool asks its actors' hosts instead."""
        return find_ncu() or ""

    def _run_ncu(self, worker, request: ProfileRequest, arch: str, timeout_s: float) -> ProfileOutcome:
        """ncu started from this process on ``worker``'s GPU; a Ray pool runs it on the actor's host."""
        return run_ncu(self._ncu or "", request, device=worker.device, arch=arch, timeout_s=timeout_s)

    def shards(self) -> list["WorkerPool"]:
        """One evaluator per worker, for running several problems side by side (a batch: one
        problem per GPU). A shard is this pool bound to one of its workers: the same compiles
        and dispatch, its own baselines, the GPU facts measured once here; closing it closes
        nothing (this pool owns the workers). Every worker is started here, side by side, before any
        shard's problem starts its clock: a worker's start (a process, torch, a CUDA context) belongs
        to no problem's budget."""
        facts = self.gpu_facts()
        self._start_workers()
        out = []
        for worker in self.workers:
            shard = copy.copy(self)  # a Ray pool's shard stays a Ray pool (its ncu on the actor's host)
            shard.workers, shard.concurrency, shard._owner = [worker], 1, False
            shard._free = queue.Queue()
            shard._free.put(worker)
            shard._facts, shard._baselines, shard._lock = facts, {}, threading.Lock()
            out.append(shard)
        return out

    def _start_workers(self) -> None:
        """Greet every worker at once (a worker process starts on its first request). One that does
        not start here is restarted by its first request, which says why in that verdict."""
        def greet(worker: WorkerHandle) -> None:
            try:
                worker.request(HelloRequest(ceilings=False), BASELINE_TIMEOUT_S)
            except (WorkerTimeout, WorkerDied, WorkerLost):
                pass

        threads = [threading.Thread(target=greet, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        if not self._owner:
            return
        for w in self.workers:
            w.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- compile (parent, all CPU cores) ----------------------------------------------------
    def problem_info(self, problem: ProblemRef):
        from kerngen.problems.load import load_problem

        key = problem.key()
        if key not in self._problems:
            self._problems[key] = load_problem(problem).info
        return self._problems[key]

    def _compile_all(self, problem, candidates, arch, results, on_result, deadline=None) -> list[Ready]:
        """The static stage (:mod:`.static_stage`): failures land as verdicts, the rest is ready."""
        info = self.problem_info(problem)
        return prepare(candidates, sizes=info.sizes, tensors=info.tensor_facts(), arch=arch,
                       land=lambda i, r: self._land(i, r, results, on_result), deadline=deadline)

    # ----- dispatch (one thread per worker) ---------------------------------------------------
    def _dispatch(self, problem, ready, options, results, on_result) -> None:
        jobs: queue.Queue = queue.Queue()
        for item in ready:
            jobs.put(item)
        stopped = threading.Event()  # the caller was interrupted: nothing more runs or lands
        lost: dict[int, str] = {}  # candidates whose worker was lost under them: why

        def land(i: int, r: EvalResult) -> None:  # under self._lock (see _land), as is stopped.set()
            if not stopped.is_set() and on_result is not None:
                on_result(i, r)

        def drain() -> None:
            worker = self._free.get()  # a worker busy with a baseline is waited for, never shared
            try:
                while True:
                    try:
                        item: Ready = jobs.get_nowait()
                    except queue.Empty:
                        return
                    if stopped.is_set():
                        return
                    i, cand, plan, compiled = item.index, item.candidate, item.plan, item.compiled
                    if options.deadline is not None and time.monotonic() >= options.deadline:
                        self._land(i, cancelled(cand), results, land)  # run nothing new past it
                        continue
                    try:
                        r = self._run_one(worker, problem, cand, plan, compiled, options)
                    except WorkerLost as exc:
                        # the worker is gone, not by the candidate's doing: another worker takes the
                        # candidate (once: one lost twice is left for a resume) and this one no more
                        if i not in lost:
                            lost[i] = str(exc)
                            jobs.put(item)
                            return
                        r = lost_result(cand, plan, f"{exc} (and before that: {lost[i]})")
                    except Exception as exc:  # noqa: BLE001 - a harness fault becomes this candidate's verdict
                        worker.kill()
                        r = EvalResult(verdict=Verdict.harness_error, message=f"harness error: {exc!r}"[:400],
                                       spec_hash=cand.spec.content_hash(), config=plan.config, worker=worker.index)
                    self._land(i, r, results, land)
            finally:
                self._free.put(worker)

        try:
            # a round: one thread per worker in the rotation; the next takes what a lost worker left
            while not jobs.empty() and self._rotation() > 0:
                threads = [threading.Thread(target=drain, daemon=True)
                           for _ in range(min(self.concurrency, jobs.qsize()))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        except BaseException:
            # Ctrl-C (or a time limit's SIGINT) reaches this thread only: the search it interrupts
            # closes its journal next, so no result may land after this (a candidate in flight
            # lands nowhere and a resume evaluates it), and no queued candidate starts
            with self._lock:  # waits out a landing in progress
                stopped.set()
            raise
        while not jobs.empty():  # no worker is left to take them: not the kernels' verdicts
            item = jobs.get_nowait()
            why = f"{lost.get(item.index, 'its GPU worker was lost')}; no GPU worker is left to take it"
            self._land(item.index, lost_result(item.candidate, item.plan, why), results, land)

    def _rotation(self) -> int:
        """How many workers take candidates now (a Ray pool first takes lost actors out and puts
        those Ray restarted back in; 0: none is left)."""
        return len(self.workers)

    def workers_lost(self) -> str:
        """Why this evaluator can evaluate nothing more (every worker lost), "" while it can. A
        local worker process is never lost (it is restarted): a Ray pool's actors can be."""
        return ""

    def _run_one(self, worker, problem, cand, plan, compiled, options) -> EvalResult:
        req = EvaluateRequest(
            problem=problem, spec_hash=cand.spec.content_hash(), plan=plan,
            cubin_b64=EvaluateRequest.encode(compiled.cubin), compile=compiled.info, options=options,
        )
        started = time.perf_counter()
        base = dict(spec_hash=req.spec_hash, config=plan.config, compile=compiled.info, worker=worker.index)
        try:
            reply = worker.request(req, options.timeout_s)
        except WorkerTimeout as exc:
            return EvalResult(verdict=Verdict.timeout, message=f"timeout: {exc}; worker restarted",
                              wall_s=time.perf_counter() - started, **base)
        except WorkerDied as exc:  # a SIGKILL from outside (the host's OOM killer): not the candidate's doing
            verdict = Verdict.harness_error if exc.killed_outside else Verdict.runtime_error
            return EvalResult(verdict=verdict, message=f"{verdict.value.replace('_', ' ')}: {exc}",
                              log=exc.log_tail, wall_s=time.perf_counter() - started, **base)
        if reply.result is None:
            return EvalResult(verdict=Verdict.harness_error, message=f"harness error: {reply.error}",
                              wall_s=time.perf_counter() - started, **base)
        reply.result.worker = worker.index
        reply.result.phases_s["compile"] = compiled.info.seconds
        reply.result.phases_s["round_trip"] = round(time.perf_counter() - started, 6)
        return reply.result

    def _ask(self, request, timeout_s: float):
        worker = self._free.get()
        try:
            return worker.request(request, timeout_s)
        except (WorkerTimeout, WorkerDied) as exc:
            raise KerngenError(f"GPU worker {worker.device} failed: {exc}") from None
        finally:
            self._free.put(worker)

    def _land(self, i: int, r: EvalResult, results, on_result) -> None:
        with self._lock:
            results[i] = r
            if on_result is not None:
                on_result(i, r)


def lost_result(cand: Candidate, plan, why: str) -> EvalResult:
    """A candidate whose worker was lost and that no other worker took: a harness condition, not the
    kernel's verdict (a search keeps no result for it and a resume evaluates it; a tuner caches none)."""
    message = f"harness error: {why}: not the kernel's verdict, left for a resume"
    return EvalResult(verdict=Verdict.harness_error, message=message[:400], spec_hash=cand.spec.content_hash(),
                      config=plan.config)


__all__ = ["WorkerPool", "lost_result", "visible_devices"]
