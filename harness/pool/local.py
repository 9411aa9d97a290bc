"""The real Evaluator: compile on all CPU cores, then check and bench in worker processes, one
per visible GPU. Every failure comes back as a verdict; the caller never sees a crash."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Sequence

from kerngen.problems.ref import ProblemRef

from kerngen.errors import CompileError, KerngenError, NoGPUError, SpecError
from kerngen.harness.evaluator import Candidate, EvalOptions, OnResult
from kerngen.harness.spec.plan import ResolvedPlan, resolve
from kerngen.harness.pool.protocol import BaselineRequest, EvaluateRequest, HelloRequest
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Verdict
from kerngen.harness.pool.worker_proc import WorkerDied, WorkerProcess, WorkerTimeout

BASELINE_TIMEOUT_S = 900.0  # torch.compile of a new problem can take minutes


def visible_devices() -> list[str]:
    """Physical GPU ids this process may use (CUDA_VISIBLE_DEVICES respected)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise NoGPUError("no CUDA device visible: this command needs an NVIDIA GPU")
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(count)]
    return ids[:count]


class WorkerPool:
    def __init__(
        self, devices: Sequence[str] | None = None, timeout_s: float = 60.0, worker_module: str | None = None
    ) -> None:
        self.devices = list(devices) if devices is not None else visible_devices()
        if not self.devices:
            raise NoGPUError("no CUDA device visible: this command needs an NVIDIA GPU")
        self.timeout_s = timeout_s
        extra = {"module": worker_module} if worker_module else {}  # tests: a fake worker, no GPU
        self.workers = [WorkerProcess(i, d, **extra) for i, d in enumerate(self.devices)]
        self.concurrency = len(self.workers)  # one candidate per GPU worker at a time
        self._free: queue.Queue[WorkerProcess] = queue.Queue()
        for w in self.workers:
            self._free.put(w)
        self._facts: GpuFacts | None = None
        self._baselines: dict[str, Baseline] = {}
        self._problems: dict[str, object] = {}
        self._lock = threading.Lock()

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
        ready = self._compile_all(problem, candidates, arch, results, on_result)
        self._dispatch(problem, ready, options, results, on_result)
        return [r for r in results if r is not None]

    def close(self) -> None:
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

    def _compile_all(self, problem, candidates, arch, results, on_result):
        from kerngen.harness.compile.compiler import compile_many, job_for

        info = self.problem_info(problem)
        sizes, tensors = info.sizes, info.tensor_facts()
        plans: dict[int, ResolvedPlan] = {}
        jobs = {}
        for i, cand in enumerate(candidates):
            plan = _plan_or_failure(cand, sizes, tensors)
            if isinstance(plan, EvalResult):
                self._land(i, plan, results, on_result)
                continue
            try:
                jobs[i] = job_for(cand.spec, plan, arch)  # the -D options: a bad define is a CompileError
            except CompileError as exc:
                r = _static_failure(cand, str(exc), log=exc.log)
                r.config = plan.config
                self._land(i, r, results, on_result)
                continue
            plans[i] = plan
        order = sorted(plans)
        compiled = compile_many([jobs[i] for i in order])
        ready = []
        for i, out in zip(order, compiled):
            if not isinstance(out, CompileError):
                out = _with_launch_args_checked(out, plans[i])
            if isinstance(out, CompileError):
                r = _static_failure(candidates[i], str(out), log=out.log)
                r.config = plans[i].config
                self._land(i, r, results, on_result)
            else:
                ready.append((i, candidates[i], plans[i], out))
        return ready

    # ----- dispatch (one thread per worker) ---------------------------------------------------
    def _dispatch(self, problem, ready, options, results, on_result) -> None:
        jobs: queue.Queue = queue.Queue()
        for item in ready:
            jobs.put(item)

        def drain() -> None:
            worker = self._free.get()  # a worker busy with a baseline is waited for, never shared
            try:
                while True:
                    try:
                        i, cand, plan, compiled = jobs.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        r = self._run_one(worker, problem, cand, plan, compiled, options)
                    except Exception as exc:  # noqa: BLE001 - a harness fault becomes this candidate's verdict
                        worker.kill()
                        r = EvalResult(verdict=Verdict.harness_error, message=f"harness error: {exc!r}"[:400],
                                       spec_hash=cand.spec.content_hash(), config=plan.config, worker=worker.index)
                    self._land(i, r, results, on_result)
            finally:
                self._free.put(worker)

        threads = [threading.Thread(target=drain, daemon=True) for _ in range(min(len(self.workers), len(ready)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

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
        except WorkerDied as exc:
            return EvalResult(verdict=Verdict.runtime_error, message=f"runtime error: {exc}",
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


def _with_launch_args_checked(compiled, plan: ResolvedPlan):
    """The compiled module, or the CompileError of a launch whose arguments do not match its
    kernel's parameters in number or size (:mod:`.kparams`): caught before any GPU time."""
    from kerngen.harness.spec.kparams import check_launch_args

    try:
        check_launch_args(compiled.cubin, plan, compiled.info.log)
    except CompileError as exc:
        return exc
    return compiled


def _plan_or_failure(cand: Candidate, sizes, tensors) -> ResolvedPlan | EvalResult:
    """The candidate's resolved plan, or its ``invalid_spec`` verdict with the precise reason
    (what the model reads in its repair prompt)."""
    try:
        return resolve(cand.spec, sizes=sizes, tensors=tensors, config=cand.config)
    except KerngenError as exc:  # SpecError, ExprError: what resolve raises for a bad spec
        why = f"launch plan: {exc}"
    except Exception as exc:  # noqa: BLE001 - the spec is a model's answer: a fault it provokes in
        # resolve is a harness bug, but it must cost this candidate a verdict, not the search
        why = f"launch plan: harness error {type(exc).__name__}: {exc}"
    return _static_failure(cand, why, verdict=Verdict.invalid_spec)


def _static_failure(cand: Candidate, message: str, log: str = "",
                    verdict: Verdict = Verdict.compile_error) -> EvalResult:
    first = message.splitlines()[0][:1000] if message else "compile error"
    return EvalResult(
        verdict=verdict, message=first, spec_hash=cand.spec.content_hash(),
        config=cand.spec.full_config(cand.config) if _config_ok(cand) else dict(cand.config), log=log,
    )


def _config_ok(cand: Candidate) -> bool:
    try:
        cand.spec.check_config(cand.config)
        return True
    except SpecError:
        return False


__all__ = ["WorkerPool", "visible_devices"]
