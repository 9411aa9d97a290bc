"""A GPU worker process: owns one device, reads requests (JSON lines on stdin), answers on the
protocol pipe. Started by :mod:`kerngen.harness.pool.local` with CUDA_VISIBLE_DEVICES set to one GPU.

A CUDA error from a candidate (illegal address, trap, misaligned access...) leaves the context
unusable, so the worker answers ``runtime_error`` and exits; the pool starts a fresh one. A hang
is handled by the pool, which kills the process after the candidate's timeout.
"""

from __future__ import annotations

import os
import sys
import traceback

from pydantic import ValidationError

from kerngen.errors import KerngenError
from kerngen.harness import lifeline
from kerngen.harness.gpu.memory_plan import HarnessMemoryError
from kerngen.harness.pool.protocol import (
    BaselineRequest, Envelope, EvaluateRequest, HelloRequest, OpTimeRequest, PrepareRequest, Reply,
)
from kerngen.harness.results import EvalResult, Verdict


def _is_cuda_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    markers = ("CUDA", "cuda", "CUDARuntimeError", "CUDADriverError", "AcceleratorError")
    return any(m in text for m in markers)


class Worker:
    def __init__(self) -> None:
        import torch

        from kerngen.harness.gpu.facts import gpu_facts
        from kerngen.harness.gpu.timing import L2Flusher

        self.torch = torch
        self.device_index = 0
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        torch.cuda.init()
        self.stream = torch.cuda.Stream(self.device)
        self._gpu_facts = gpu_facts
        self.facts = None
        self.flusher = L2Flusher(self.device)
        self.states: dict[str, object] = {}

    def state(self, ref):
        from kerngen.problems.load import load_problem
        from kerngen.problems.torch_modes import set_precision

        from kerngen.harness.gpu.check import ProblemState
        from kerngen.harness.gpu.precision import tolerance_for

        key = ref.key()
        if key not in self.states:
            set_precision(ref.precision)
            if len(self.states) >= 2:  # keep at most two problems' models and params resident
                self.states.pop(next(iter(self.states)))
            state = ProblemState(load_problem(ref), self.device)
            tolerance_for(state)  # at --precision tf32: measured now, before any candidate's clock runs
            self.states[key] = state
        return self.states[key]

    def hello(self, req: HelloRequest):
        if self.facts is None or (req.ceilings and self.facts.copy_gbps is None):
            self.facts = self._gpu_facts(self.device_index, with_ceilings=req.ceilings)
        return self.facts

    def baseline(self, req: BaselineRequest):
        from kerngen.harness.gpu.baseline import measure_baseline

        from kerngen.harness.gpu.evaluate import Evaluation

        facts = self.hello(HelloRequest(ceilings=True))
        state = self.state(req.problem)
        # refused before any candidate, with the numbers, when not one input set can be checked here
        memory = Evaluation(state, self.stream, self.flusher, self.device_index).memory_plan()
        return measure_baseline(
            state, self.stream, self.flusher, facts, self.device_index,
            budget_ms=req.budget_ms, with_compile=req.with_compile, input_sets=memory.timed_sets,
        )

    def evaluate(self, req: EvaluateRequest) -> EvalResult:
        from kerngen.harness.gpu.evaluate import Evaluation
        from kerngen.harness.gpu.precision import tolerance_for

        facts = self.hello(HelloRequest(ceilings=False))
        run = Evaluation(self.state(req.problem), self.stream, self.flusher, self.device_index)
        result = run.run(req.cubin(), req.plan, req.compile, req.options)
        result.spec_hash, result.gpu = req.spec_hash, facts.name
        tol = tolerance_for(run.state)
        if result.check is not None and tol.precision.value != "fp32":
            result.message += f"; checked at {tol.note()}"
        return result

    def op_time(self, req: OpTimeRequest):
        from kerngen.harness.gpu.evaluate import Evaluation
        from kerngen.harness.gpu.op_bench import time_op_path

        self.hello(HelloRequest(ceilings=False))
        state = self.state(req.problem)
        memory = Evaluation(state, self.stream, self.flusher, self.device_index).memory_plan(req.plan)
        return time_op_path(state, req.spec, req.plan, req.cubin(), self.stream, self.flusher, self.device_index,
                            req.budget_ms, input_sets=memory.timed_sets)

    def handle(self, env: Envelope) -> Reply:
        req = env.request
        if isinstance(req, HelloRequest):
            return Reply(id=env.id, facts=self.hello(req))
        if isinstance(req, BaselineRequest):
            return Reply(id=env.id, baseline=self.baseline(req))
        if isinstance(req, PrepareRequest):
            self.state(req.problem)
            return Reply(id=env.id)
        if isinstance(req, OpTimeRequest):
            return Reply(id=env.id, op_timing=self.op_time(req))
        return Reply(id=env.id, result=self.evaluate(req))


def _out_of_memory(exc: BaseException) -> bool:
    """The harness's own buffers did not fit: torch's OutOfMemoryError, or the memory plan's refusal."""
    return isinstance(exc, HarnessMemoryError) or type(exc).__name__ == "OutOfMemoryError"


def _failure_reply(env: Envelope, exc: BaseException) -> Reply:
    cuda = _is_cuda_error(exc)
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if _out_of_memory(exc):
        # never the candidate's verdict; the worker restarts so that the next request starts with
        # all of its memory (fatal), and the message says what did not fit
        first = str(exc) if isinstance(exc, HarnessMemoryError) else (text.splitlines()[-1] if text else "")
        first = " ".join(first.split())[:400] or type(exc).__name__
        if isinstance(env.request, EvaluateRequest):
            result = EvalResult(verdict=Verdict.harness_error, message=f"harness error: out of GPU memory: {first}",
                                spec_hash=env.request.spec_hash, config=env.request.plan.config,
                                compile=env.request.compile)
            return Reply(id=env.id, result=result, fatal=True)
        return Reply(id=env.id, error=f"out of GPU memory: {first}", fatal=True)
    if isinstance(env.request, EvaluateRequest) and not isinstance(exc, KerngenError):
        first = text.splitlines()[-1] if text else type(exc).__name__
        result = EvalResult(
            verdict=Verdict.runtime_error,
            message=f"runtime error: {first[:300]}",
            spec_hash=env.request.spec_hash,
            config=env.request.plan.config,
            compile=env.request.compile,
            log=traceback.format_exc()[-4000:],
        )
        return Reply(id=env.id, result=result, fatal=cuda)
    return Reply(id=env.id, error=" ".join(text.split())[:500], fatal=cuda)


def main() -> None:
    if os.environ.get("KERNGEN_PARENT_PID", "").isdigit():  # no GPU worker outlives its kerngen
        lifeline.die_with_parent(int(os.environ["KERNGEN_PARENT_PID"]))
    # Keep the protocol pipe clean: anything a library prints goes to stderr (the worker log).
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            env = Envelope.model_validate_json(line)
        except ValidationError as exc:
            proto.write(Reply(id=-1, error=f"bad request: {exc.errors()[0]['msg']}").model_dump_json() + "\n")
            continue
        try:
            reply = worker.handle(env)
        except Exception as exc:  # noqa: BLE001 - the boundary: every failure becomes a reply
            reply = _failure_reply(env, exc)
        proto.write(reply.model_dump_json() + "\n")
        proto.flush()
        if reply.fatal:
            os._exit(3)


if __name__ == "__main__":
    main()
