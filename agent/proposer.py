"""What a proposer is: the source of ideas and kernels for the tree search.

Three stand behind this Protocol: the LLM proposer (:mod:`kerngen.agent.llm.proposer`), the
offline playbook (:mod:`kerngen.agent.playbook`) and replay of a journal
(:mod:`kerngen.agent.replay`). Tests use a deterministic one. The search journals every
proposer answer, so the tree, replay and reports are the same whichever proposer ran.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from pydantic import BaseModel, Field

from kerngen.harness.results import Baseline, CompileInfo, EvalResult, GpuFacts, KernelProfile
from kerngen.harness.spec.spec import KernelSpec


class Category(str, Enum):
    """The six families of optimization ideas (seed 001)."""

    memory_access = "memory_access"
    async_latency = "async_latency"  # asynchrony and latency hiding
    precision = "precision"  # data type and precision
    compute = "compute"  # compute and instruction optimization
    parallelism = "parallelism"  # parallelism and occupancy
    control_flow = "control_flow"  # control flow and loops


class Idea(BaseModel):
    """One optimization idea in natural language."""

    text: str = Field(description="the idea, in a few sentences")
    category: Category
    expected_effect: str = Field(
        default="", description="what it should change in the measured profile, and by how much"
    )


class Branch(BaseModel):
    """One implementation of an idea (or a repair): a spec, or why none could be read."""

    spec: KernelSpec | None = None
    notes: str = ""  # the proposer's own words on what it did
    error: str = ""  # set when the answer could not be turned into a valid spec
    answer: str = ""  # the raw answer (its start) when it could not be read: its repair shows it back


class NodeSummary(BaseModel):
    """A node as a prompt sees it: its kernel and what was measured of it."""

    node_id: int
    idea: Idea | None = None
    spec: KernelSpec
    result: EvalResult
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    pct_roofline: float | None = None
    profile: list[KernelProfile] = Field(default_factory=list)  # Nsight Compute's metrics, where profiled


# how a branch's error starts when the answer was there but could not be read as a kernel spec:
# such a branch is repaired (the answer goes back to the model with the reason)
UNREADABLE = "unreadable answer"


class Failure(BaseModel):
    """What a repair is asked to fix: a kernel that failed its evaluation (``spec`` and
    ``result``), or an answer that could not be read as a kernel spec (``spec`` None: ``answer``
    and ``error`` say what was written and why it was refused), with the idea it implements and
    the parent it started from (so the repair keeps the point of the branch)."""

    spec: KernelSpec | None = None
    result: EvalResult | None = None
    answer: str = ""
    error: str = ""
    idea: Idea | None = None
    parent: NodeSummary | None = None
    history: list[str] = Field(default_factory=list)  # the chain's earlier attempts, one line each

    @property
    def unreadable(self) -> bool:
        return self.spec is None


class TriedIdea(BaseModel):
    idea: Idea
    outcome: str  # e.g. "ok 1.21x over parent" or "incorrect after 2 repairs"


class SearchContext(BaseModel):
    """Everything a proposer may use to decide; the same for every proposer."""

    problem_name: str
    problem_source: str  # the reference's Python source
    problem_summary: str  # inputs, outputs, sizes, dtypes, FLOPs, bytes (human-readable)
    sizes: dict[str, int | float] = Field(default_factory=dict)
    tensors: dict[str, list[int]] = Field(default_factory=dict)  # bindable name -> shape
    dtypes: dict[str, str] = Field(default_factory=dict)  # bindable name -> dtype
    gpu: GpuFacts
    baseline: Baseline | None = None
    # the correctness check, as the harness applies it (the system prompt states it exactly)
    atol: float | None = None
    rtol: float | None = None
    rel_err_limits: dict[str, float] = Field(default_factory=dict)  # output dtype -> ||out-ref||/||ref|| limit
    precision: str = "fp32"  # "tf32": the reference runs with PyTorch's TF32 settings (--precision tf32)
    tolerance_note: str = ""  # at tf32: how the tolerance above was measured, or that it was not (a dry run)
    check_sets: int = 3  # fresh random input sets per evaluation
    round: int = 0
    tried: list[TriedIdea] = Field(default_factory=list)


class Proposer(Protocol):
    name: str

    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea]:
        """Up to ``k`` ideas for improving ``parent`` (None: the first kernel from nothing)."""
        ...

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea, m: int) -> list[Branch]:
        """Up to ``m`` different implementations of ``idea`` applied to ``parent``."""
        ...

    def repair(self, ctx: SearchContext, failure: Failure, attempt: int) -> Branch:
        """Fix what ``failure`` holds: a failed kernel (compile log, max error and where, verdict)
        or an answer that could not be read (the reason, the answer)."""
        ...


__all__ = [
    "Branch",
    "Category",
    "CompileInfo",
    "Failure",
    "Idea",
    "NodeSummary",
    "Proposer",
    "SearchContext",
    "TriedIdea",
    "UNREADABLE",
]
