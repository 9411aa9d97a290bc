"""Search shape and budgets: how wide the tree grows and when the search stops.

:class:`SearchConfig` is the shape of each round (beam, ideas, branches, repairs, tuning);
:class:`SearchBudget` the limits (rounds, LLM calls and tokens, wall and GPU minutes, patience).
The defaults fit one GPU in about 30 minutes. :class:`Usage` counts what was spent; an LLM
proposer drives it through ``on_call`` (one call per LLM request, with its token usage).
:class:`StopReason` is why a search stopped: a :class:`StopKind` for code to test, and the text
the user reads (and the journal records).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kerngen.text import sane_count
from kerngen.errors import KerngenError

if TYPE_CHECKING:
    from kerngen.agent.llm.client import LLMCall


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beam: int = Field(default=2, ge=1, description="best nodes expanded per round (B)")
    ideas: int = Field(default=3, ge=1, description="ideas asked per beam node (K)")
    branches: int = Field(default=2, ge=1, description="implementations per idea (M)")
    repairs: int = Field(default=2, ge=0, description="repair attempts per failed node (R)")
    tune: bool = Field(default=True, description="autotune the survivors of each round")


class SearchBudget(BaseModel):
    """Limits; ``None`` means no limit. The search stops at the first one reached."""

    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(default=5, ge=0)
    max_llm_calls: int | None = Field(default=200, ge=0)
    max_tokens: int | None = Field(default=2_000_000, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0, description="USD the LLM may cost (needs prices)")
    wall_minutes: float | None = Field(default=30.0, gt=0)
    gpu_minutes: float | None = Field(default=20.0, gt=0)
    patience: int | None = Field(default=2, ge=1, description="rounds without a better best before stopping")
    min_gain: float = Field(default=0.005, ge=0, description="relative gain that counts as an improvement")

    @classmethod
    def unlimited(cls, rounds: int = 10**6) -> "SearchBudget":
        return cls(rounds=rounds, max_llm_calls=None, max_tokens=None, wall_minutes=None, gpu_minutes=None,
                   patience=None)


class StopKind(Enum):
    """Why a search stopped, for code to test (the text of a :class:`StopReason` is for people)."""

    rounds = "rounds"  # the rounds budget is done
    patience = "patience"  # rounds without a better best
    llm_calls = "llm_calls"  # the LLM request budget is spent
    tokens = "tokens"  # the LLM token budget is spent
    cost = "cost"  # the LLM dollar budget is spent
    wall_minutes = "wall_minutes"  # the wall-clock budget is spent
    gpu_minutes = "gpu_minutes"  # the GPU-time budget is spent
    no_candidates = "no_candidates"  # the proposer gave no new candidate in a round
    end_of_record = "end_of_record"  # a replay followed its record to the end
    interrupted = "interrupted"  # Ctrl-C
    error = "error"  # an exception ended the search
    degenerate = "degenerate"  # the problem's output barely depends on its input (and no --force)
    harness = "harness"  # the harness itself could not evaluate, e.g. out of GPU memory
    llm_error = "llm_error"  # the LLM endpoint failed (its error says how), or no prompt fits its context


@dataclass(frozen=True)
class StopReason:
    """Why a search stopped: ``kind`` to test, ``text`` to show; ``str()`` is the text (what the
    CLI prints and the journal's ``run_finished`` records as ``reason``)."""

    kind: StopKind
    text: str

    def __str__(self) -> str:
        return self.text


class Usage:
    """What a search has spent. ``calls``/``tokens``: LLM requests (HTTP requests: a call that
    retried counts each attempt; a failed call counts too) and their tokens; ``gpu_s``: sum of
    ``EvalResult.wall_s``; ``wall_s``: elapsed seconds over all sessions."""

    def __init__(self, prior_wall_s: float = 0.0) -> None:
        self._lock = threading.Lock()  # the LLM proposer reports calls from several threads
        self.calls = 0
        self.tokens = 0
        self.cached_tokens = 0  # prompt tokens the endpoint served from its cache
        self.reasoning_tokens = 0  # completion tokens spent reasoning
        self.estimated_tokens = 0  # of ``tokens``: estimated (requests billed but never answered)
        self.cost_usd: float | None = None  # where prices are configured (0.0 from the start then)
        self.gpu_s = 0.0
        self.proposer_calls = 0  # questions actually asked of the proposer (not reused answers)
        self.reused_answers = 0
        self.evaluations = 0
        self.prior_wall_s = prior_wall_s
        self.t0 = time.monotonic()
        self.listeners: list[Callable[[Any], None]] = []

    @property
    def wall_s(self) -> float:
        return self.prior_wall_s + (time.monotonic() - self.t0)

    def start_clock(self) -> None:
        """The wall clock counts from now (after what earlier sessions spent): a search calls it once
        its baseline is known, so that starting GPU workers, measuring the GPU and timing PyTorch
        (torch.compile's first compile in a fresh worker above all) are charged to no problem."""
        self.t0 = time.monotonic()

    def on_call(self, call: "LLMCall") -> None:
        """Callback for the LLM proposer: one LLM call happened (answered, unreadable or failed),
        with ``call.attempts`` HTTP requests; one at least is counted, so that a call that failed
        before it could count its requests still moves the budget."""
        with self._lock:
            self.calls += max(1, int(getattr(call, "attempts", 0) or 0))
            self.tokens += call.usage.total_tokens
            self.cached_tokens += call.usage.cached_tokens
            self.reasoning_tokens += call.usage.reasoning_tokens
            self.estimated_tokens += getattr(call.usage, "estimated_tokens", 0)
            if call.usage.cost_usd is not None:
                self.cost_usd = (self.cost_usd or 0.0) + call.usage.cost_usd
        for fn in list(self.listeners):
            fn(call)

    def snapshot(self) -> dict[str, float | int]:
        cost = {} if self.cost_usd is None else {"cost_usd": round(self.cost_usd, 6)}
        return cost | {
            "llm_calls": self.calls,
            "tokens": self.tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "estimated_tokens": self.estimated_tokens,
            "gpu_s": round(self.gpu_s, 3),
            "wall_s": round(self.wall_s, 3),
            "proposer_calls": self.proposer_calls,
            "reused_answers": self.reused_answers,
            "evaluations": self.evaluations,
        }


def restore_llm_usage(usage: Usage, events: list[Any]) -> None:
    """What a journal's ``llm_call`` events say was spent (a resumed search goes on from it): the
    running totals of requests and tokens (the largest: calls made from threads may land out of
    order), and the sums of the cached and reasoning tokens and the cost of every call."""
    llm = [e for e in events if getattr(e, "type", "") == "llm_call"]
    if not llm:
        return
    usage.calls, usage.tokens = max(e.calls for e in llm), max(e.tokens for e in llm)
    for e in llm:
        counts = e.record.get("usage") if isinstance(e.record, dict) else None
        if not isinstance(counts, dict):
            continue
        usage.cached_tokens += sane_count(counts.get("cached_tokens"))
        usage.reasoning_tokens += sane_count(counts.get("reasoning_tokens"))
        usage.estimated_tokens += sane_count(counts.get("estimated_tokens"))
        cost = counts.get("cost_usd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < 1e9:
            usage.cost_usd = (usage.cost_usd or 0.0) + float(cost)


def exhausted(budget: SearchBudget, usage: Usage) -> StopReason | None:
    """The first budget (other than rounds and patience) that is spent, as a stop reason."""
    if budget.max_llm_calls is not None and usage.calls >= budget.max_llm_calls:
        return StopReason(StopKind.llm_calls, f"budget: {usage.calls} LLM requests (max {budget.max_llm_calls}, "
                                              "--max-llm-calls; the endpoint check counts)")
    if budget.max_tokens is not None and usage.tokens >= budget.max_tokens:
        return StopReason(StopKind.tokens, f"budget: {usage.tokens} tokens (max {budget.max_tokens}, --max-tokens)")
    if budget.max_cost_usd is not None and (usage.cost_usd or 0.0) >= budget.max_cost_usd:
        return StopReason(StopKind.cost, f"budget: ${usage.cost_usd or 0.0:.4f} of LLM cost (max ${budget.max_cost_usd:g}, --max-cost)")
    return time_exhausted(budget, usage)


def time_exhausted(budget: SearchBudget, usage: Usage) -> StopReason | None:
    """The wall-clock or GPU-time budget that is spent, as a stop reason (what stops evaluation
    and tuning; the LLM budgets only stop asking the proposer)."""
    if budget.wall_minutes is not None and usage.wall_s >= budget.wall_minutes * 60:
        return StopReason(StopKind.wall_minutes,
                          f"budget: {usage.wall_s / 60:.2f} wall minutes (max {budget.wall_minutes:g}, --minutes)")
    if budget.gpu_minutes is not None and usage.gpu_s >= budget.gpu_minutes * 60:
        return StopReason(StopKind.gpu_minutes,
                          f"budget: {usage.gpu_s / 60:.1f} GPU minutes (max {budget.gpu_minutes:g}, --gpu-minutes)")
    return None


def remaining_wall_s(budget: SearchBudget, usage: Usage) -> float | None:
    """Seconds left of the wall-clock budget (None: no limit; may be <= 0)."""
    if budget.wall_minutes is None:
        return None
    return budget.wall_minutes * 60.0 - usage.wall_s


# a budget's field -> the command-line option that sets it (what an error names)
BUDGET_OPTIONS = {"rounds": "--rounds", "max_llm_calls": "--max-llm-calls", "max_tokens": "--max-tokens",
                  "max_cost_usd": "--max-cost", "wall_minutes": "--minutes", "gpu_minutes": "--gpu-minutes",
                  "patience": "--patience"}


def make_budget(base: SearchBudget | None = None, given: Mapping[str, Any] | None = None) -> SearchBudget:
    """``base`` (else the defaults) with the fields ``given`` (None values ignored), validated:
    an out-of-range value is a one-line :class:`~kerngen.errors.KerngenError`."""
    data = (base or SearchBudget()).model_dump()
    data.update({k: v for k, v in (given or {}).items() if v is not None})
    try:
        return SearchBudget.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "budget"
        option = BUDGET_OPTIONS.get(field, field)  # what the user typed: --minutes, not wall_minutes
        raise KerngenError(f"bad {option} {err.get('input')!r}: {err.get('msg', 'invalid')}") from None


# CLI option names of the budgets that count time: given on a resume, they are for that session
SESSION_BUDGETS = ("wall_minutes", "gpu_minutes")


def resume_budget(recorded: SearchBudget, given: Mapping[str, Any], *, spent_wall_s: float,
                  spent_gpu_s: float) -> SearchBudget:
    """The budget of a resumed run: the latest recorded one, with every budget given on the
    command line taking its place. Counts (rounds, LLM calls, tokens, patience) are for the whole
    run, as recorded; the time budgets given (``--minutes``, ``--gpu-minutes``) are for THIS
    session: they are stored as totals, what earlier sessions spent plus what is given."""
    given = {k: v for k, v in given.items() if v is not None}
    for name in SESSION_BUDGETS:
        if name in given and isinstance(given[name], (int, float)) and given[name] > 0:
            spent = spent_wall_s if name == "wall_minutes" else spent_gpu_s
            given[name] = given[name] + spent / 60.0
    return make_budget(recorded, given)
