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


def budget_for_resume(run: Run, given: dict[str, Any]) -> SearchBudget:
    """The budget of a resume: the recorded one with what the command line gives in its place
    (``--minutes`` / ``--gpu-minutes``: that much more for this session; see
    :func:`kerngen.agent.budget.resume_budget`). A bad value: a one-line KerngenError."""
    return resume_budget(recorded_budget(run), given, spent_wall_s=run.elapsed_s(),
                         spent_gpu_s=gpu_seconds(run.events))


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
