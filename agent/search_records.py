"""How the search reads what its journal records: the key of a node, the proposer answers an
event carries, the GPU time spent, the budget a resume runs under, and answers of any shape
turned into ideas and branches (a malformed one becomes a branch with an error, never a crash)."""

from __future__ import annotations

from typing import Any


from kerngen.agent.budget import SearchBudget, resume_budget
from kerngen.agent.journal import (
    IdeasEvent, ImplementedEvent, NodeCreated, NodeEvaluated, NodeProfiled, NodeTuned, RunResumed,
)
from kerngen.agent.proposer import Branch, Idea
from kerngen.agent.tree import Key, Run, ideas_key, implement_key, repair_answer, repair_key


def node_key(ev: NodeCreated) -> tuple:
    if ev.kind == "seed":
        return ("seed",)
    if ev.kind == "repair":
        return ("repair", ev.repair_of, ev.attempt)
    return ("branch", ev.round, ev.parent, ev.idea_index, ev.branch_index)


def answers_of(ev: Any) -> list[tuple[Key, Any]]:
    if isinstance(ev, IdeasEvent):
        return [(ideas_key(ev.round, ev.parent), list(ev.ideas))]
    if isinstance(ev, ImplementedEvent):
        return [(implement_key(ev.round, ev.parent, ev.idea_index), list(ev.branches))]
    if isinstance(ev, NodeCreated) and ev.kind == "repair" and ev.repair_of is not None:
        return [(repair_key(ev.repair_of, ev.attempt), repair_answer(ev))]
    return []


def gpu_seconds(events: list[Any]) -> float:
    total = 0.0
    for e in events:
        if isinstance(e, NodeEvaluated):
            total += e.result.wall_s
        elif isinstance(e, NodeTuned) and e.result is not None:
            total += e.gpu_seconds()
        elif isinstance(e, NodeProfiled):
            total += e.gpu_seconds()
    return total


def recorded_budget(run: Run) -> SearchBudget:
    """The budget a run last ran under: its latest session's, else the one it started with."""
    for ev in reversed(run.events):
        if isinstance(ev, RunResumed) and ev.budget is not None:
            return ev.budget
    return run.started.budget


# the fields of a budget that limit what a search spends (min_gain is a threshold, not a limit)
LIMITS = ("rounds", "max_llm_calls", "max_tokens", "max_cost_usd", "wall_minutes", "gpu_minutes", "patience")


def budget_for_resume(run: Run, given: dict[str, Any]) -> SearchBudget:
    """The budget of a resume. A journal may come from anyone, so the budget it records is shown,
    not trusted: it can lower a limit, never raise one. Each limit is the command line's where
    given (``--minutes`` / ``--gpu-minutes``: that much more for this session; see
    :func:`kerngen.agent.budget.resume_budget`), else the lower of the recorded one and the
    default (a recorded "no limit" is the default; the default time budgets are for this
    session). A run recording 3000 rounds and no limits resumes under 5 rounds, 200 LLM calls,
    30 minutes. A bad value: a one-line KerngenError."""
    recorded, defaults = recorded_budget(run), SearchBudget()
    spent_s = {"wall_minutes": run.elapsed_s(), "gpu_minutes": gpu_seconds(run.events)}
    capped: dict[str, Any] = {}
    for name in LIMITS:
        mine, default = getattr(recorded, name), getattr(defaults, name)
        if name in spent_s and default is not None:
            default += spent_s[name] / 60.0  # stored as totals over the sessions
        capped[name] = default if mine is None else mine if default is None else min(mine, default)
    return resume_budget(recorded.model_copy(update=capped), given, spent_wall_s=spent_s["wall_minutes"],
                         spent_gpu_s=spent_s["gpu_minutes"])


def resume_note(run: Run, budget: SearchBudget) -> str:
    """What a resume says before it starts: the recorded budget and configuration, and the
    budget it runs under (they differ where the journal asked for more than the limits allow)."""
    def limits(b: SearchBudget) -> str:
        return ", ".join(f"{n} {'none' if getattr(b, n) is None else f'{getattr(b, n):g}'}" for n in LIMITS)

    c = run.started.config
    return (f"resuming run {run.id}: it records beam {c.beam}, ideas {c.ideas}, branches {c.branches}, repairs "
            f"{c.repairs}; budget {limits(recorded_budget(run))}. This session runs under {limits(budget)} "
            "(time limits as totals over the sessions; raise any with its option)")


# ----- a proposer's answers, as the journal may record them ----------------------------------
# An answer comes from a model (or any proposer): whatever it holds, it becomes data here, never
# an exception out of the search. A bad idea is dropped; a bad branch is a branch with an error.
def answer_items(answer: Any) -> list[Any]:
    if isinstance(answer, (list, tuple)):
        return list(answer)
    return [] if answer is None else [answer]


def ideas_of(answer: Any, k: int) -> list[Idea]:
    out: list[Idea] = []
    for item in answer_items(answer)[:k]:
        try:
            idea = Idea.model_validate(item)
            idea.model_dump_json()  # what the journal will write (e.g. no lone surrogate)
        except ValueError:  # pydantic's ValidationError and serialization errors are ValueErrors
            continue
        out.append(idea)
    return out


def branch_of(answer: Any) -> Branch:
    try:
        branch = Branch.model_validate(answer)
        branch.model_dump_json()
        return branch
    except ValueError as exc:
        why = " ".join(str(exc).split())[:300]
        return Branch(error=f"the proposer's answer is not a valid branch: {why}")
