"""Messages between the pool (parent) and a GPU worker: one JSON object per line."""

from __future__ import annotations

import base64
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field

from kerngen.problems.ref import ProblemRef

from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.results import Baseline, CompileInfo, EvalResult, GpuFacts, OpTiming
from kerngen.harness.spec.spec import KernelSpec


class HelloRequest(BaseModel):
    op: Literal["hello"] = "hello"
    ceilings: bool = True


class BaselineRequest(BaseModel):
    op: Literal["baseline"] = "baseline"
    problem: ProblemRef
    budget_ms: float = 300.0
    with_compile: bool = True


class PrepareRequest(BaseModel):
    """Build the problem's state (model, parameters, input generators) before a candidate is
    sent: this one-time work on a fresh worker must not count against a candidate's timeout."""

    op: Literal["prepare"] = "prepare"
    problem: ProblemRef


class EvaluateRequest(BaseModel):
    op: Literal["evaluate"] = "evaluate"
    problem: ProblemRef
    spec_hash: str
    plan: ResolvedPlan
    cubin_b64: str
    compile: CompileInfo
    options: EvalOptions

    @staticmethod
    def encode(cubin: bytes) -> str:
        return base64.b64encode(cubin).decode()

    def cubin(self) -> bytes:
        return base64.b64decode(self.cubin_b64)


class OpTimeRequest(BaseModel):
    """Time the exported op's path beside its kernel (``kerngen bench --op``, ``kerngen suite``)."""

    op: Literal["op_time"] = "op_time"
    problem: ProblemRef
    spec: KernelSpec
    plan: ResolvedPlan
    cubin_b64: str
    budget_ms: float = 300.0

    def cubin(self) -> bytes:
        return base64.b64decode(self.cubin_b64)


Request = Annotated[Union[HelloRequest, BaselineRequest, PrepareRequest, EvaluateRequest, OpTimeRequest],
                    Field(discriminator="op")]


class Envelope(BaseModel):
    """A request as sent: an id so a late answer can never be mistaken for another's."""

    id: int
    request: Request


class Reply(BaseModel):
    id: int
    facts: GpuFacts | None = None
    baseline: Baseline | None = None
    result: EvalResult | None = None
    op_timing: OpTiming | None = None
    error: str = ""  # a failure of the request itself (bad problem, ...), not of a candidate
    fatal: bool = False  # the worker's CUDA context is unusable: it exits after this reply
